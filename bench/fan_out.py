"""Fan-out: a task's list of 1,000 items, one task per item, one task reading all results.

Baseline: a Celery task (``bench.fan_out``) is sent the list and, from the worker, sends a
``group`` of one ``bench.member`` per item (each returns its item) followed by a chord
callback, ``bench.fan_in``, which gets the list of their results and ``INCR``s a counter
the producer polls every 5 ms. Celery's Redis result backend on the same redis-server keeps
the results and the chord's counter. That is how plain Celery fans out over what a task
holds (the group can only be built once the list exists), and it sends what Vancetope sends:
one task that has the list, 1,000 item tasks, one callback. Worker: prefork ``-c 2``, the
same pool as Vancetope's server pool. Time: ``bench.fan_out`` sent -> counter == 1.
For context only (notes and JSON, not the ratio): the same group and chord callback sent by
the producer, which knows the list up front (``fan_in_1000``'s baseline with 1,000 items) -
what a Celery user would write if the list did not come from a task.

Vancetope: one tree of three tasks, ``list`` (an ``echo`` returning the 1,000 items),
``each`` (``for_each: ${tasks.list.result}``, an ``echo`` of ``${item}``: made into
``each[0]`` … ``each[999]`` when ``list`` is done, brain.core.fanout) and ``all`` (an echo of
``${tasks.each.results}``). Time: submit() called -> the store says the tree is done. After
each timed run (not timed) the row checks that ``each`` fanned out over every item and that
``all`` got all 1,000 results in the list's order, and splits the run from the store's
timestamps: list done -> last item queued (the fan-out), first item queued -> last item
done (the items), last item done -> ``all`` done (the gather).

All sides run one untimed round at 10 items first (chord and fan-out code paths warm);
then the sides alternate and the median of 3 (quick: 1 round at 200 items) is reported.
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
from bench.common import BenchError, Row, redis_only_stack, span
from bench.rigs import Baseline, Vancetope, baseline_on, vancetope_on
from brain.core.models import TaskRecord, TaskState, TaskTree

NAME = "fan_out_1000"
QUEUE = "bench-fan-out"
GOAL = 1.2
WARMUP_ITEMS = 10


def fan_out_tree(n: int) -> TaskTree:
    return TaskTree.model_validate(
        {
            "id": "fan",
            "tasks": [
                {"id": "list", "tool": "echo", "args": {"value": list(range(n))}},
                {
                    "id": "each",
                    "tool": "echo",
                    "depends_on": ["list"],
                    "for_each": "${tasks.list.result}",
                    "args": {"value": "${item}"},
                },
                {
                    "id": "all",
                    "tool": "echo",
                    "depends_on": ["each"],
                    "args": {"value": "${tasks.each.results}"},
                },
            ],
        }
    )


def run_celery(celery: Baseline, n: int, timeout: float) -> float:
    """Seconds from sending ``bench.fan_out`` with ``n`` items to the chord callback's count."""
    key = celery.new_counter()
    started = time.perf_counter()
    # ignore_result: the producer does not subscribe to the fan-out task's result channel.
    celery.app.send_task(
        celery_baseline.FAN_OUT_TASK, args=[list(range(n)), key, QUEUE], queue=QUEUE, ignore_result=True
    )
    celery.wait_count(key, 1, timeout)
    return time.perf_counter() - started


def run_celery_from_producer(celery: Baseline, n: int, timeout: float) -> float:
    """Context: the same group and chord callback sent by the producer (as ``fan_in_1000``)."""
    key = celery.new_counter()
    header = [celery.app.signature(celery_baseline.MEMBER_TASK, args=[i], queue=QUEUE) for i in range(n)]
    body = celery.app.signature(celery_baseline.FAN_IN_TASK, args=[key], queue=QUEUE)
    started = time.perf_counter()
    result = chord(header, app=celery.app)(body)
    celery.wait_count(key, 1, timeout)
    elapsed = time.perf_counter() - started
    # Dropped while Redis is up (see fan_in.py): else the producer retries for ~20 s at exit.
    for res in [result, *(result.parent.results if result.parent is not None else [])]:
        celery.app.backend.result_consumer.cancel_for(res.id)
    del result
    gc.collect()
    return elapsed


def run_vancetope(vt: Vancetope, n: int, timeout: float) -> tuple[float, dict[str, float]]:
    """Seconds from submit() to the tree done, and the run's phases (checked: every item, in order)."""
    rec, _, elapsed = vt.run_tree(fan_out_tree(n), timeout)
    return elapsed, phases(vt.brain.store.get_tasks(rec.tree_id), n)


