"""Brain scale-out: one tree's time with two brain processes consuming queue ``brain`` vs one.

Two brains at once are safe by design (brain/runtime/scheduler.py: every task state change is
a compare-and-set on (state, run_id) in the store, so two brains advancing the same
tree never complete a task or dispatch a dependent twice; brain/worker.py holds no
state but a per-process brain; the tree-spec cache is read-only and a stale status is
harmless). So it is measured: the stack's brain (``-P solo``) alone, then with a
second, identical ``celery -A brain.worker worker -Q brain -P solo`` process beside it
(its own node name, the brain's own Redis user, the same SQLite store file).

Cost ratio = seconds for one tree of N independent ``echo`` tasks with two brains /
with one (goal <= 0.625, i.e. 1.6x the throughput). Every tree must end ``done``; the
notes say how many results the second brain recorded (from its worker log).
Median of 2 trees per side (quick: 1 each, smaller N).

The notes also say how busy the machine's CPUs were during the one-brain trees
(/proc/stat): a second process adds no CPU and takes none of the same work away, so
with the box busy a share ``u`` of the time, two brains cannot take less than ``u`` of
one brain's time - the best this row can show on that box.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.common import BenchError, Child, Row, busy_share, cpu_jiffies, redis_only_stack, wait_until
from bench.rigs import echo_tree, vancetope_on
from brain.stack.embedded import celery_argv, stack_env
from workers.contracts import RECORD_RESULT_TASK

NAME = "brain_scale_out"
GOAL = 0.625


def run(quick: bool = False) -> list[Row]:
    n = 300 if quick else 2000
    reps = 1 if quick else 2
    timeout = max(120.0, n / 5)
    one: list[float] = []
    two: list[float] = []
    with (
        tempfile.TemporaryDirectory(prefix="vancetope-bench-") as tmp,
        redis_only_stack(Path(tmp)) as stack,
        vancetope_on(stack) as vt,
    ):
        before = cpu_jiffies()
        for _ in range(reps):
            one.append(vt.run_tree(echo_tree("scale-one", n, chained=False), timeout)[2])
        busy = busy_share(before, cpu_jiffies())
        log_path = stack.settings.data_dir / "logs" / "brain-2.log"
        argv = celery_argv("brain.worker", "brain", "brain2@%h", "-P", "solo")
        argv[0] = sys.executable
        brain2 = Child.start(
            "brain-2",
            argv,
            stack_env(stack.settings, stack.service_url("brain")),
            log_path,
            cwd=Path(tmp),
        )
        try:

            def ready() -> bool:
                if not brain2.alive():
                    raise BenchError(f"the second brain exited\n{brain2.log_tail()}")
                return "brain ready" in log_path.read_text(errors="replace")

            wait_until(ready, 60.0, "the second brain", interval=0.1, on_timeout=brain2.log_tail)
            time.sleep(1.0)  # let it start consuming
            for _ in range(reps):
                two.append(vt.run_tree(echo_tree("scale-two", n, chained=False), timeout)[2])
        finally:
            brain2.stop()
        handled = sum(
            1
            for line in log_path.read_text(errors="replace").splitlines()
            if f"{RECORD_RESULT_TASK}[" in line and "succeeded" in line
        )
    one_s, two_s = statistics.median(one), statistics.median(two)
    return [
        Row(
            benchmark=NAME,
            metric="s per tree",
            baseline=one_s,
            vancetope=two_s,
            kind="latency",
            baseline_label="the same tree with one brain process",
            goal=GOAL,
            extra={"n": n, "one_brain_cpu_busy": busy},
            notes=(
                f"one tree of {n:,} independent echo tasks{' (quick size; full: 2,000)' if quick else ''}, "
                f"{'median of ' + str(reps) + ' ' if reps > 1 else ''}"
                f"one brain {n / one_s:.0f} tasks/s, two brains {n / two_s:.0f} tasks/s; the 2nd brain's log "
                f"shows {handled:,} of the {reps * n:,} record_result jobs; server pool -c 2, "
                "all on one 2-vCPU box"
                + (
                    f"; the CPUs were {busy:.0%} busy during the one-brain trees, so two brains "
                    f"cannot take less than {busy:.2f} of its time here"
                    if busy is not None
                    else ""
                )
            ),
        )
    ]


if __name__ == "__main__":
    for row in run(quick=True):
        print(row, f"ratio {row.ratio:.2f}")
