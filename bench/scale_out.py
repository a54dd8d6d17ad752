"""Brain scale-out: a tree of client tasks, whose results all go through a brain's relay,
with two brain processes vs one: how the results split between them, and the brains'
CPU-seconds per result.

Since server workers record their own results (brain/runtime/recorder.py), a tree of server
tasks barely touches the brain, so it could show nothing. A client's result still comes back
only through a brain: the agent pushes it to its outbox, and a brain's relay
(brain/runtime/relay.py) pops it, records it and advances the tree. So the tree here is
N independent ``read_local_file`` tasks (quick 300, full 2,000) of an interactive session
of the stack's own connected agent (``bench-laptop``, threads ``-c 2``, as in
bench/client_rt.py), submitted from this process.

One brain: the stack's (``-P solo``). Two: the same argv as the stack's brain with its own
node name (``brain2@%h``), the brain's Redis user, the same SQLite store file, started
beside it. Two brains at once are safe by design: every state change is a compare-and-set
in the store, and each outbox message is popped by one relay only.

Shares: which brain recorded each result is read from Flower's ``task-succeeded`` event that
the recording brain sends for a client's call (brain/runtime/events.py, ``ClientEvents``):
Celery's event dispatcher stamps it with the sending process's pid. A receiver in this
process counts them per pid (every run must count exactly N).

CPU: each brain's process tree from ``/proc`` (bench/proc_cpu.py), read before submit and
0.5 s after the tree is done. Ratio = brains' CPU-seconds per result with two brains /
with one (goal <= 1.15: a second brain must not add much work of its own). The row keeps
the time per tree in its notes. Median of 2 trees per side (quick: 1), the one-brain
trees first, each side after an untimed warm-up tree.
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from celery import Celery

from bench.client_rt import CLIENT_ID, client_stack
from bench.common import BenchError, Child, Row, service_pid, wait_until
from bench.proc_cpu import tree_cpu_s
from bench.rigs import Vancetope, vancetope_connected
from brain.core.models import SessionKind, TaskTree
from brain.runtime.events import agent_hostname
from brain.stack.children import dies_with_this_process
from brain.stack.embedded import EmbeddedStack, brain_argv, stack_env

NAME = "brain_scale_out"
GOAL = 1.15
SHARE_RANGE = (0.35, 0.65)
SETTLE_S = 0.5


@dataclass(frozen=True)
class TreeRun:
    """One tree: seconds submit -> done, and per brain pid its CPU-seconds and results."""

    seconds: float
    cpu: dict[int, float]
    results: dict[int, int]

    @property
    def cpu_per_result(self) -> float:
        return sum(self.cpu.values()) / max(1, sum(self.results.values()))


class RecordedResults:
    """Counts the brains' ``task-succeeded`` / ``task-failed`` events of the agent's calls, per
    sending pid, with a Celery event receiver in a thread of this process."""

    def __init__(self, broker_url: str, client_id: str = CLIENT_ID) -> None:
        self.app = Celery("bench-scale-out-events", broker=broker_url, set_as_current=False)
        self.hostname = agent_hostname(client_id)
        self.ok: Counter[int] = Counter()
        self.failed: Counter[int] = Counter()
        self._lock = threading.Lock()
        self._receiver: Any = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-events", daemon=True)

    def _on(self, into: Counter[int]) -> Any:
        def handler(event: dict[str, Any]) -> None:
            if event.get("hostname") == self.hostname:
                with self._lock:
                    into[int(event["pid"])] += 1

        return handler

    def _run(self) -> None:
        with self.app.connection_for_read() as conn:
            receiver = self._receiver = self.app.events.Receiver(
                conn, handlers={"task-succeeded": self._on(self.ok), "task-failed": self._on(self.failed)}
            )
            receiver.on_consume_ready = lambda *_a, **_k: self._ready.set()
            receiver.capture(limit=None, timeout=None, wakeup=False)

    def snapshot(self) -> tuple[Counter[int], Counter[int]]:
        with self._lock:
            return Counter(self.ok), Counter(self.failed)

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(30.0):
            raise BenchError("the event receiver did not start")
        # kombu subscribes to the events' channel on the consumer's first poll, just after.
        time.sleep(0.5)

    def stop(self) -> None:
        if self._receiver is not None:
            self._receiver.should_stop = True
        self._thread.join(5.0)
        self.app.close()


@contextmanager
def recorded_results(broker_url: str, client_id: str = CLIENT_ID) -> Iterator[RecordedResults]:
    """Counts the results of ``client_id``'s calls per recording brain (tests/integration/test_two_brains.py too)."""
    counter = RecordedResults(broker_url, client_id)
    counter.start()
    try:
        yield counter
    finally:
        counter.stop()


def client_tree(tree_id: str, n: int) -> TaskTree:
    """``n`` independent reads of the agent's sandbox file."""
    tasks = [{"id": f"t{i}", "tool": "read_local_file", "args": {"path": "notes.txt"}} for i in range(n)]
    return TaskTree.model_validate({"id": tree_id, "tasks": tasks})