PHASES = ("fan-out", "items", "gather")


def phases(records: list[TaskRecord], n: int) -> dict[str, float]:
    """Check the finished tree (BenchError if an item is missing or a result out of order) and
    split it, from the store's timestamps, in seconds:

    - fan-out: ``list`` finished -> the last item queued (its result recorded, the list read,
      1,000 item records written and their runs sent);
    - items: the first item queued -> the last one finished;
    - gather: the last item finished -> ``all`` finished (``each`` ends done with the items'
      results, ``all`` is sent with them and runs).
    """
    by_id = {r.task_id: r for r in records}
    items = [r for r in records if r.parent == "each"]
    each, last = by_id["each"], by_id["all"]
    wrong: list[str] = []
    if each.fan_out != n or len(items) != n:
        wrong.append(
            f"each fanned out over {each.fan_out} items, {len(items)} item tasks recorded (want {n})"
        )
    not_done = [r.task_id for r in items if r.state is not TaskState.DONE]
    if not_done:
        wrong.append(f"{len(not_done)} items not done: {not_done[:5]}")
    if last.result != list(range(n)):
        got = last.result if not isinstance(last.result, list) else f"a list of {len(last.result)}"
        wrong.append(f"all got {got!r}, not the {n} items' results in order")
    if wrong:
        raise BenchError("fan-out ended done but wrong: " + "; ".join(wrong))
    stamps = [(r.queued_at, r.finished_at) for r in items]
    queued = [q for q, _ in stamps if q is not None]
    finished = [f for _, f in stamps if f is not None]
    list_done, all_done = by_id["list"].finished_at, last.finished_at
    if not queued or not finished or list_done is None or all_done is None:
        return {}
    return {
        "fan-out": max(queued) - list_done,
        "items": max(finished) - min(queued),
        "gather": all_done - max(finished),
    }


def run(quick: bool = False) -> list[Row]:
    n = 200 if quick else 1000
    reps = 1 if quick else 3
    timeout = max(120.0, n / 5)
    base_s: list[float] = []
    producer_s: list[float] = []
    vt_s: list[float] = []
    splits: list[dict[str, float]] = []
    with (
        tempfile.TemporaryDirectory(prefix="vancetope-bench-") as tmp,
        redis_only_stack(Path(tmp)) as stack,
        baseline_on(stack, queue=QUEUE, result_backend=True) as celery,
        vancetope_on(stack) as vt,
    ):
        run_celery(celery, WARMUP_ITEMS, timeout)
        run_celery_from_producer(celery, WARMUP_ITEMS, timeout)
        run_vancetope(vt, WARMUP_ITEMS, timeout)
        # Alternate the sides, so a burst of other load on the machine hits both alike.
        for _ in range(reps):
            base_s.append(run_celery(celery, n, timeout))
            producer_s.append(run_celery_from_producer(celery, n, timeout))
            elapsed, split = run_vancetope(vt, n, timeout)
            vt_s.append(elapsed)
            splits.append(split)
    base, vancetope = statistics.median(base_s), statistics.median(vt_s)
    split_note = ", ".join(
        f"{k} {statistics.median(s[k] for s in splits):.2f}" for k in PHASES if all(k in s for s in splits)
    )
    from_producer = statistics.median(producer_s)
    extra: dict[str, Any] = {"n": n, "baseline_from_producer": from_producer}
    return [
        Row(
            benchmark=NAME,
            metric="s per fan-out",
            baseline=base,
            vancetope=vancetope,
            kind="latency",
            baseline_label="Celery group + chord callback sent by a task holding the list, Redis result backend, prefork -c 2",
            goal=GOAL,
            extra=extra,
            notes=(
                f"a list of {n:,} -> {n:,} echo tasks -> 1 task reading all results"
                f"{' (quick size; full: 1,000)' if quick else ''}; "
                f"{'median of ' + str(reps) + ': ' if reps > 1 else ''}"
                f"Celery {span(base_s)}s, Vancetope {span(vt_s)}s; every run checked: {n:,} items, "
                f"results in order. Vancetope, median s: {split_note}. Context, not the ratio: "
                f"the same chord sent by the producer, list known up front, {from_producer:.2f}s "
                f"({vancetope / from_producer:.2f}×)"
            ),
        )
    ]


if __name__ == "__main__":
    for row in run(quick=True):
        print(row, f"ratio {row.ratio:.2f}")
