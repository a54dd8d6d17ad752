"""How long the cancelled sets keep a run (layer: brain/hot; Redis glue).

A run id in a cancelled set (the server pools' ``vt:cancelled``, each client's own
``c:<id>:vt:cancelled``) tells a worker never to start that run; a ``stop:<run id>`` member
tells one running it to stop. Both matter only while a message of that run can still reach a
worker. Kept for ever, as they were, a server's set grew by every run any cancel, expiry or
lost-call sweep ever ended, and a client's by its own, which counts against its
``client_quota_bytes``: months of cancelled night batches would one day suspend a workstation
for what the brain wrote.

So each time the brain adds members it also writes them, in the same ``MULTI``, in a *batch*
(a list, ``BATCH_PREFIX``) indexed by when (``INDEX_KEY``, a sorted set, Redis's clock: brains
on hosts whose clocks differ agree on it): the brain's own keys, which no client can touch and
which count against no quota. The reconciler takes out of the sets the members of every batch
older than ``cancelled_kept_s`` (``trim``), except those whose run may still meet a worker
(``split_due``), which go into a new batch, looked at again after another ``cancelled_kept_s``:

- a client's run whose message that client still holds (waiting in its queue, reserved in
  kombu's unacked hash, a result in its outbox);
- a server run still waiting at the admission gate (``brain.hot.gate``: a run waits there
  until the gate's script reaches it, which drops it because it is in the cancelled set; once
  out, it would spend a rate token and a slot before the store refused it).

What no look can see is a message already in a process's memory: an agent holding a call for
its user's approval, whose run the brain took back when the agent fell silent (its message
deleted from kombu's unacked hash). ``cancelled_kept_s`` is therefore longer than the longest
approval wait (``MAX_ASK_TIMEOUT_S``, a week); the default is eight days. A server run queued
longer than that finds the store refusing its begin (``Store.begin_run``), unless the store
fails at that moment and the pool begins it against Redis (``brain.runtime.recorder``).

A batch costs Redis about half what its members cost in the set (50,000 run ids of a night
batch: 5.7 MB in the set, 3.0 MB in batches; a sorted-set entry per member took 7.5 MB, and its
``ZADD`` of 10,000 held Redis 5-10 ms, the batch's ``RPUSH`` under 1 ms). A run cancelled twice
leaves with its first batch unless a look keeps it. Members written by an older brain are in
no batch and are never taken out.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import redis

from workers.contracts import KEY_NS, client_key, key_cancelled, stop_member

# ``<client id or *> <batch id>`` -> when its batch was written (s, the brain's clock).
INDEX_KEY = f"{KEY_NS}cancelled:batches"
# A batch: the list of the members one ``HotState.cancel_runs`` step added to one set.
BATCH_PREFIX = f"{KEY_NS}cancelled:batch:"
# One brain of several trims in each interval (``brain.hot.turns.my_turn``), at most this often.
TRIM_TURN_KEY = f"{KEY_NS}cancelled:trimming"
TRIM_EVERY_S = 60.0
# The scope of the server pools' set in an entry: no client id starts with "*".
SERVER_SCOPE = "*"
# Members read, and taken out in one MULTI, at a time: about a millisecond of Redis.
TRIM_CHUNK = 1000
# Members one trim looks at (a batch it began is finished); the rest wait for the next turn.
TRIM_BUDGET = 50_000

_STOP = stop_member("")


def index_entry(client_id: str | None, batch_id: str) -> str:
    """``<client id or *> <batch id>``: a client id has no space (``workers.contracts``)."""
    return f"{client_id or SERVER_SCOPE} {batch_id}"


def parse_entry(entry: bytes | str) -> tuple[str | None, str]:
    """(client id or None for the server pools, batch id) of an index entry."""
    text = entry.decode() if isinstance(entry, bytes) else entry
    scope, _, batch_id = text.partition(" ")
    return (None if scope == SERVER_SCOPE else scope), batch_id


def run_of(member: str) -> str:
    """The run id a member names (a ``stop:`` member names the run it stops)."""
    return member.removeprefix(_STOP)


def cancelled_set(client_id: str | None) -> str:
    return key_cancelled() if client_id is None else client_key(client_id, key_cancelled())


def write_batch(pipe: redis.client.Pipeline, client_id: str | None, members: list[str], at: float) -> None:
    """Queue on ``pipe`` the batch of ``members`` just added to a cancelled set."""
    if not members:
        return
    batch_id = uuid.uuid4().hex
    pipe.rpush(BATCH_PREFIX + batch_id, *members)
    pipe.zadd(INDEX_KEY, {index_entry(client_id, batch_id): at})


@dataclass
class Trimmed:
    """What a trim did: members taken out, and members kept because their run may still meet
    a worker (looked at again after another ``cancelled_kept_s``)."""

    removed: int = 0
    kept: int = 0


def split_due(members: list[str], held: set[str] | None) -> tuple[list[str], list[str]]:
    """(to take out, to keep) of one set's members past their time: ``held`` is the runs of
    theirs that may still meet a worker (``trim``), None when that cannot be known (then all
    are kept, to be looked at again later)."""
    if held is None:
        return [], members
    return [m for m in members if run_of(m) not in held], [m for m in members if run_of(m) in held]


def redis_now(r: redis.Redis) -> float:
    """Redis's clock, in seconds."""
    seconds, micros = cast(tuple[int, int], r.time())
    return seconds + micros / 1e6


def trim(
    r: redis.Redis,
    *,
    kept_s: float,
    client_holds: Callable[[str], set[str] | None],
    waiting: Callable[[list[str]], set[str]],
) -> Trimmed:
    """Take out of the cancelled sets the members of the batches written more than ``kept_s``
    ago, but those whose run may still meet a worker: ``client_holds(client)`` is the run ids a
    client's keys hold (None: unreadable), asked once per client per trim; ``waiting(runs)``
    the ones of ``runs`` still waiting at the gate. Oldest batch first, ``TRIM_CHUNK`` members
    per ``MULTI`` (the set's ``SREM``, the kept ones' new batch, the ``LTRIM`` of what was done:
    a brain that dies half-way leaves the rest for the next trim), about ``TRIM_BUDGET``
    members per call."""
    now = redis_now(r)
    cutoff = now - kept_s
    known: dict[str, set[str] | None] = {}

    def held(client_id: str | None, members: list[str]) -> set[str] | None:
        if client_id is None:
            return waiting([run_of(m) for m in members])
        if client_id not in known:
            known[client_id] = client_holds(client_id)
        return known[client_id]

    done = Trimmed()
    while done.removed + done.kept < TRIM_BUDGET:
        due = cast(list[bytes], r.zrangebyscore(INDEX_KEY, "-inf", cutoff, start=0, num=1))
        if not due:
            break
        client_id, batch_id = parse_entry(due[0])
        batch = BATCH_PREFIX + batch_id
        while chunk := cast(list[bytes], r.lrange(batch, 0, TRIM_CHUNK - 1)):
            members = [m.decode() for m in chunk]
            drop, keep = split_due(members, held(client_id, members))
            pipe = r.pipeline(transaction=True)
            if drop:
                # A client that replaced its own set with another type: the error is its own.
                pipe.srem(cancelled_set(client_id), *drop)
            write_batch(pipe, client_id, keep, now)
            pipe.ltrim(batch, len(chunk), -1)
            pipe.execute(raise_on_error=False)
            done.removed += len(drop)
            done.kept += len(keep)
        r.zrem(INDEX_KEY, due[0])
    return done
