"""Requeue: handing K parked client tasks to a connecting client, and what other clients feel.

When a client connects, the brain requeues every ref parked for it (its
``client:<id>`` list, then ``user:<name>``) with ``brain.hot.parked.ParkedWork.requeue``: per
list a short lock, then one Lua step per 1,000 refs that drops the chunk placed before
and returns the next one as a single reply, which is decoded and sorted in Python. The
refs leave their list only once placed; nothing is moved to another list.

``requeue (K parked refs)`` (kept from before): baseline = the naive way on the same
Redis - a Python loop of ``LPOP`` + ``RPUSH``, one round trip each, into a side list, then
one read, decode and sort of it; Vancetope = ``ParkedWork.requeue`` with a placing step
that does nothing (what the brain does per task is not Redis's part).

Both run ``rounds`` times alternately on freshly filled lists (filling is pipelined
and not timed). A separate process PINGs Redis every ~1 ms throughout
(bench/pinger.py); the worst PING overlapping each side's work is what any other
client (workers, the CLI) would have waited at most meanwhile.

The redis-server is the stack's kind: AOF everysec (docs/performance.md: AOF makes bulk
moves 1.2-2.2x slower than without).
"""

from __future__ import annotations

import json
import select
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

import redis

from bench.common import BenchError, Child, Row, child_env, percentile
from brain.hot.parked import _MOVE, CHUNK, ParkedRef, ParkedWork, decode_chunk
from brain.stack.redis_server import RedisServer
from workers.contracts import key_parked, key_requeueing

NAME = "requeue"
CLIENT_ID = "alice-laptop"
OWNERS = [f"client:{CLIENT_ID}", "user:alice"]  # the order a connect takes them in
Window = tuple[float, float]


def fill(r: redis.Redis, k: int) -> None:
    """Park ``k`` refs, alternating between the two owners, pipelined (setup, not timed), as
    ``ParkedWork.park`` stores them (in parked_at order, each is appended)."""
    pipe = r.pipeline(transaction=False)
    now = time.time()
    for i in range(k):
        owner = OWNERS[i % 2]
        ref = ParkedRef(tree_id=f"tree-{i // 100}", task_id=f"t{i}", owner=owner, parked_at=now + i * 1e-3)
        pipe.rpush(key_parked(owner), ref.encode())
        if len(pipe) >= 1000:
            pipe.execute()
    pipe.execute()


def naive_take(r: redis.Redis, client_id: str, owners: list[str]) -> list[ParkedRef]:
    """The small rows' baseline: one LPOP and one RPUSH per ref into a side list, then one
    read of it, decoded and sorted as ``ParkedWork.requeue`` decodes and sorts a chunk."""
    dest = key_requeueing(client_id)
    for owner in owners:
        src = key_parked(owner)
        while (item := r.lpop(src)) is not None:
            r.rpush(dest, cast(bytes, item))
    refs = decode_chunk(b"\n".join(cast(list[bytes], r.lrange(dest, 0, -1))))
    return sorted(refs, key=lambda ref: ref.parked_at)


def count_into(counter: list[int]) -> Callable[[list[ParkedRef]], None]:
    """A placing step that only counts: what the brain does per ref is not Redis's part."""

    def place(refs: list[ParkedRef]) -> None:
        counter[0] += len(refs)

    return place


def reset(r: redis.Redis) -> None:
    r.delete(key_requeueing(CLIENT_ID), *(key_parked(o) for o in OWNERS))


def start_pinger(url: str, timeout: float = 30.0) -> Child:
    pinger = Child.start(
        "pinger", [sys.executable, "-m", "bench.pinger", url], child_env(), stdout=subprocess.PIPE
    )
    assert pinger.process.stdout is not None
    ready, _, _ = select.select([pinger.process.stdout], [], [], timeout)
    line = pinger.process.stdout.readline() if ready else b""
    if line.strip() != b"ready":
        pinger.stop()
        raise BenchError(f"the pinger did not start within {timeout:g}s (said {line!r})")
    return pinger


def stop_pinger(pinger: Child, timeout: float = 30.0) -> list[tuple[float, float]]:
    pinger.process.terminate()
    try:
        out, _ = pinger.process.communicate(timeout=timeout)
    finally:
        pinger.stop()
    return [(float(s), float(d)) for s, d in json.loads(out or b"[]")]


