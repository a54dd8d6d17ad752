"""CPU per task: CPU-seconds of every process of each side per independent task.

The work is ``throughput_5000``'s (bench/throughput.py): N independent no-op tasks (quick:
1,000), on one redis-server.

Baseline: plain Celery, the producer ``send_task``s N ``bench.noop`` to a prefork ``-c 2``
worker, each job ``INCR``s a counter the producer polls every 5 ms. Counted: the worker's
process tree (main process and pool children) and the producer's own CPU from its first
send until the counter reads N.

Vancetope: one tree of N independent ``echo`` tasks submitted with
``Brain.connect(...).scheduler.submit`` on an embedded stack with a brain (``-P solo``), the
server pool (prefork ``-c 2``) and a connected client agent (``bench-laptop``, idle here
but part of every stack that has one). Counted: the brain's, the pool's and the agent's
process trees and the submitter's own CPU from submit() until the store says the tree is
done (the submitter writes the tree and dispatches its tasks: that is Vancetope's work too).

Process trees from ``/proc`` (bench/proc_cpu.py: utime + stime + the reaped children's
cutime + cstime of the root and every descendant), read before and 0.5 s after the run so
the last acks and event flushes land inside; the producer/submitter with
``time.process_time()`` (all its threads) around send + wait. Both waits poll (the
baseline a GET every 5 ms, Vancetope a pub/sub wake-up at most every 0.2 s and a SQLite
status read); the notes show the producer/submitter share separately. The shared
redis-server's CPU is reported for each side in the notes, not in the ratio.

Sides alternate run by run; median of 3 per side (quick: 1).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.client_rt import client_stack
from bench.common import Row, service_pid
from bench.proc_cpu import tree_cpu_s
from bench.rigs import Baseline, Vancetope, baseline_on, echo_tree, vancetope_connected
from brain.stack.embedded import EmbeddedStack

NAME = "cpu_per_task"
GOAL = 1.3
FULL_N, QUICK_N = 5000, 1000
# After the tree is done / the counter reads N, the workers still ack the last jobs and
# flush their events: read their CPU this much later (idle processes add next to nothing).
SETTLE_S = 0.5
VANCETOPE_SERVICES = ("brain", "server-pool", "client-agent")


@dataclass(frozen=True)
class Sample:
    """CPU-seconds of one side over one run of N tasks."""

    processes: dict[str, float]  # each of the side's worker process trees
    caller: float  # the producer / submitter (this process)
    redis: float  # the shared redis-server, for the notes
    wall: float

    @property
    def workers(self) -> float:
        return sum(self.processes.values())

    @property
    def total(self) -> float:
        return self.workers + self.caller


def run(quick: bool = False) -> list[Row]:
    n = QUICK_N if quick else FULL_N
    reps = 1 if quick else 3
    base: list[Sample] = []
    vt_runs: list[Sample] = []
    with (
        tempfile.TemporaryDirectory(prefix="vancetope-bench-") as tmp,
        client_stack(Path(tmp)) as stack,
        baseline_on(stack) as celery,
        vancetope_connected(stack) as vt,
    ):
        vt_roots = {name: service_pid(stack, name) for name in VANCETOPE_SERVICES}
        for _ in range(reps):
            base.append(_baseline_run(stack, celery, n))
            vt_runs.append(_vancetope_run(stack, vt, vt_roots, n))
    b = _median(base)
    v = _median(vt_runs)
    per = 1000.0 / n  # CPU-seconds per run -> CPU ms per task
    return [
        Row(
            benchmark=NAME,
            metric="CPU ms/task",
            baseline=b.total * per,
            vancetope=v.total * per,
            kind="latency",
            baseline_label="plain Celery worker tree (prefork -c 2) + producer",
            goal=GOAL,
            extra={
                "n": n,
                "baseline_worker_ms": b.workers * per,
                "baseline_producer_ms": b.caller * per,
                **{f"vancetope_{name.replace('-', '_')}_ms": cpu * per for name, cpu in v.processes.items()},
                "vancetope_submitter_ms": v.caller * per,
                "baseline_redis_ms": b.redis * per,
                "vancetope_redis_ms": v.redis * per,
            },
            notes=(
                f"N = {n:,}{' (quick size; full: 5,000)' if quick else ''} independent tasks; "
                f"{'median of ' + str(reps) + ' per side, ' if reps > 1 else ''}"
                f"CPU ms per task: baseline worker {b.workers * per:.2f} + producer {b.caller * per:.2f} "
                f"(send_task and a GET every 5 ms); Vancetope "
                + " + ".join(f"{name} {cpu * per:.2f}" for name, cpu in v.processes.items())
                + f" + submitter {v.caller * per:.2f} (submit() and its wait); "
                f"redis-server (not in the ratio) {b.redis * per:.2f} vs {v.redis * per:.2f}; "
                f"wall {b.wall:.1f}s vs {v.wall:.1f}s"
            ),
        )
    ]


def _redis_pid(stack: EmbeddedStack) -> int:
    assert stack.redis is not None and stack.redis.process is not None
    return stack.redis.process.pid


def _baseline_run(stack: EmbeddedStack, celery: Baseline, n: int) -> Sample:
    key = celery.new_counter()

    def work() -> None:
        for i in range(n):
            celery.send_noop(key, f"v{i}")
        celery.wait_count(key, n, _timeout(n))

    return _measured(stack, {"worker": celery.worker.process.pid}, work)


def _vancetope_run(stack: EmbeddedStack, vt: Vancetope, roots: dict[str, int], n: int) -> Sample:
    return _measured(stack, roots, lambda: vt.run_tree(echo_tree("cpu", n, chained=False), _timeout(n)))


def _measured(stack: EmbeddedStack, roots: dict[str, int], work: Callable[[], object]) -> Sample:
    """CPU of each process tree in ``roots``, of this process and of redis-server while ``work``
    runs (and ``SETTLE_S`` after, for the last acks and event flushes)."""
    redis_pid = _redis_pid(stack)
    redis0, procs0 = tree_cpu_s([redis_pid]), _trees(roots)
    started, caller0 = time.perf_counter(), time.process_time()
    work()
    caller = time.process_time() - caller0
    wall = time.perf_counter() - started
    time.sleep(SETTLE_S)
    return Sample(
        processes={name: cpu - procs0[name] for name, cpu in _trees(roots).items()},
        caller=caller,
        redis=tree_cpu_s([redis_pid]) - redis0,
        wall=wall,
    )


def _trees(roots: dict[str, int]) -> dict[str, float]:
    return {name: tree_cpu_s([pid]) for name, pid in roots.items()}


def _median(samples: list[Sample]) -> Sample:
    """The run with the median total (one real run, so its parts add up)."""
    ordered = sorted(samples, key=lambda s: s.total)
    return ordered[len(ordered) // 2]


def _timeout(n: int) -> float:
    return max(60.0, n / 10)


if __name__ == "__main__":
    for row in run(quick=True):
        print(row, f"ratio {row.ratio:.2f} ({row.ratio_formula})")
