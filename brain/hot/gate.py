"""The admission gate of server pools (layer: brain/hot; Redis glue). docs/fair-share.md.

A server call bounded by a ``rate_limit`` or ``max_concurrency`` (``brain.core.fairshare``) is
not pushed onto its pool's queue: kombu writes it, as the very message it would have sent, into
its pool's *inbox* at the gate (``INBOX_PREFIX``: the same queue name under a key prefix, so its
routing key still names the pool queue; one prefix, so one Redis connection, for every lane),
and ``gate.lua`` moves it from there to its *lane's* wait list (``gate_wait_prefix``), the lane
``enqueue`` recorded its run in before the message was written. No worker reads either list.
``gate.lua`` moves calls from the wait lists into the pool queues while every limit of their lane allows — a GCRA token
bucket per rate limit on Redis's clock, a ZSET of leased slots per cap — lanes round-robin,
oldest first within a lane. So a waiting call holds no worker slot, and the limits hold across
every pool process on every machine. Everything is one EVALSHA.

Who runs it: the process that put calls at the gate (right after they are written), a server
worker that ends a run holding a slot (it gives the slot back in the same call) or a place in a
queue window (with its other ends of the moment: ``brain.runtime.gate_ends``), and the brain's
gate timer (``brain.runtime.gate_timer``) when the soonest rate-limited call may go, or when woken.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import redis

from brain.core.fairshare import DEFAULT_PRIORITY, AppliedLimit, window_why
from brain.hot.state import as_text
from workers.contracts import (
    DEFAULT_POOL,
    GATE_NS,
    gate_wait_prefix,
    key_cancelled,
    key_gate_fresh,
    key_gate_lane,
    key_gate_lanes,
    key_gate_pause,
    key_gate_paused,
    key_gate_waiting,
    key_gate_wake,
    pool_queue,
)
from workers.scripts import lua
from workers.throttle import MAX_PAUSE_S

# kombu ``global_keyprefix`` of the inbox of gated calls: a call for pool queue Q waits in
# ``<prefix>Q`` until the script moves it into its lane's wait list (gate.lua: ``INBOX``). Not a
# lane id (16 hex digits), so no lane's wait list is an inbox.
INBOX_PREFIX = f"{GATE_NS}w:in:"
# Calls admitted per script call: a few ms of Redis at most; the caller goes again when full.
ADMIT_BUDGET = 500
# How long a lane recorded by a process that has not written its calls yet is kept empty.
FRESH_MS = 30_000
# How stale a dispatcher's copy of the paused servers may be: a call dispatched in that moment
# goes straight to its pool (and may be answered 429 again, extending the pause).
PAUSED_MAX_AGE_S = 1.0
# A slot's lease when its run names none (a run holding one gives it back when it ends; a lease
# is only for a run that never does: a lost message, a worker that died and never came back).
DEFAULT_LEASE_MS = 600_000


@dataclass(frozen=True)
class Lane:
    """Where a gated call waits: its pool, its user and the limits it is bounded by; with fair
    share on (``Fairness``), also its tree, its priority, its user's weight and the pool's
    queue window."""

    id: str
    pool: str | None
    user: str | None
    limits: tuple[AppliedLimit, ...]
    priority: int = DEFAULT_PRIORITY
    weight: int = 1
    # How many calls the pool's queue may hold before this lane waits (0: no window).
    window: int = 0

    @property
    def queue(self) -> str:
        return pool_queue(self.pool)

    @property
    def prefix(self) -> str:
        return gate_wait_prefix(self.id)

    @property
    def wait_key(self) -> str:
        return self.prefix + self.queue

    @property
    def holds_slot(self) -> bool:
        """Whether its run's end must run the gate: it gives back a slot, or (a window) its
        pool's queue took a call, so the next one may go."""
        return self.window > 0 or self.capped

    @property
    def capped(self) -> bool:
        """Whether its run takes a slot under a cap, which its end gives back at once (the
        next call of that cap waits for it)."""
        return any(limit.max_concurrency is not None for limit in self.limits)

    @property
    def refills_window(self) -> bool:
        """Whether its run holds only a place in its pool's queue window: its end's run of the
        gate may wait a moment and serve the worker's other ends too (``brain.runtime.gate_ends``)."""
        return self.window > 0 and not self.capped

    @property
    def group(self) -> str:
        """The lanes that share one turn of the round-robin: one user on one pool."""
        return f"{self.pool or DEFAULT_POOL}\t{self.user or ''}"

    def meta(self) -> dict[str, str]:
        limits = []
        for limit in self.limits:
            of = f"of {limit.scope} {limit.name}"
            limits.append(
                [
                    limit.key,
                    round(1_000_000 / limit.per_s) if limit.rate_limit else 0,
                    limit.max_concurrency or 0,
                    f"rate_limit {limit.rate_limit} {of}",
                    # max_in_flight_per_user says so itself (described()).
                    limit.described()[-1] if limit.max_concurrency else "",
                ]
            )
        return {
            "queue": self.queue,
            "wait": self.wait_key,
            "limits": json.dumps(limits),
            "user": self.user or "",
            "pool": self.pool or "",
            "group": self.group,
            "weight": str(self.weight),
            "priority": str(self.priority),
            "window": str(self.window),
            "window_why": window_why(self.window, self.pool),
        }