def worst_ping(samples: list[tuple[float, float]], windows: list[Window]) -> float:
    """The slowest PING whose flight overlapped any of ``windows`` (seconds)."""
    hits = [d for s, d in samples if any(s < end and s + d > start for start, end in windows)]
    if not hits:
        raise BenchError("no PING overlapped the measured moves; the pinger did not run")
    return max(hits)


def run(quick: bool = False) -> list[Row]:
    return run_small(quick) + run_big(quick)


BIG, BIG_QUICK = 100_000, 10_000
BIG_ROUNDS = 5
PING_LIMIT_MS = 10.0


def run_big(quick: bool = False) -> list[Row]:
    """``requeue_100k``: what requeue-on-connect does on Redis for 100,000 parked refs, vs one
    chunked Lua pass over the same lists; plus ``redis_bytes_per_parked_task`` from a fill.

    Vancetope: ``ParkedWork.requeue`` - exactly the Redis side of ``ClientWork.requeue``:
    per list (the older per-client ``requeueing`` list, ``client:<id>``, ``user:<name>``)
    take the lock, one Lua step per 1,000 refs (drop the chunk placed before, return the
    next as one reply), decode and sort each chunk, drop the last and let go. Its placing
    step only counts: the per-task store read, compare-and-set and dispatch of
    ``Scheduler.start`` are NOT included (at the throughput rows' rates 100,000 of them
    would take many minutes). Baseline: the ``brain.hot.parked._MOVE`` script, 1,000 refs per
    EVAL, moving both lists into another until they are empty - nothing else (no reply
    to decode). Median of ``BIG_ROUNDS`` alternating rounds on freshly filled lists.
    """
    k = BIG_QUICK if quick else BIG
    windows: dict[str, list[Window]] = {"baseline": [], "vancetope": []}
    base_s: list[float] = []
    vt_s: list[float] = []
    with tempfile.TemporaryDirectory(prefix="vancetope-bench-") as tmp:
        server = RedisServer(Path(tmp) / "redis", appendonly=True).start()
        r = redis.Redis.from_url(server.url)
        pinger: Child | None = None
        try:
            parked = ParkedWork(r)
            move = r.register_script(_MOVE)
            reset(r)
            before = int(r.info("memory")["used_memory"])
            fill(r, k)
            per_ref = (int(r.info("memory")["used_memory"]) - before) / k
            payload = sum(len(x) for x in r.lrange(key_parked(OWNERS[0]), 0, 99)) / 100
            pinger = start_pinger(server.url)
            for _ in range(BIG_ROUNDS):
                for side in ("baseline", "vancetope"):
                    reset(r)
                    fill(r, k)
                    time.sleep(0.05)  # let the pinger see an idle Redis between runs
                    handed = [0]
                    started, t0 = time.monotonic(), time.perf_counter()
                    if side == "baseline":
                        keys = [key_requeueing(CLIENT_ID), *(key_parked(o) for o in OWNERS)]
                        while int(move(keys=keys, args=[CHUNK])) > 0:
                            pass
                    else:
                        parked.requeue(CLIENT_ID, OWNERS, count_into(handed))
                    elapsed = time.perf_counter() - t0
                    windows[side].append((started, time.monotonic()))
                    if side == "baseline" and r.llen(key_requeueing(CLIENT_ID)) != k:
                        raise BenchError("the Lua pass did not move every ref")
                    if side == "vancetope" and (
                        handed[0] != k or any(r.exists(key_parked(o)) for o in OWNERS)
                    ):
                        raise BenchError(
                            f"requeue handed out {handed[0]:,} of {k:,} refs or left some listed"
                        )
                    (base_s if side == "baseline" else vt_s).append(elapsed)
            samples = stop_pinger(pinger)
            pinger = None
        finally:
            if pinger is not None:
                pinger.stop()
            r.close()
            server.stop()
    base_med, vt_med = statistics.median(base_s), statistics.median(vt_s)
    base_ping = worst_ping(samples, windows["baseline"]) * 1000
    vt_ping = worst_ping(samples, windows["vancetope"]) * 1000
    size_note = f" (quick size; full: {BIG:,})" if quick else ""
    return [
        Row(
            benchmark="requeue_100k",
            metric="s",
            baseline=base_med,
            vancetope=vt_med,
            kind="latency",
            baseline_label="one chunked Lua pass (1,000/EVAL)",
            goal=2.0,
            extra={
                "n": k,
                "rounds": BIG_ROUNDS,
                "worst_ping_ms": vt_ping,
                "baseline_worst_ping_ms": base_ping,
                "baseline_s": base_s,
                "vancetope_s": vt_s,
            },
            notes=(
                f"{k:,} refs{size_note}, median of {BIG_ROUNDS} (Lua pass {min(base_s):.2f}-{max(base_s):.2f}s, "
                f"requeue {min(vt_s):.2f}-{max(vt_s):.2f}s); Vancetope = ParkedWork.requeue: per list a lock, "
                "one Lua step per 1,000 refs (drop placed chunk, return next as one reply), decode+sort; "
                "store/dispatch per task NOT included. Worst PING of another client meanwhile "
                f"{vt_ping:.1f} ms ({'within' if vt_ping <= PING_LIMIT_MS else 'OVER'} the 10 ms bound; "
                f"Lua pass {base_ping:.1f} ms)"
            ),
        ),
        Row(
            benchmark="redis_bytes_per_parked_task",
            metric="bytes",
            baseline=payload,
            vancetope=per_ref,
            kind="latency",
            baseline_label="the ref's payload",
            extra={"n": k},
            notes=(
                f"used_memory growth / {k:,} refs parked in two lists (AOF on); refs stored as "
                "'<parked_at> <tree_id> <task_id> <nonce>' (was JSON, 115 bytes); no goal"
            ),
        ),
    ]


