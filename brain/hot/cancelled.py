"""How long the cancelled sets keep a run (layer: brain/hot; Redis glue).

A run id in a cancelled set (the server pools' ``vt:cancelled``, each client's own
``c:<id>:vt:cancelled``) tells a worker never to start that run; a ``stop:<run id>`` member
tells one running it to stop. Both matter only while a message of that run can still reach a
worker. Kept for ever, as they were, a server's set grew by every run any cancel, expiry or
lost-call sweep ever ended, and a client's by its own, which counts against its
``client_quota_bytes``: months of cancelled night batches would one day suspend a workstation
for what the brain wrote.

So each time the brain adds members it also writes them, in the same ``MULTI``, in a *batch*:
a list (``BATCH_PREFIX``) per set, minute of Redis's clock and retention, indexed by when it
may go (``INDEX_KEY``, a sorted set: the end of its minute plus its retention). The brain's own
keys, which no client can touch and which count against no quota; one batch for every cancel
of a minute, however many calls they were (the sweeps cancel runs one by one). Two retentions:

- a cancel's or an expiry's runs: ``cancelled_kept_s`` (a day);
- a run taken back from a silent agent, or found lost (``TAKEN_BACK_KEPT_S``, a week and a
  day): the agent may hold such a call in memory, its message gone from every key a look can
  read, waiting for its user's approval, which ends after ``ask_timeout_s`` (at most
  ``MAX_ASK_TIMEOUT_S``, a week, wall clock: ``client_agent.consent_gate``).

The reconciler (``trim``) takes the members of every batch past its time out of their set, but
those whose run may still meet a worker (``split_due``), which go into a batch of the present
minute, looked at again after another ``cancelled_kept_s``:

- a client's run whose message that client still holds (waiting in its queue, reserved in
  kombu's unacked hash, a result in its outbox), read both ways round
  (``HotState.message_ids_held(both_ways=True)``: a message kombu restores from the hash to the
  queue between the two reads is seen);
- a server run still waiting at the admission gate (``brain.hot.gate``: the gate's script
  drops a cancelled run only on reaching it; out of the set first, it would be admitted and
  spend a rate token and a slot before the store refused it).

A server run queued longer than its retention finds the store refusing its begin
(``Store.begin_run``), unless the store fails at that moment and the pool begins it against
Redis (``brain.runtime.recorder``). Two brains that trim at once (a turn is a lease of
``TRIM_EVERY_S``) do not both take the same batch: each round ``WATCH``es its batches and stops
if another brain changed one. Members written by an older brain are in no batch and stay.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import redis

from workers.contracts import KEY_NS, MAX_ASK_TIMEOUT_S, client_key, key_cancelled, stop_member

# ``<client id or *> <minute>:<retention>`` -> when its batch may go (s, Redis's clock).
INDEX_KEY = f"{KEY_NS}cancelled:batches"
# A batch: ``BATCH_PREFIX<client id or *>:<minute>:<retention>``, the list of what was added.
BATCH_PREFIX = f"{KEY_NS}cancelled:batch:"
BUCKET_S = 60
# The retention of a run taken back or found lost: longer than any approval wait.
TAKEN_BACK_KEPT_S = MAX_ASK_TIMEOUT_S + 86_400.0
# One brain of several trims in each interval (``brain.hot.turns.my_turn``), at most this often.
TRIM_TURN_KEY = f"{KEY_NS}cancelled:trimming"
TRIM_EVERY_S = 60.0
# A trim's rounds: this many batches, ``TRIM_CHUNK`` members of each, in three round trips; the
# trim stops after ``TRIM_BUDGET_S`` (well inside its turn), the rest waits for the next one.
ROUND_BATCHES = 100
TRIM_CHUNK = 1000
TRIM_BUDGET_S = 10.0
# Members per SADD / RPUSH / SREM of a cancelled set or batch: no command carries megabytes.
CHUNK_WRITE = 10_000
# The scope of the server pools' set in an entry: no client id starts with "*".
SERVER_SCOPE = "*"

_STOP = stop_member("")


def index_entry(client_id: str | None, batch_id: str) -> str:
    """``<client id or *> <batch id>``: a client id has no space (``workers.contracts``)."""
    return f"{client_id or SERVER_SCOPE} {batch_id}"


def parse_entry(entry: bytes | str) -> tuple[str | None, str]:
    """(client id or None for the server pools, batch id) of an index entry."""
    text = entry.decode() if isinstance(entry, bytes) else entry
    scope, _, batch_id = text.partition(" ")
    return (None if scope == SERVER_SCOPE else scope), batch_id


def batch_key(client_id: str | None, batch_id: str) -> str:
    return f"{BATCH_PREFIX}{client_id or SERVER_SCOPE}:{batch_id}"


def run_of(member: str) -> str:
    """The run id a member names (a ``stop:`` member names the run it stops)."""
    return member.removeprefix(_STOP)


def cancelled_set(client_id: str | None) -> str:
    return key_cancelled() if client_id is None else client_key(client_id, key_cancelled())


def write_chunks(members: list[str]) -> list[list[str]]:
    """``members`` in ``CHUNK_WRITE``-long pieces, one command's worth each."""
    return [members[start : start + CHUNK_WRITE] for start in range(0, len(members), CHUNK_WRITE)]


