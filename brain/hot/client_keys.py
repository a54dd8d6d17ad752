"""Read what clients keep under their prefixes, safely (layer: brain/hot; Redis glue).

One pipeline, never raising on a refused command (``raise_on_error=False``): a client
that turned one of its keys into another type makes its own reply an error, and every
other client's replies are still read. The verdicts are ``brain.core.client_health``'s.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

import redis
from pydantic import BaseModel, ConfigDict, Field

from brain.core.client_health import MAX_HEARTBEAT_BYTES, Beat, Cause, read_heartbeat, type_causes, typed_keys
from workers.contracts import CLIENT_HEARTBEAT, client_key


class KeyReading(BaseModel):
    """A client's heartbeat and what is wrong with its keys (nothing, mostly)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    beat: Beat = Field(default_factory=Beat)
    causes: list[Cause] = Field(default_factory=list)

    def all_causes(self) -> list[Cause]:
        return [*([self.beat.cause] if self.beat.cause else []), *self.causes]


def read_client_keys(
    r: redis.Redis, client_ids: Iterable[str], typed: Collection[str] | None = None
) -> dict[str, KeyReading]:
    """Each client's heartbeat (at most ``MAX_HEARTBEAT_BYTES`` of it read) and the type of
    each key the brain uses under its prefix, for the clients in ``typed`` only when given
    (the others' ``causes`` are then empty): one round trip for all of them."""
    ids = list(dict.fromkeys(client_ids))
    if not ids:
        return {}
    names = list(typed_keys(ids[0]))
    wanted = None if typed is None else set(typed)
    checked = [wanted is None or cid in wanted for cid in ids]
    pipe = r.pipeline(transaction=False)
    for cid, check in zip(ids, checked, strict=True):
        beat_key = client_key(cid, CLIENT_HEARTBEAT)
        pipe.strlen(beat_key)
        pipe.getrange(beat_key, 0, MAX_HEARTBEAT_BYTES - 1)
        if check:
            for key, _expected in typed_keys(cid).values():
                pipe.type(key)
    replies = pipe.execute(raise_on_error=False)
    readings: dict[str, KeyReading] = {}
    at = 0
    for cid, check in zip(ids, checked, strict=True):
        width = 2 + (len(names) if check else 0)
        row = replies[at : at + width]
        at += width
        readings[cid] = KeyReading(
            beat=read_heartbeat(row[0], row[1]),
            causes=type_causes(cid, dict(zip(names, row[2:], strict=True))) if check else [],
        )
    return readings