def run(quick: bool = False) -> list[Row]:
    n = 300 if quick else 2000
    reps = 1 if quick else 2
    one: list[TreeRun] = []
    two: list[TreeRun] = []
    with (
        tempfile.TemporaryDirectory(prefix="vancetope-bench-") as tmp,
        client_stack(Path(tmp)) as stack,
        vancetope_connected(stack) as vt,
        recorded_results(stack.redis_url) as counter,
    ):
        brain1 = service_pid(stack, "brain")
        # Untimed: warms the agent and the relay, and proves the receiver is listening.
        _tree(vt, counter, [brain1], "warm-one", 20, warm_up=True)
        for _ in range(reps):
            one.append(_tree(vt, counter, [brain1], "scale-one", n))
        with second_brain(stack, Path(tmp)) as brain2:
            _tree(vt, counter, [brain1, brain2], "warm-two", 50, warm_up=True)
            for _ in range(reps):
                two.append(_tree(vt, counter, [brain1, brain2], "scale-two", n))
    return [_row(n, reps, quick, brain1, brain2, one, two)]


def _row(
    n: int, reps: int, quick: bool, brain1: int, brain2: int, one: list[TreeRun], two: list[TreeRun]
) -> Row:
    one_cpu = statistics.median(r.cpu_per_result for r in one)
    two_cpu = statistics.median(r.cpu_per_result for r in two)
    total = sum(sum(r.results.values()) for r in two)
    share1 = sum(r.results.get(brain1, 0) for r in two) / total
    share2 = sum(r.results.get(brain2, 0) for r in two) / total
    cpu_each = [
        sum(r.cpu[pid] for r in two) / max(1, sum(r.results.get(pid, 0) for r in two)) * 1000
        for pid in (brain1, brain2)
    ]
    low, high = SHARE_RANGE
    shares_met = all(low <= s <= high for s in (share1, share2))
    one_s, two_s = statistics.median(r.seconds for r in one), statistics.median(r.seconds for r in two)
    return Row(
        benchmark=NAME,
        metric="brain CPU ms/result",
        baseline=one_cpu * 1000,
        vancetope=two_cpu * 1000,
        kind="latency",
        baseline_label="the same client tree with one brain process",
        goal=GOAL,
        extra={
            "n": n,
            "share_brain_1": share1,
            "share_brain_2": share2,
            "shares_met": shares_met,
            "one_brain_s": one_s,
            "two_brains_s": two_s,
        },
        notes=(
            f"a tree of {n:,} client tasks (read_local_file on the stack's agent, -c 2)"
            f"{' (quick size; full: 2,000)' if quick else ''}, "
            f"{'median of ' + str(reps) + ' trees per side' if reps > 1 else 'one tree per side'}; "
            f"with two brains they recorded {share1:.0%} / {share2:.0%} of the results "
            f"(goal {low:.0%}–{high:.0%} each: {'met' if shares_met else 'missed'}), "
            f"{cpu_each[0]:.2f} / {cpu_each[1]:.2f} CPU ms per result of their own; "
            f"time per tree {one_s:.2f}s with one brain, {two_s:.2f}s with two "
            f"({n / one_s:.0f} vs {n / two_s:.0f} results/s)"
        ),
    )


@contextmanager
def second_brain(stack: EmbeddedStack, cwd: Path) -> Iterator[int]:
    """A second brain process, the stack's brain's argv under its own node name; its pid."""
    argv = brain_argv("brain2@%h")
    log_path = stack.settings.data_dir / "logs" / "brain-2.log"
    brain2 = Child.start(
        "brain-2",
        dies_with_this_process(argv),
        stack_env(stack.settings, stack.service_url("brain")),
        log_path,
        cwd=cwd,
    )
    try:

        def ready() -> bool:
            if not brain2.alive():
                raise BenchError(f"the second brain exited\n{brain2.log_tail()}")
            return "brain ready" in log_path.read_text(errors="replace")

        wait_until(ready, 60.0, "the second brain", interval=0.1, on_timeout=brain2.log_tail)
        time.sleep(1.0)  # let its relay start polling
        yield brain2.process.pid
    finally:
        brain2.stop()


def _tree(
    vt: Vancetope, counter: RecordedResults, brains: list[int], tree_id: str, n: int, warm_up: bool = False
) -> TreeRun:
    """One tree of ``n`` client tasks; a measured one must count exactly ``n`` events."""
    ok0, failed0 = counter.snapshot()
    cpu0 = {pid: tree_cpu_s([pid]) for pid in brains}
    _, _, seconds = vt.run_tree(
        client_tree(tree_id, n), max(120.0, n / 5), session=SessionKind.INTERACTIVE, client_id=CLIENT_ID
    )
    time.sleep(SETTLE_S)
    cpu = {pid: tree_cpu_s([pid]) - cpu0[pid] for pid in brains}
    if warm_up:
        return TreeRun(seconds, cpu, {})

    def counted() -> Counter[int] | None:
        ok, failed = counter.snapshot()
        if failed - failed0:
            raise BenchError(f"the brains sent task-failed events for {dict(failed - failed0)}")
        got = ok - ok0
        return got if sum(got.values()) >= n else None

    got = wait_until(
        counted,
        10.0,
        f"{n} task-succeeded events of tree {tree_id}",
        on_timeout=lambda: f"counted {dict(counter.snapshot()[0] - ok0)}",
    )
    assert got is not None
    strangers = set(got) - set(brains)
    if strangers or sum(got.values()) != n:
        raise BenchError(f"tree {tree_id}: {n} results, events counted per pid {dict(got)} (brains {brains})")
    return TreeRun(seconds, cpu, {pid: got.get(pid, 0) for pid in brains})


if __name__ == "__main__":
    for row in run(quick=True):
        print(row, f"ratio {row.ratio:.2f}")
