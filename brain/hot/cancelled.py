"""How long the cancelled sets keep a run (layer: brain/hot; Redis glue).

A run id in a cancelled set (the server pools' ``vt:cancelled``, each client's own
``c:<id>:vt:cancelled``) tells a worker never to start that run; a ``stop:<run id>`` member
tells one running it to stop. Both matter only while a message of that run can still reach a
worker. Kept for ever, as they were, a server's set grew by every run any cancel, expiry or
lost-call sweep ever ended, and a client's by its own, which counts against its
``client_quota_bytes``: months of cancelled night batches would one day suspend a workstation
for what the brain wrote.

So the brain writes each member it adds into an index too, a sorted set of when it was added
(``INDEX_KEY``, the brain's own key: no client can touch it and it counts against no quota),
and the reconciler takes out of the sets what has been there longer than ``cancelled_kept_s``
(``trim``) — except a client's run whose message that client still holds (waiting in its
queue, reserved in kombu's unacked hash, a result in its outbox): a laptop that slept for a
week with a cancelled call reserved still finds it cancelled when it wakes. A server run needs
no such look: the store refuses to begin a run it no longer has in flight
(``Store.begin_run``), the cancelled set only spares the pool that write, and a run waiting at
the gate is dropped there by its lane's record. A member written by an older brain, with no
index entry, is never taken out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import cast

import redis

from workers.contracts import KEY_NS, client_key, key_cancelled, stop_member
from workers.scripts import lua

# Entry (``index_entry``) -> the time (s, the brain's clock) its member was added.
INDEX_KEY = f"{KEY_NS}cancelled:at"
# One brain of several trims in each interval (``brain.hot.turns.my_turn``), at most this often.
TRIM_TURN_KEY = f"{KEY_NS}cancelled:trimming"
TRIM_EVERY_S = 60.0
# The scope of the server pools' set in an entry: no client id starts with "*".
SERVER_SCOPE = "*"
# Entries read, and taken out by one script call, at a time: a few ms of Redis at most.
TRIM_CHUNK = 1000
# Chunks one trim takes at most; what is left waits for the next interval.
TRIM_CHUNKS = 50

_STOP = stop_member("")


def index_entry(client_id: str | None, member: str) -> str:
    """``<client id or *> <member>``: a client id has no space (``workers.contracts``)."""
    return f"{client_id or SERVER_SCOPE} {member}"


def parse_entry(entry: bytes | str) -> tuple[str | None, str]:
    """(client id or None for the server pools, member) of an index entry."""
    text = entry.decode() if isinstance(entry, bytes) else entry
    scope, _, member = text.partition(" ")
    return (None if scope == SERVER_SCOPE else scope), member


def run_of(member: str) -> str:
    """The run id a member names (a ``stop:`` member names the run it stops)."""
    return member.removeprefix(_STOP)


def cancelled_set(client_id: str | None) -> str:
    return key_cancelled() if client_id is None else client_key(client_id, key_cancelled())


def index_members(
    pipe: redis.client.Pipeline, client_id: str | None, members: Iterable[str], at: float
) -> None:
    """Queue the index entries of ``members`` just added to a cancelled set on ``pipe``."""
    entries = {index_entry(client_id, m): at for m in members}
    if entries:
        pipe.zadd(INDEX_KEY, entries)


@dataclass
class Trimmed:
    """What a trim did: members taken out, and members kept because their client still holds
    their run (looked at again after another ``cancelled_kept_s``)."""

    removed: int = 0
    kept: int = 0


def split_due(
    due: Iterable[tuple[str | None, str]], held: Callable[[str], set[str] | None]
) -> tuple[list[tuple[str | None, str]], list[tuple[str | None, str]]]:
    """(to take out, to keep) of members past their time. ``held(client)`` is the run ids that
    client's keys still hold, or None when they cannot be read (then all of its are kept, to be
    looked at again later)."""
    drop: list[tuple[str | None, str]] = []
    keep: list[tuple[str | None, str]] = []
    for client_id, member in due:
        if client_id is None:
            drop.append((client_id, member))
            continue
        runs = held(client_id)
        (keep if runs is None or run_of(member) in runs else drop).append((client_id, member))
    return drop, keep


def trim(r: redis.Redis, *, now: float, kept_s: float, held: Callable[[str], set[str] | None]) -> Trimmed:
    """Take out of the cancelled sets the members added more than ``kept_s`` before ``now``
    whose run no client holds (``split_due``); oldest first, ``TRIM_CHUNK`` per script call,
    at most ``TRIM_CHUNKS`` calls. ``held`` is asked once per client per trim."""
    cutoff = now - kept_s
    known: dict[str, set[str] | None] = {}

    def held_once(client_id: str) -> set[str] | None:
        if client_id not in known:
            known[client_id] = held(client_id)
        return known[client_id]

    done = Trimmed()
    script = r.register_script(lua("brain.hot", "trim_cancelled"))
    for _ in range(TRIM_CHUNKS):
        raw = cast(list[bytes], r.zrangebyscore(INDEX_KEY, "-inf", cutoff, start=0, num=TRIM_CHUNK))
        if not raw:
            break
        drop, keep = split_due((parse_entry(e) for e in raw), held_once)
        args: list[str | float | int] = [cutoff, now, len(drop)]
        for client_id, member in drop:
            args += [index_entry(client_id, member), cancelled_set(client_id), member]
        args += [index_entry(client_id, member) for client_id, member in keep]
        removed, kept = script(keys=[INDEX_KEY], args=args)
        done.removed += int(removed)
        done.kept += int(kept)
        if len(raw) < TRIM_CHUNK:
            break
    return done
