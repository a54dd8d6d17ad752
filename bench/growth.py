"""Dispatch growth: does a task cost more when its tree is bigger? And the brain's memory.

``dispatch_growth``: the per-task cost (submit() called -> the store says the tree is
done, divided by N) of one tree of N independent ``echo`` tasks at N = 10,000 (quick:
2,000) against the same at N = 100 (median of 3), same stack, same run. Plain Celery's
per-task cost does not depend on N; the goal is that Vancetope's grows by at most 20 %.

``brain_rss_10000_in_flight`` (no goal): the brain worker's resident memory (VmRSS of
the ``-P solo`` process, sampled every 0.2 s) at its peak while the big tree runs,
against the same process idle just before it was submitted.
"""

from __future__ import annotations

import statistics
import tempfile
import threading
from pathlib import Path
from typing import Self

from bench.common import Row, redis_only_stack, service_pid
from bench.rigs import echo_tree, vancetope_on

SMALL = 100
BIG, BIG_QUICK = 10_000, 2_000
GOAL = 1.2


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class PeakRss:
    """Sample a process's RSS in a thread until stopped; keep the peak."""

    def __init__(self, pid: int, interval: float = 0.2) -> None:
        self.pid, self.interval = pid, interval
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, rss_mb(self.pid))
            except OSError:
                return
            self._stop.wait(self.interval)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


def run(quick: bool = False) -> list[Row]:
    big = BIG_QUICK if quick else BIG
    with (
        tempfile.TemporaryDirectory(prefix="vancetope-bench-") as tmp,
        redis_only_stack(Path(tmp)) as stack,
        vancetope_on(stack) as vt,
    ):
        small_runs = []
        for _ in range(3):
            _, _, elapsed = vt.run_tree(echo_tree("growth-small", SMALL, chained=False), 60.0)
            small_runs.append(elapsed)
        small_s = statistics.median(small_runs)
        brain_pid = service_pid(stack, "brain")
        idle_mb = rss_mb(brain_pid)
        with PeakRss(brain_pid) as rss:
            _, submit_s, big_s = vt.run_tree(echo_tree("growth-big", big, chained=False), max(600.0, big / 5))
    small_ms, big_ms = small_s / SMALL * 1000, big_s / big * 1000
    size_note = f" (quick size; full: {BIG:,})" if quick else ""
    return [
        Row(
            benchmark="dispatch_growth",
            metric="ms per task",
            baseline=small_ms,
            vancetope=big_ms,
            kind="latency",
            baseline_label=f"Vancetope itself at N = {SMALL}",
            goal=GOAL,
            extra={"n_small": SMALL, "n_big": big},
            notes=(
                f"N = {big:,}{size_note} independent echo tasks in one tree: {big_s:.1f}s "
                f"(submit() alone {submit_s:.1f}s, {big / submit_s:.0f}/s) vs N = {SMALL}: median of 3, "
                f"{small_s:.2f}s ({_span(small_runs)}s)"
            ),
        ),
        Row(
            benchmark="brain_rss_10000_in_flight",
            metric="MB",
            baseline=idle_mb,
            vancetope=rss.peak,
            kind="latency",
            baseline_label="the same brain process idle, before the tree",
            extra={"n": big},
            notes=(
                f"peak VmRSS of the brain worker (-P solo) while one tree of {big:,}{size_note} tasks ran "
                "(sampled every 0.2 s); no goal"
            ),
        ),
    ]


def _span(values: list[float]) -> str:
    return f"{min(values):.2f}–{max(values):.2f}"


if __name__ == "__main__":
    for row in run(quick=True):
        print(row, f"ratio {row.ratio:.2f}")
