"""Fair share of the server pools (issue 26; docs/fair-share.md): five rows.

``interactive_under_batch``: p50 latency (submit -> the store says done) of a one-task ``echo``
tree submitted as a gateway call (priority high by default) by user ``ada``, while a 5,000-task
``echo`` batch of user ``batch`` is queued on the same pool, vs the same call on the idle pool
(goal <= 2x). The stack runs fair share on (``queue_window`` = ``WINDOW``); the default pool is
prefork ``-c 2``. The batch is cancelled once the calls are measured.
``interactive_under_batch (fair share off)`` (no goal): the same with ``queue_window`` 0, the
default, where the call goes ahead of the whole batch queued by its priority step alone.

``throttle_overhead``: throughput of 5,000 independent ``echo`` tasks (quick: 1,000) on a pool
whose ``rate_limit`` (``10000/s``, the most a limit may say) is far above what it can do, vs a pool with none (goal
<= 1.1x). Both pools are of the same stack, ``-c 2`` each, runs alternating.

``fair_share_overhead`` (no goal: what turning fair share on costs, docs/fair-share.md):
throughput of 5,000 independent ``echo`` tasks (quick: 1,000) on a stack with fair share on
(``queue_window`` = ``WINDOW``) vs the same tree on a stack with it off; both stacks up at once,
runs alternating.

``rate_limit_accuracy``: achieved rate / configured over 60 s (quick: 20 s) across two processes
of one pool (``rate_limit = "20/s"``): the achieved rate is read from the store's recorded
start times of ``20/s x seconds`` echo calls, first to last. The row's ratio is configured /
achieved (a rate row): the goal 0.95-1.0 achieved/configured is a ratio in [1.0, 1.053]; a
ratio under 1 (faster than allowed) is named in the notes.
"""

from __future__ import annotations

import contextlib
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.common import BenchError, Child, Row, bench_settings, start_vancetope, wait_until
from bench.rigs import Vancetope, echo_tree, vancetope_connected
from brain.core.models import TaskTree
from brain.stack.children import dies_with_this_process
from brain.stack.embedded import EmbeddedStack, pool_argv, pool_service, stack_env

NAME = "fair_share"
WINDOW = 32
RATE = 20
LIMIT_ABOVE = "10000/s"  # the most a rate limit holds; a -c 2 pool does a few hundred


@contextlib.contextmanager
def fair_stack(root: Path, **settings: Any) -> Iterator[tuple[EmbeddedStack, Vancetope]]:
    """A whole stack (brain, the default pool and any ``pools``) with ``settings``, warmed up."""
    stack = EmbeddedStack(bench_settings(root, **settings), only=())
    try:
        with contextlib.chdir(root):
            stack.start()
        start_vancetope(stack)
        for pool in stack.settings.pools:
            with contextlib.chdir(root):
                stack.start_service(pool_service(pool.name))
        with vancetope_connected(stack) as vt:
            yield stack, vt
    finally:
        stack.stop()


def _one_call(vt: Vancetope) -> float:
    tree = TaskTree.model_validate(
        {"id": "asked", "tasks": [{"id": "one", "tool": "echo", "args": {"value": 1}}]}
    )
    _, _, elapsed = vt.run_tree(tree, 120.0, user="ada", gateway_call=True)
    return elapsed


def interactive_under_batch(quick: bool, window: int = WINDOW) -> Row:
    """``interactive_under_batch`` with fair share on (``window``), or its row with fair share
    off (0, the default), where the call goes ahead of the queued batch by its priority step
    alone (docs/fair-share.md, "Priorities")."""
    calls = 7 if quick else 21
    with (
        tempfile.TemporaryDirectory(prefix="vancetope-bench-") as tmp,
        fair_stack(Path(tmp), queue_window=window) as (_, vt),
    ):
        idle = statistics.median(_one_call(vt) for _ in range(calls))
        batch = vt.brain.scheduler.submit(echo_tree("batch", 5000, chained=False), user="batch")
        store = vt.brain.store
        wait_until(lambda: len(store.task_states(batch.tree_id)) == 5000, 60.0, "the batch recorded")
        busy = []
        for _ in range(calls):
            busy.append(_one_call(vt))
        left = sum(1 for t in store.get_tasks(batch.tree_id) if t.state.value != "done")
        vt.brain.sweeps.cancel(batch.tree_id)
        if left < WINDOW:
            raise BenchError(f"the batch had only {left} calls left: it no longer stood in the way")
    if window:
        benchmark, goal = "interactive_under_batch", 2.0
        setup = (
            f"one-task echo gateway call (high) of user ada, {calls} in a row; a 5,000-task echo batch "
            f"of user batch queued (queue_window {window}, prefork -c 2)"
        )
    else:
        benchmark, goal = "interactive_under_batch (fair share off)", None
        setup = (
            "as interactive_under_batch with queue_window 0 (the default): the whole batch in the pool's "
            "queue, the call on its first priority step"
        )
    return Row(
        benchmark=benchmark,
        metric="s (p50)",
        baseline=idle,
        vancetope=statistics.median(busy),
        kind="latency",
        baseline_label="the same call on the idle pool",
        goal=goal,
        extra={"calls": calls, "batch_left": left, "queue_window": window},
        notes=f"{setup}; {left:,} of the batch left after the last call; worst {max(busy):.3f}s",
    )