def redis_now(r: redis.Redis) -> float:
    """Redis's clock, in seconds: brains on hosts whose clocks differ agree on it."""
    seconds, micros = cast(tuple[int, int], r.time())
    return seconds + micros / 1e6


def write_batch(
    pipe: redis.client.Pipeline, client_id: str | None, members: list[str], now: float, kept_s: float
) -> None:
    """Queue on ``pipe`` the batch entry of ``members`` just added to a cancelled set at
    ``now`` (Redis's clock), to be taken out ``kept_s`` after the end of its minute."""
    if not members:
        return
    minute = int(now // BUCKET_S)
    batch_id = f"{minute}:{int(kept_s)}"
    for chunk in write_chunks(members):
        pipe.rpush(batch_key(client_id, batch_id), *chunk)
    pipe.zadd(INDEX_KEY, {index_entry(client_id, batch_id): (minute + 1) * BUCKET_S + kept_s}, nx=True)


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


def trim(
    r: redis.Redis,
    *,
    again_s: float,
    client_holds: Callable[[str], set[str] | None],
    waiting: Callable[[list[str]], set[str]],
    budget_s: float = TRIM_BUDGET_S,
) -> Trimmed:
    """Take out of the cancelled sets the members of every batch past its time, but those
    whose run may still meet a worker: ``client_holds(client)`` is the run ids a client's keys
    hold (None: unreadable), asked once per client per trim; ``waiting(runs)`` the ones of
    ``runs`` still waiting at the gate. Kept ones go into a batch looked at after ``again_s``.
    Oldest batches first, ``ROUND_BATCHES`` a round: one read of the index, one pipeline of
    their first ``TRIM_CHUNK`` members, one ``MULTI`` (each set's ``SREM``, the kept ones' batch,
    each batch's ``LTRIM``, or its ``DEL`` and index entry once read to its end), all under a
    ``WATCH`` of the round's batches: another brain trimming them at the same time stops this
    one. A brain that dies half-way leaves the rest for the next trim."""
    now = redis_now(r)
    known: dict[str, set[str] | None] = {}

    def held(client_id: str | None, members: list[str]) -> set[str] | None:
        if client_id is None:
            return waiting([run_of(m) for m in members])
        if client_id not in known:
            known[client_id] = client_holds(client_id)
        return known[client_id]

    done = Trimmed()
    started = time.monotonic()
    while time.monotonic() - started < budget_s:
        due = cast(list[bytes], r.zrangebyscore(INDEX_KEY, "-inf", now, start=0, num=ROUND_BATCHES))
        if not due:
            break
        batches = [parse_entry(e) for e in due]
        keys = [batch_key(client_id, batch_id) for client_id, batch_id in batches]
        with r.pipeline(transaction=True) as tx:
            try:
                tx.watch(*keys)
                reads = r.pipeline(transaction=False)
                for key in keys:
                    reads.lrange(key, 0, TRIM_CHUNK - 1)
                chunks = cast(list[list[bytes]], reads.execute())
                drop: dict[str | None, list[str]] = {}
                keep: dict[str | None, list[str]] = {}
                for (client_id, _), chunk in zip(batches, chunks, strict=True):
                    members = [m.decode() for m in chunk]
                    out, kept = split_due(members, held(client_id, members))
                    drop.setdefault(client_id, []).extend(out)
                    keep.setdefault(client_id, []).extend(kept)
                tx.multi()
                for client_id, members in drop.items():
                    for piece in write_chunks(members):
                        # A client that replaced its own set with another type: its error only.
                        tx.srem(cancelled_set(client_id), *piece)
                for client_id, members in keep.items():
                    write_batch(tx, client_id, members, now, again_s)
                for entry, key, chunk in zip(due, keys, chunks, strict=True):
                    if len(chunk) < TRIM_CHUNK:
                        tx.delete(key)
                        tx.zrem(INDEX_KEY, entry)
                    else:
                        tx.ltrim(key, len(chunk), -1)
                tx.execute(raise_on_error=False)
            except redis.WatchError:
                break  # another brain is trimming these: its turn ran long; it goes on with them
        done.removed += sum(map(len, drop.values()))
        done.kept += sum(map(len, keep.values()))
    return done
