"""Is what a client wrote fit to use, and if not, why (layer: brain/core; pure).

Everything under ``c:<id>:`` is written by that client's agent, so the brain treats it
as hostile input: before a heartbeat, an outbox, a kombu queue or hash of a client is
used, its type, encoding and size are checked here, from the replies of one pipeline
(``brain.hot.client_keys`` reads them; an ``Exception`` stands for a command Redis refused,
say WRONGTYPE). A check answers with a ``Cause``: a stable ``kind`` (what is logged once
and shown) and a ``detail`` for the operator. ``brain.hot.misbehaving`` keeps the marks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from pydantic import BaseModel, ConfigDict, Field

from workers.contracts import (
    CLIENT_OUTBOX,
    KOMBU_UNACKED,
    KOMBU_UNACKED_INDEX,
    client_key,
    client_queue,
    key_cancelled,
)

# The heartbeat holds a session id, and ClientConnected caps those at 128 characters.
MAX_HEARTBEAT_BYTES = 128 * 4  # 128 characters of UTF-8 at most
QUOTA_KIND = "over quota"


class Cause(BaseModel):
    """Why a client is marked misbehaving: ``kind`` names the check (one log line per kind),
    ``detail`` says what was found."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str = Field(min_length=1, max_length=64)
    detail: str = Field(min_length=1, max_length=1000)


class Mark(BaseModel):
    """A client's misbehaving mark: every cause found since its last clean announcement."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    causes: dict[str, str]  # kind -> detail
    since: float

    def shown(self) -> str:
        return "; ".join(self.causes[k] for k in sorted(self.causes))

    def with_cause(self, cause: Cause) -> Mark:
        return Mark(causes={**self.causes, cause.kind: cause.detail}, since=self.since)

    def without(self, kinds: Iterable[str]) -> Mark | None:
        """The mark less ``kinds``; None when no cause is left."""
        drop = set(kinds)
        left = {k: v for k, v in self.causes.items() if k not in drop}
        return Mark(causes=left, since=self.since) if left else None


class Beat(BaseModel):
    """What a client's heartbeat key says: the session id in it (None when absent), or why
    it cannot be read."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    session_id: str | None = None
    cause: Cause | None = None


def refused(reply: object) -> str:
    """The first line of a Redis refusal, for a cause's detail."""
    return str(reply).splitlines()[0][:200] if str(reply) else type(reply).__name__


def read_heartbeat(length: object, head: object) -> Beat:
    """The heartbeat from ``STRLEN`` and ``GETRANGE 0 MAX_HEARTBEAT_BYTES`` replies: never
    more than that many bytes are read, however large the client made it."""
    if isinstance(length, Exception) or isinstance(head, Exception):
        reply = length if isinstance(length, Exception) else head
        return Beat(
            cause=Cause(kind="heartbeat type", detail=f"its heartbeat is not a string ({refused(reply)})")
        )
    if not isinstance(length, int) or not isinstance(head, bytes | str):
        return Beat(cause=Cause(kind="heartbeat type", detail="its heartbeat is not a string"))
    if length == 0:
        return Beat()  # absent (or empty): silent, not malformed
    if length > MAX_HEARTBEAT_BYTES:
        return Beat(
            cause=Cause(
                kind="heartbeat size",
                detail=f"its heartbeat is {length} bytes, over the {MAX_HEARTBEAT_BYTES} a session id may take",
            )
        )
    if isinstance(head, str):
        return Beat(session_id=head)
    try:
        return Beat(session_id=head.decode("utf-8"))
    except UnicodeDecodeError as exc:
        return Beat(
            cause=Cause(
                kind="heartbeat encoding",
                detail=f"its heartbeat is not UTF-8 text ({exc.reason} at byte {exc.start})",
            )
        )


def typed_keys(client_id: str) -> dict[str, tuple[str, str]]:
    """A client's keys the brain reads or writes, by what they are called in a cause: the
    full key and the Redis type it must have when it exists."""
    return {
        "outbox": (client_key(client_id, CLIENT_OUTBOX), "list"),
        "queue": (client_key(client_id, client_queue(client_id)), "list"),
        "unacked hash": (client_key(client_id, KOMBU_UNACKED), "hash"),
        "unacked index": (client_key(client_id, KOMBU_UNACKED_INDEX), "zset"),
        "cancelled set": (client_key(client_id, key_cancelled()), "set"),
    }


def type_causes(client_id: str, types: Mapping[str, object]) -> list[Cause]:
    """Causes for each of ``typed_keys`` whose ``TYPE`` reply (in ``types``, by name) is not
    ``none`` or the type it must have."""
    causes: list[Cause] = []
    for name, (key, expected) in typed_keys(client_id).items():
        reply = types.get(name)
        if reply is None:
            continue
        if isinstance(reply, Exception):
            causes.append(
                Cause(kind=f"{name} type", detail=f"its {name} {key!r} cannot be read ({refused(reply)})")
            )
            continue
        found = reply.decode(errors="replace") if isinstance(reply, bytes) else str(reply)
        if found not in ("none", expected):
            causes.append(
                Cause(kind=f"{name} type", detail=f"its {name} {key!r} is a {found}, not a {expected}")
            )
    return causes


def reply_cause(name: str, key: str, replies: Iterable[object]) -> Cause | None:
    """A cause when any of the replies of commands on one of a client's keys is a refusal."""
    for reply in replies:
        if isinstance(reply, Exception):
            return Cause(kind=f"{name} type", detail=f"its {name} {key!r} cannot be read ({refused(reply)})")
    return None


def quota_cause(used: int, quota: int) -> Cause | None:
    """A cause when a client keeps more than ``quota`` bytes in Redis."""
    if used <= quota:
        return None
    return Cause(kind=QUOTA_KIND, detail=f"over quota: {used} bytes > {quota} (client_quota_bytes)")


def owner_of_key(key: bytes | str) -> str | None:
    """The client id of a key under ``c:<id>:`` (ids never hold ``:``), else None."""
    text = key.decode(errors="replace") if isinstance(key, bytes) else key
    parts = text.split(":", 2)
    if len(parts) < 3 or parts[0] != "c" or not parts[1]:
        return None
    return parts[1]


def usage_by_client(sizes: Iterable[tuple[bytes | str, object]]) -> dict[str, int]:
    """Bytes each client keeps, from (key, ``MEMORY USAGE`` reply) pairs; a key gone meanwhile
    (None) or refused counts nothing."""
    used: dict[str, int] = {}
    for key, size in sizes:
        owner = owner_of_key(key)
        if owner is not None and isinstance(size, int):
            used[owner] = used.get(owner, 0) + size
    return used
