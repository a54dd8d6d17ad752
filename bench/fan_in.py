"""Fan-in: 1,000 tasks feeding one task, a Celery chord vs one Vancetope tree.

Baseline: a Celery ``chord`` of 1,000 ``bench.member`` tasks (each returns its value)
and a ``bench.fan_in`` body that receives the list of their results and ``INCR``s a
counter the producer polls every 5 ms. Celery's Redis result backend on the same
redis-server keeps the chord's results and its counter (native Redis chord support).
Worker: prefork ``-c 2``, the same pool as Vancetope's server pool. Time: first header
task sent -> counter == 1.

Vancetope: one tree of 1,000 independent ``echo`` tasks and a ``join`` echo that
``depends_on`` all of them and takes their results as its argument (a list of 1,000
``${tasks.t<i>.result}`` references), so it is fed as the chord body is. Time: submit()
called -> the store says the tree is done.

Sides alternate; the median of 3 (quick: 1 round at 200 tasks) is reported.
"""

from __future__ import annotations

import gc
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from celery import chord

from bench import celery_baseline
from bench.common import Row, redis_only_stack, span
from bench.rigs import baseline_on, vancetope_on
from brain.core.models import TaskTree

NAME = "fan_in_1000"
QUEUE = "bench-chord"
GOAL = 1.0


def fan_in_tree(n: int) -> TaskTree:
    tasks: list[dict[str, Any]] = [
        {"id": f"t{i}", "tool": "echo", "args": {"value": f"v{i}"}} for i in range(n)
    ]
    tasks.append(
        {
            "id": "join",
            "tool": "echo",
            "depends_on": [f"t{i}" for i in range(n)],
            "args": {"value": [f"${{tasks.t{i}.result}}" for i in range(n)]},
        }
    )
    return TaskTree.model_validate({"id": "fan-in", "tasks": tasks})


def run(quick: bool = False) -> list[Row]:
    n = 200 if quick else 1000
    reps = 1 if quick else 3
    timeout = max(120.0, n / 5)
    base_s: list[float] = []
    vt_s: list[float] = []
    with (
        tempfile.TemporaryDirectory(prefix="vancetope-bench-") as tmp,
        redis_only_stack(Path(tmp)) as stack,
        baseline_on(stack, queue=QUEUE, result_backend=True) as celery,
        vancetope_on(stack) as vt,
    ):
        for _ in range(reps):
            key = celery.new_counter()
            header = [
                celery.app.signature(celery_baseline.MEMBER_TASK, args=[f"v{i}"], queue=QUEUE)
                for i in range(n)
            ]
            body = celery.app.signature(celery_baseline.FAN_IN_TASK, args=[key], queue=QUEUE)
            started = time.perf_counter()
            result = chord(header, app=celery.app)(body)
            celery.wait_count(key, 1, timeout)
            base_s.append(time.perf_counter() - started)
            # Dropped while Redis is up: their __del__ unsubscribes from the backend (else the
            # producer retries for ~20 s at exit, after redis-server is gone).
            for res in [result, *(result.parent.results if result.parent is not None else [])]:
                celery.app.backend.result_consumer.cancel_for(res.id)
            del result
            gc.collect()
            _, _, elapsed = vt.run_tree(fan_in_tree(n), timeout)
            vt_s.append(elapsed)
    base, vancetope = statistics.median(base_s), statistics.median(vt_s)
    return [
        Row(
            benchmark=NAME,
            metric="s per fan-in",
            baseline=base,
            vancetope=vancetope,
            kind="latency",
            baseline_label="Celery chord, Redis result backend, prefork -c 2",
            goal=GOAL,
            extra={"n": n},
            notes=(
                f"{n:,} tasks -> 1{' (quick size; full: 1,000)' if quick else ''}; "
                f"{'median of ' + str(reps) + ': ' if reps > 1 else ''}"
                f"chord {span(base_s)}s, Vancetope {span(vt_s)}s; the join task takes all {n:,} results"
            ),
        )
    ]


if __name__ == "__main__":
    for row in run(quick=True):
        print(row, f"ratio {row.ratio:.2f}")
