"""Throughput: N independent no-op tasks, plain Celery vs one Vancetope tree of N ``echo`` tasks.

Baseline: the producer sends N ``bench.noop`` jobs with ``send_task`` (what
``apply_async`` does underneath) to a prefork ``-c 2`` worker; each job ``INCR``s a
counter that the producer polls every 5 ms. Time: first send -> counter == N.

Vancetope: ``Brain.connect(...).scheduler.submit(tree)`` of one tree with N independent
``echo`` tasks against the embedded stack (brain worker ``-P solo`` + server pool
prefork ``-c 2``). Time: submit() called -> the store says the tree is done. This
includes everything Vancetope adds per task: a store row and a compare-and-set at
dispatch, the worker's hot-state script, the worker recording the result itself (a
compare-and-set, ``brain.runtime.recorder``) and its "is the tree done?" index lookup.

Both sides run on the same redis-server (AOF everysec, as the stack starts it), all
workers up (idle ones only wait in BRPOP), runs alternating baseline / Vancetope so a
burst of other load on the machine hits both alike.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from bench.common import Row, redis_only_stack
from bench.rigs import baseline_on, echo_tree, vancetope_on

NAME = "throughput"


GOAL = 1.25
# Row name (the contract) -> N in the full run and in --quick.
SIZES = {"throughput_500": (500, 500), "throughput_5000": (5000, 1000)}


def run(quick: bool = False) -> list[Row]:
    rows: list[Row] = []
    with (
        tempfile.TemporaryDirectory(prefix="vancetope-bench-") as tmp,
        redis_only_stack(Path(tmp)) as stack,
        baseline_on(stack) as celery,
        vancetope_on(stack) as vt,
    ):
        for name, (full_n, quick_n) in SIZES.items():
            n = quick_n if quick else full_n
            # Median of 3 at full size: a single 5,000-task run on a shared 2-core box varied
            # by +-15 % from run to run, on both sides.
            reps = 1 if quick else 3
            runs: list[tuple[float, float, float, float]] = []
            # Alternate the sides, so a burst of other load on the machine hits both alike.
            for _ in range(reps):
                key = celery.new_counter()
                started = time.perf_counter()
                for i in range(n):
                    celery.send_noop(key, f"v{i}")
                sent = time.perf_counter() - started
                celery.wait_count(key, n, _timeout(n))
                base_s = time.perf_counter() - started
                _, submit_s, vt_s = vt.run_tree(echo_tree("throughput", n, chained=False), _timeout(n))
                runs.append((base_s, sent, vt_s, submit_s))
            base_s, sent, _, _ = sorted(runs)[len(runs) // 2]
            _, _, vt_s, submit_s = sorted(runs, key=lambda r: r[2])[len(runs) // 2]
            rows.append(
                Row(
                    benchmark=name,
                    metric="tasks/s",
                    baseline=n / base_s,
                    vancetope=n / vt_s,
                    kind="throughput",
                    baseline_label="plain Celery, prefork -c 2",
                    goal=GOAL,
                    extra={"n": n},
                    notes=(
                        f"N = {n:,}{' (quick size)' if n != full_n else ''}; "
                        f"{'median of ' + str(reps) + ', ' if reps > 1 else ''}"
                        f"end to end {base_s:.2f}s vs {vt_s:.2f}s; sending alone: baseline {sent:.2f}s "
                        f"({n / sent:.0f}/s), Vancetope submit() {submit_s:.2f}s ({n / submit_s:.0f}/s)"
                    ),
                )
            )
    return rows


def _timeout(n: int) -> float:
    # Generous but bounded: even 10 tasks/s would finish in time.
    return max(60.0, n / 10)


if __name__ == "__main__":
    for row in run(quick=True):
        print(row, f"ratio {row.ratio:.2f} ({row.ratio_formula})")