def throttle_overhead(quick: bool) -> Row:
    n = 1000 if quick else 5000
    pools = [{"name": "limited", "concurrency": 2, "rate_limit": LIMIT_ABOVE}]
    with (
        tempfile.TemporaryDirectory(prefix="vancetope-bench-") as tmp,
        fair_stack(Path(tmp), pools=pools) as (
            _,
            vt,
        ),
    ):
        free = echo_tree("free", n, chained=False)
        limited = TaskTree.model_validate({**free.model_dump(), "id": "limited", "pool": "limited"})
        free_s, limited_s = _alternating((vt, free), (vt, limited), quick)
    return Row(
        benchmark="throttle_overhead",
        metric="tasks/s",
        baseline=n / free_s,
        vancetope=n / limited_s,
        kind="throughput",
        baseline_label="the same tree on a pool with no limit",
        goal=1.1,
        extra={"n": n},
        notes=(
            f"N = {n:,}{' (quick size)' if quick else ', median of 3'}; pool rate_limit {LIMIT_ABOVE} "
            f"(every call through the gate), both pools prefork -c 2, end to end {free_s:.2f}s vs {limited_s:.2f}s"
        ),
    )


def _alternating(
    a: tuple[Vancetope, TaskTree], b: tuple[Vancetope, TaskTree], quick: bool
) -> tuple[float, float]:
    """Median seconds of tree ``a`` and of tree ``b`` (each on its stack), run by turns:
    once (quick), else three times."""
    runs = []
    for _ in range(1 if quick else 3):
        runs.append(tuple(vt.run_tree(tree, max(60.0, len(tree.tasks) / 10))[2] for vt, tree in (a, b)))
    return statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)


def fair_share_overhead(quick: bool) -> Row:
    n = 1000 if quick else 5000
    with (
        tempfile.TemporaryDirectory(prefix="vancetope-bench-") as off_dir,
        tempfile.TemporaryDirectory(prefix="vancetope-bench-") as on_dir,
        fair_stack(Path(off_dir)) as (_, off),
        fair_stack(Path(on_dir), queue_window=WINDOW) as (_, on),
    ):
        off_s, on_s = _alternating(
            (off, echo_tree("off", n, chained=False)), (on, echo_tree("on", n, chained=False)), quick
        )
    return Row(
        benchmark="fair_share_overhead",
        metric="tasks/s",
        baseline=n / off_s,
        vancetope=n / on_s,
        kind="throughput",
        baseline_label="the same tree with fair share off (queue_window 0)",
        extra={"n": n, "queue_window": WINDOW},
        notes=(
            f"N = {n:,}{' (quick size)' if quick else ', median of 3'}; queue_window {WINDOW} vs 0, "
            f"two stacks (prefork -c 2 each), end to end {off_s:.2f}s vs {on_s:.2f}s"
        ),
    )


def rate_limit_accuracy(quick: bool) -> Row:
    seconds = 20 if quick else 60
    n = RATE * seconds + 1
    pools = [{"name": "rated", "concurrency": 2, "rate_limit": f"{RATE}/s"}]
    with (
        tempfile.TemporaryDirectory(prefix="vancetope-bench-") as tmp,
        fair_stack(Path(tmp), pools=pools) as (
            stack,
            vt,
        ),
    ):
        argv = [
            ("server-rated2@%h" if a == "server-rated@%h" else a) for a in pool_argv(stack.settings, "rated")
        ]
        second = Child.start(
            "server-rated-2",
            dies_with_this_process(argv),
            stack_env(stack.settings, stack.service_url(pool_service("rated"))),
            stack.settings.data_dir / "logs" / "server-rated-2.log",
            cwd=Path(tmp),
        )
        try:
            time.sleep(3.0)  # both processes consuming before the first call
            tree = TaskTree.model_validate(
                {**echo_tree("rated", n, chained=False).model_dump(), "pool": "rated"}
            )
            rec, _, _ = vt.run_tree(tree, seconds * 3 + 60)
            starts = sorted(t.started_at for t in vt.brain.store.get_tasks(rec.tree_id) if t.started_at)
            workers = {t.worker for t in vt.brain.store.get_tasks(rec.tree_id)}
        finally:
            second.stop()
    achieved = (len(starts) - 1) / (starts[-1] - starts[0])
    return Row(
        benchmark="rate_limit_accuracy",
        metric="calls/s",
        baseline=float(RATE),
        vancetope=achieved,
        kind="throughput",
        baseline_label=f"the configured rate_limit {RATE}/s",
        goal=round(1 / 0.95, 3),
        extra={"n": n, "workers": len(workers)},
        notes=(
            f"{n:,} echo calls over {seconds}s, two processes of the pool ({len(workers)} workers ran calls); "
            f"achieved/configured {achieved / RATE:.3f}"
            + (" (over the limit: a miss though the ratio reads met)" if achieved > RATE * 1.01 else "")
        ),
    )


def run(quick: bool = False) -> list[Row]:
    return [
        interactive_under_batch(quick),
        interactive_under_batch(quick, window=0),
        rate_limit_accuracy(quick),
        throttle_overhead(quick),
        fair_share_overhead(quick),
    ]


if __name__ == "__main__":
    for row in run(quick=True):
        print(row, f"ratio {row.ratio:.2f} ({row.ratio_formula})")
