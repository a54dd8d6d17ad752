"""Which clients are suspended for what they wrote, and why (layer: brain/hot; Redis glue).

A mark lives in the brain's own hash ``vt:misbehaving`` (no client can write ``vt:``),
so it survives a brain restart, `vancetope clients` shows it, and each cause is logged
once per client (``mark`` logs only a kind the mark did not hold yet), not every time
the relay or a sweep finds it again. A clean announcement clears it (brain.runtime.clientwork).
"""

from __future__ import annotations

import logging

import redis
from pydantic import ValidationError

from brain.core.client_health import QUOTA_KIND, Cause, Mark
from brain.hot.state import as_text
from workers.contracts import key_misbehaving

log = logging.getLogger("vancetope.brain")


class MisbehavingBook:
    def __init__(self, r: redis.Redis) -> None:
        self.r = r

    def get(self, client_id: str) -> Mark | None:
        return _parse(self.r.hget(key_misbehaving(), client_id))

    def all(self) -> dict[str, Mark]:
        marks = {as_text(k): _parse(v) for k, v in self.r.hgetall(key_misbehaving()).items()}
        return {cid: m for cid, m in marks.items() if m is not None}

    def mark(self, client_id: str, cause: Cause, now: float) -> bool:
        """Add ``cause`` to the client's mark; True (and one log line) when its kind is new."""
        current = self.get(client_id)
        new = current is None or cause.kind not in current.causes
        # A known kind keeps the detail it was found with (two checks may word one fault
        # differently), but for the quota: its detail says how much, now.
        if not new and cause.kind != QUOTA_KIND:
            return False
        updated = (current or Mark(causes={}, since=now)).with_cause(cause)
        if current is None or updated != current:
            self.r.hset(key_misbehaving(), client_id, updated.model_dump_json())
        if new:
            log.warning(
                "client %r misbehaves: %s; suspended (not routed to, its announcements refused) "
                "until it announces cleanly",
                client_id,
                cause.detail,
            )
        return new

    def clear(self, client_id: str, kinds: set[str] | None = None) -> Mark | None:
        """Drop the client's mark (only ``kinds`` of it, when given); returns what was dropped."""
        current = self.get(client_id)
        if current is None:
            return None
        left = None if kinds is None else current.without(kinds)
        if left is None:
            self.r.hdel(key_misbehaving(), client_id)
        elif left != current:
            self.r.hset(key_misbehaving(), client_id, left.model_dump_json())
        dropped = (
            current.causes
            if left is None
            else {k: v for k, v in current.causes.items() if k not in left.causes}
        )
        return Mark(causes=dropped, since=current.since) if dropped else None


def _parse(raw: bytes | str | None) -> Mark | None:
    if raw is None:
        return None
    try:
        return Mark.model_validate_json(raw)
    except ValidationError:
        # Written by the brain alone; a garbled one (an older brain, a hand edit) is no mark.
        return None