@dataclass(frozen=True)
class Waiting:
    """A call put at the gate: its run, its lane and how long a slot it takes may be leased."""

    run_id: str
    lane: Lane
    lease_ms: int


@dataclass(frozen=True)
class Admitted:
    count: int
    # Seconds until the soonest blocked lane may go; None when nothing waits.
    wait_s: float | None


@dataclass(frozen=True)
class LaneView:
    """One lane as ``status --queues`` reads it: whose calls, bounded by which limit keys, how
    many wait, and the limit that last held its head (``why_key``; empty: none yet)."""

    pool: str
    user: str
    keys: tuple[str, ...]
    waiting: int
    why: str
    why_key: str


@dataclass(frozen=True)
class KeyView:
    """One limit key's budget now: slots held, calls admitted per second (Redis second ->
    count, the last few seconds), and its pause if one is on (end: epoch s, Redis time)."""

    running: int
    admitted: dict[int, int]
    paused_until: float | None
    paused_why: str | None


class Gate:
    def __init__(self, r: redis.Redis) -> None:
        self.r = r
        self._script = r.register_script(lua("brain.hot", "gate"))
        self._pause_script = r.register_script(lua("brain.hot", "pause"))
        self._paused: tuple[float, frozenset[str]] = (-PAUSED_MAX_AGE_S - 1, frozenset())
        self._paused_lock = threading.Lock()

    def pause(self, key: str, seconds: float, why: str) -> float:
        """Admit nothing under limit ``key`` (``server:jira``) for ``seconds`` from now on Redis's
        clock, across every process (a later pause already set is kept; an hour at most, as
        the script honours no longer one); the pause's end, epoch s."""
        pause_us = round(min(max(seconds, 0.0), MAX_PAUSE_S) * 1_000_000)
        until_us = self._pause_script(args=[key, pause_us, why], client=self.r)
        return int(until_us) / 1e6

    def pauses(self) -> dict[str, float]:
        """Limit key -> when its pause ends (epoch s, Redis time), for pauses not yet over."""
        now = time.time()
        raw = self.r.hgetall(key_gate_paused())
        found = {as_text(k): int(v) / 1e6 for k, v in raw.items()}  # type: ignore[union-attr]
        return {key: end for key, end in found.items() if end > now}

    def paused(self) -> frozenset[str]:
        """The limit keys paused now, as this process last read them (at most
        ``PAUSED_MAX_AGE_S`` old: dispatching reads Redis once a second, not once a call)."""
        with self._paused_lock:
            read_at, keys = self._paused
            if time.monotonic() - read_at > PAUSED_MAX_AGE_S:
                keys = frozenset(self.pauses())
                self._paused = (time.monotonic(), keys)
            return keys

    def enqueue(self, waiting: Sequence[Waiting]) -> None:
        """Record lanes and runs before their messages are written (a crash between leaves a
        lane with an empty list, which the script drops, never a message nobody admits)."""
        if not waiting:
            return
        pipe = self.r.pipeline(transaction=False)
        for lane in {w.lane.id: w.lane for w in waiting}.values():
            pipe.hset(key_gate_lane(lane.id), mapping=lane.meta())  # type: ignore[arg-type]
            # Fresh: the script keeps a lane whose list is still empty (messages not flushed yet).
            pipe.set(key_gate_fresh(lane.id), b"1", px=FRESH_MS)
            pipe.zadd(key_gate_lanes(), {lane.id: 0}, nx=True)
        pipe.hset(key_gate_waiting(), mapping={w.run_id: f"{w.lane.id}\t{w.lease_ms}" for w in waiting})
        pipe.execute()

    def admit(self, release: Iterable[str] = (), *, wake: bool = True) -> Admitted:
        """Give back the slots of ``release`` (runs that ended), then admit what may go; with
        ``wake`` (any caller but the gate timer itself), wake that timer if calls are left waiting."""
        count, wait_us = self._script(
            args=[key_cancelled(), ADMIT_BUDGET, DEFAULT_LEASE_MS, "1" if wake else "0", *release],
            client=self.r,
        )
        return Admitted(int(count), None if int(wait_us) < 0 else int(wait_us) / 1e6)

    def _lane_ids(self) -> list[str]:
        return [as_text(lane) for lane in self.r.zrange(key_gate_lanes(), 0, -1)]  # type: ignore[arg-type]

    def lanes_view(self) -> list[LaneView]:
        """Every lane with its calls waiting (one pipelined read; the lanes are few)."""
        lanes = self._lane_ids()
        if not lanes:
            return []
        pipe = self.r.pipeline(transaction=False)
        for lane in lanes:
            pipe.hmget(key_gate_lane(lane), ["wait", "limits", "user", "pool", "why", "why_key"])
        metas = pipe.execute()
        for meta in metas:
            pipe.llen(as_text(meta[0]) if meta[0] else "")
        lengths = pipe.execute()
        views = []
        for meta, waiting in zip(metas, lengths, strict=True):
            wait, limits, user, pool, why, why_key = (as_text(v) if v else "" for v in meta)
            try:
                keys = tuple(str(limit[0]) for limit in json.loads(limits))
            except (ValueError, TypeError, IndexError, KeyError):
                continue  # a lane the script drops too
            if not wait.startswith(f"{GATE_NS}w:"):
                continue
            views.append(LaneView(pool or DEFAULT_POOL, user, keys, int(waiting), why, why_key))
        return views

    def keys_view(self, keys: Iterable[str]) -> tuple[dict[str, KeyView], float]:
        """Each limit key's budget now, and Redis's clock (epoch s) they were read at."""
        wanted = sorted(set(keys))
        pipe = self.r.pipeline(transaction=False)
        pipe.time()
        for key in wanted:
            pipe.zcard(f"{GATE_NS}slots:{key}")
            pipe.hgetall(f"{GATE_NS}admits:{key}")
            pipe.get(key_gate_pause(key))
        replies = pipe.execute()
        seconds, micros = replies[0]
        now = int(seconds) + int(micros) / 1e6
        views = {}
        for i, key in enumerate(wanted):
            running, admits, pause = replies[1 + 3 * i : 4 + 3 * i]
            until, _, why = as_text(pause).partition("\t") if pause else ("", "", "")
            paused = int(until) / 1e6 if until.isdigit() and int(until) / 1e6 > now else None
            views[key] = KeyView(
                running=int(running),
                admitted={int(k): int(v) for k, v in admits.items()},
                paused_until=paused,
                paused_why=why if paused is not None else None,
            )
        return views, now

    def wait_keys(self) -> list[str]:
        """The inboxes, then the wait lists of every lane (the reconciler counts a run waiting
        there as held; read in this order, a message the script moves meanwhile is still seen)."""
        lanes = self._lane_ids()
        if not lanes:
            return []
        pipe = self.r.pipeline(transaction=False)
        for lane in lanes:
            pipe.hmget(key_gate_lane(lane), ["wait", "queue"])
        # Only the gate's own lists: a lane a pool forged cannot make another key count as held.
        metas = [(as_text(wait), as_text(queue)) for wait, queue in pipe.execute() if wait and queue]
        waits = [wait for wait, _ in metas if wait.startswith(f"{GATE_NS}w:")]
        inboxes = sorted({INBOX_PREFIX + queue for _, queue in metas} | {INBOX_PREFIX + pool_queue(None)})
        return inboxes + waits

    def throttled(self, run_ids: Iterable[str]) -> dict[str, str]:
        """Run id -> why it waits (``rate_limit 5/s of tool http_get``), for runs at the gate."""
        runs = [r for r in run_ids if r]
        if not runs:
            return {}
        entries = self.r.hmget(key_gate_waiting(), runs)
        lanes = {
            run: as_text(entry).split("\t")[0] for run, entry in zip(runs, entries, strict=True) if entry
        }
        if not lanes:
            return {}
        why = self.lanes_why(lanes.values())
        return {run: why[lane] for run, lane in lanes.items()}

    def lanes_why(self, lane_ids: Iterable[str]) -> dict[str, str]:
        """Lane id -> the limit that last held its head (``rate_limit 5/s of tool http_get``), as
        ``status --queues`` words it; "its lane's limits" before the script said which."""
        ids = sorted(set(lane_ids))
        if not ids:
            return {}
        pipe = self.r.pipeline(transaction=False)
        for lane in ids:
            pipe.hget(key_gate_lane(lane), "why")
        return {
            lane: as_text(text) if text else "its lane's limits"
            for lane, text in zip(ids, pipe.execute(), strict=True)
        }

    def waiting_runs(self, chunk: int) -> Iterator[dict[str, str]]:
        """Every run at the gate -> its lane id, about ``chunk`` at a time (HSCAN: no Redis call
        long however many wait; a run may come twice, one written meanwhile may be missed)."""
        cursor = 0
        while True:
            cursor, found = self.r.hscan(key_gate_waiting(), cursor, count=chunk)  # type: ignore[misc]
            yield {as_text(run): as_text(entry).split("\t")[0] for run, entry in found.items()}  # type: ignore[union-attr]
            if int(cursor) == 0:
                return

    def waiting(self, run_ids: Sequence[str]) -> set[str]:
        """Those of ``run_ids`` still waiting at the gate (cancelled ones too, until the
        script reaches them): one HMGET."""
        if not run_ids:
            return set()
        found = self.r.hmget(key_gate_waiting(), list(run_ids))
        return {run for run, entry in zip(run_ids, found, strict=True) if entry is not None}

    def forget(self, run_ids: Iterable[str]) -> None:
        """Drop the waiting entries of runs no longer waiting (re-sent as new runs)."""
        runs = [r for r in run_ids if r]
        if runs:
            self.r.hdel(key_gate_waiting(), *runs)

    def wait_for_wake(self, timeout_s: float) -> None:
        """Block until a process puts calls at the gate, or ``timeout_s`` passes."""
        self.r.blpop([key_gate_wake()], timeout=max(timeout_s, 0.001))