def run_small(quick: bool = False) -> list[Row]:
    k = 1000 if quick else 5000
    rounds = 2 if quick else 3
    base_s: list[float] = []
    vt_s: list[float] = []
    windows: dict[str, list[Window]] = {"baseline": [], "vancetope": []}
    with tempfile.TemporaryDirectory(prefix="vancetope-bench-") as tmp:
        server = RedisServer(Path(tmp) / "redis", appendonly=True).start()
        r = redis.Redis.from_url(server.url)
        pinger: Child | None = None
        try:
            parked = ParkedWork(r)
            pinger = start_pinger(server.url)
            for _ in range(rounds):
                for side in ("baseline", "vancetope"):
                    reset(r)
                    fill(r, k)
                    time.sleep(0.05)  # let the pinger see an idle Redis between moves
                    started, t0 = time.monotonic(), time.perf_counter()
                    handed = [0]
                    if side == "baseline":
                        handed[0] = len(naive_take(r, CLIENT_ID, OWNERS))
                    else:
                        parked.requeue(CLIENT_ID, OWNERS, count_into(handed))
                    elapsed = time.perf_counter() - t0
                    windows[side].append((started, time.monotonic()))
                    if handed[0] != k:
                        raise BenchError(f"{side} handed out {handed[0]} refs, expected {k}")
                    (base_s if side == "baseline" else vt_s).append(elapsed)
            samples = stop_pinger(pinger)
            pinger = None
        finally:
            if pinger is not None:
                pinger.stop()
            r.close()
            server.stop()
    base_med, vt_med = statistics.median(base_s), statistics.median(vt_s)
    idle = [
        d
        for s, d in samples
        if not any(s < e and s + d > b for b, e in windows["baseline"] + windows["vancetope"])
    ]
    idle_p50 = percentile(idle, 50) * 1000 if idle else float("nan")
    base_ping = worst_ping(samples, windows["baseline"]) * 1000
    vt_ping = worst_ping(samples, windows["vancetope"]) * 1000
    return [
        Row(
            benchmark=f"{NAME} ({k:,} parked refs)",
            metric="refs/s",
            baseline=k / base_med,
            vancetope=k / vt_med,
            kind="throughput",
            baseline_label="Python LPOP+RPUSH loop",
            notes=(
                f"median of {rounds}: {base_med * 1000:.0f} ms vs {vt_med * 1000:.0f} ms; baseline = loop "
                "into a side list + one read, decode, sort; Vancetope = ParkedWork.requeue (chunked Lua "
                "steps, decode+sort per chunk, placing step a no-op)"
            ),
        ),
        Row(
            benchmark=f"{NAME}: another client's worst PING",
            metric="ms",
            baseline=base_ping,
            vancetope=vt_ping,
            kind="latency",
            baseline_label="during the loop",
            notes=f"pinger process every ~1 ms; idle PING p50 {idle_p50:.2f} ms",
        ),
    ]


if __name__ == "__main__":
    for row in run(quick=True):
        print(row, f"ratio {row.ratio:.2f}")
