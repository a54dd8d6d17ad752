"""Chain latency: M dependent tasks one after the other, per-hop milliseconds.

Baseline: plain Celery where each task's completion sends the next one from inside
the worker (``bench.hop`` calls ``send_task`` for link i+1; the last link ``INCR``s a
counter the producer polls every 5 ms). No client ``delay().get()`` loop: the worker-
side hand-off is the cheapest plain-Celery chain and needs no result backend.

Vancetope: one tree of M ``echo`` tasks, task i ``depends_on`` task i-1 and takes its
result as its argument (``${tasks.t<i-1>.result}``). Each hop is: the server worker runs
the echo, records the result itself (a compare-and-set in the store, ``brain.runtime.recorder``),
finds the dependent ready, writes its queued state and sends its ``run_tool`` job. So a
Vancetope hop is one Celery message, like the baseline's, plus three store round trips
(record, read the dependent, queue it) and two Redis scripts (start the run, clear its mark).

Per-hop = total / M; the sides take turns, ``reps`` chains each, and the median is
reported. Both sides' workers are up throughout (idle ones only wait in BRPOP).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from bench.common import Row, redis_only_stack
from bench.rigs import baseline_on, echo_tree, vancetope_on
from brain.core.models import TaskRecord

NAME = "chain"


def run(quick: bool = False) -> list[Row]:
    m = 20 if quick else 50
    reps = 3 if quick else 5
    timeout = 60.0
    base_hops: list[float] = []
    vt_hops: list[float] = []
    phases: list[dict[str, float]] = []
    with (
        tempfile.TemporaryDirectory(prefix="vancetope-bench-") as tmp,
        redis_only_stack(Path(tmp)) as stack,
        baseline_on(stack) as base,
        vancetope_on(stack) as vt,
    ):
        # Alternate the sides, so a burst of other load on the machine hits both alike.
        for _ in range(reps):
            key = base.new_counter()
            started = time.perf_counter()
            base.send_hop(key, m, "v")
            base.wait_count(key, 1, timeout)
            base_hops.append((time.perf_counter() - started) / m)
            rec, _, elapsed = vt.run_tree(echo_tree("chain", m, chained=True), timeout)
            vt_hops.append(elapsed / m)
            phases.append(hop_phases(vt.brain.store.get_tasks(rec.tree_id)))
    base_ms = statistics.median(base_hops) * 1000
    vt_ms = statistics.median(vt_hops) * 1000
    return [
        Row(
            benchmark=NAME,
            metric="ms per hop",
            baseline=base_ms,
            vancetope=vt_ms,
            kind="latency",
            baseline_label="plain Celery, task sends the next",
            goal=1.3,
            extra={"n": m},
            notes=(
                f"{m}-task chain{' (quick size; full: 50)' if quick else ''}, median of {reps} chains; baseline hops {_span(base_hops)} ms, "
                f"Vancetope {_span(vt_hops)} ms. Vancetope hop, median ms: "
                + ", ".join(f"{k} {statistics.median(p[k] for p in phases):.1f}" for k in PHASES)
            ),
        )
    ]


PHASES = ("queued->started", "run", "finished->next queued")


def hop_phases(records: list[TaskRecord]) -> dict[str, float]:
    """Where a Vancetope hop's time goes, from the timestamps the store keeps (median ms):

    - queued->started: the brain's store write, ``send_task``, Redis, the worker's
      pickup, its pre-checks (cancelled? delivery count, running mark);
    - run: the echo itself inside ``execute`` (argument schema check included);
    - finished->next queued: in the same worker, the result's compare-and-set, the
      dependent's readiness check and its queued write (``brain.runtime.recorder``).
    """
    by_id = {r.task_id: r for r in records}
    chain = [by_id[f"t{i}"] for i in range(len(by_id))]
    samples: dict[str, list[float]] = {k: [] for k in PHASES}
    for prev, cur in zip([None, *chain], chain, strict=False):
        if cur.queued_at is None or cur.started_at is None or cur.finished_at is None:
            continue
        samples["queued->started"].append(cur.started_at - cur.queued_at)
        samples["run"].append(cur.finished_at - cur.started_at)
        if prev is not None and prev.finished_at is not None:
            samples["finished->next queued"].append(cur.queued_at - prev.finished_at)
    return {k: statistics.median(v) * 1000 for k, v in samples.items() if v}


def _span(hops: list[float]) -> str:
    return f"{min(hops) * 1000:.2f}–{max(hops) * 1000:.2f}"


if __name__ == "__main__":
    for row in run(quick=True):
        print(row, f"ratio {row.ratio:.2f} ({row.ratio_formula})")
