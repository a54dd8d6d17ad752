"""The two sides of the Celery benchmarks (throughput, chain): a plain-Celery baseline worker
and a Vancetope brain, both on one embedded stack's redis-server.

Each side is warmed up before it is timed (worker pools forked, connections open,
code imported), so the numbers are steady-state costs, not start-up.
"""

from __future__ import annotations

import sqlite3
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis
from celery import Celery

from bench import celery_baseline
from bench.common import BenchError, Child, child_env, stack_logs, start_vancetope, wait_until
from brain.core.models import TaskTree, TreeRecord, TreeStatus
from brain.runtime.service import Brain
from brain.stack.embedded import EmbeddedStack
from workers.contracts import channel_tree_events

WARMUP_TIMEOUT_S = 60.0


class Baseline:
    """Plain Celery on the stack's Redis: a producer app here, a worker subprocess."""

    def __init__(
        self,
        stack: EmbeddedStack,
        worker: Child,
        queue: str = celery_baseline.QUEUE,
        result_backend: str | None = None,
    ) -> None:
        self.stack = stack
        self.worker = worker
        self.queue = queue
        self.app: Celery = celery_baseline.make_app(stack.redis_url, result_backend)
        self.r = redis.Redis.from_url(stack.redis_url)

    def new_counter(self) -> str:
        return f"bench:done:{uuid.uuid4().hex[:8]}"

    def count(self, key: str) -> int:
        return int(self.r.get(key) or 0)

    def wait_count(self, key: str, n: int, timeout: float) -> None:
        """Poll the completion counter every 5 ms until it reaches ``n`` (bounded)."""

        def done() -> bool:
            if not self.worker.alive():
                raise BenchError(f"baseline worker exited\n{self.worker.log_tail()}")
            return self.count(key) >= n

        wait_until(
            done,
            timeout,
            f"{n} baseline completions on {key}",
            interval=0.005,
            on_timeout=lambda: f"counted {self.count(key)}\n{self.worker.log_tail()}",
        )

    def send_noop(self, key: str, value: Any) -> None:
        self.app.send_task(celery_baseline.NOOP_TASK, args=[key, value], queue=self.queue)

    def send_hop(self, key: str, length: int, value: Any) -> None:
        self.app.send_task(celery_baseline.HOP_TASK, args=[key, 0, length, value], queue=self.queue)

    def close(self) -> None:
        self.app.close()
        self.r.close()


@contextmanager
def baseline_on(
    stack: EmbeddedStack,
    concurrency: int = 2,
    queue: str = celery_baseline.QUEUE,
    result_backend: bool = False,
    pool: str = "prefork",
    worker_url: str | None = None,
) -> Iterator[Baseline]:
    """Start the baseline worker (prefork ``-c concurrency``, like Vancetope's pool), warm it
    up, and stop it (and its pool children) on the way out, also on an error. With
    ``result_backend`` both the worker and the producer use Celery's Redis result backend
    on the stack's Redis (the chord and ``.get()`` baselines). ``worker_url`` is the stack's
    Redis as the worker reaches it (its broker and result backend; default the admin URL):
    the WAN rows put a fault proxy there while the producer stays direct, as the brain does."""
    argv = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "bench.celery_baseline",
        "worker",
        "-Q",
        queue,
        "-n",
        f"bench-{uuid.uuid4().hex[:6]}@%h",
        "-P",
        pool,
        "-c",
        str(concurrency),
        "--loglevel",
        "WARNING",
    ]
    log_path = stack.settings.data_dir / "logs" / f"baseline-worker-{queue}.log"
    backend = stack.redis_url if result_backend else None
    url = worker_url or stack.redis_url
    env = child_env(BENCH_REDIS_URL=url, BENCH_RESULT_BACKEND=url if result_backend else "")
    worker = Child.start("baseline-worker", argv, env, log_path)
    base = Baseline(stack, worker, queue, backend)
    try:
        key = base.new_counter()
        for i in range(2 * concurrency):
            base.send_noop(key, i)
        base.wait_count(key, 2 * concurrency, WARMUP_TIMEOUT_S)
        yield base
    finally:
        base.close()
        worker.stop()


class Vancetope:
    """A brain connected to the stack (as the CLI connects), submitting trees and waiting for them."""

    def __init__(self, stack: EmbeddedStack, brain: Brain) -> None:
        self.stack = stack
        self.brain = brain
        self._status_db: sqlite3.Connection | None = None
        # This process's CPU-seconds (all threads) in the last run_tree's submit() call.
        self.last_submit_cpu_s = 0.0

    def run_tree(
        self, tree: TaskTree, timeout: float, **submit_kwargs: Any
    ) -> tuple[TreeRecord, float, float]:
        """Submit ``tree`` and wait until the store says it finished.

        Returns (record, seconds spent in submit(), seconds from submit to finished).
        The wait is woken by the brain's tree events (one per result) and then reads only
        the tree's status, see :meth:`_finished`.
        """
        tree_id = f"{tree.id}-{uuid.uuid4().hex[:8]}"
        pubsub = self.brain.hot.r.pubsub(ignore_subscribe_messages=True)
        pubsub.subscribe(channel_tree_events(tree_id))  # before submitting: no wake-up is missed
        try:
            started = time.perf_counter()
            cpu_started = time.process_time()
            self.brain.scheduler.submit(tree, tree_id=tree_id, **submit_kwargs)
            self.last_submit_cpu_s = time.process_time() - cpu_started
            submitted = time.perf_counter() - started
            deadline = time.monotonic() + timeout
            while True:
                if self._finished(tree_id):
                    elapsed = time.perf_counter() - started
                    break
                if time.monotonic() > deadline:
                    states: dict[str, int] = {}
                    for t in self.brain.store.get_tasks(tree_id):
                        states[t.state.value] = states.get(t.state.value, 0) + 1
                    raise BenchError(
                        f"tree {tree_id} still running after {timeout:g}s: {states}\n{stack_logs(self.stack)}"
                    )
                if pubsub.get_message(timeout=0.2) is not None:
                    while pubsub.get_message(timeout=0) is not None:
                        pass
        finally:
            pubsub.close()
        rec = self.brain.store.get_tree(tree_id)
        assert rec is not None
        if rec.status is not TreeStatus.DONE:
            bad = [
                f"{t.task_id}: {t.state.value} {t.reason}"
                for t in self.brain.store.get_tasks(tree_id)
                if t.state.value != "done"
            ][:5]
            raise BenchError(f"tree {tree_id} ended {rec.status.value}: {bad}")
        return rec, submitted, elapsed

    def _finished(self, tree_id: str) -> bool:
        """Has the store marked the tree finished? ``store.get_tree`` parses the whole tree
        (1-5 ms for 500 tasks); called on each of the 500 wake-ups it took seconds of CPU
        from the stack being measured on a 2-core machine. For the SQLite store read the
        status column alone (read-only; WAL lets it run beside the brain's writes)."""
        path = getattr(self.brain.store, "path", None)
        if path is None:
            rec = self.brain.store.get_tree(tree_id)
            return rec is not None and rec.status is not TreeStatus.RUNNING
        if self._status_db is None:
            self._status_db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
        row = self._status_db.execute("SELECT status FROM trees WHERE tree_id = ?", (tree_id,)).fetchone()
        return row is not None and row[0] != TreeStatus.RUNNING.value

    def close(self) -> None:
        if self._status_db is not None:
            self._status_db.close()


def echo_tree(tree_id: str, n: int, chained: bool) -> TaskTree:
    """``n`` echo tasks: independent, or a chain where each passes on its predecessor's result."""
    tasks: list[dict[str, Any]] = []
    for i in range(n):
        if chained and i > 0:
            tasks.append(
                {
                    "id": f"t{i}",
                    "tool": "echo",
                    "depends_on": [f"t{i - 1}"],
                    "args": {"value": f"${{tasks.t{i - 1}.result}}"},
                }
            )
        else:
            tasks.append({"id": f"t{i}", "tool": "echo", "args": {"value": f"v{i}"}})
    return TaskTree.model_validate({"id": tree_id, "tasks": tasks})


@contextmanager
def vancetope_on(stack: EmbeddedStack) -> Iterator[Vancetope]:
    """Start the brain and the server pool on ``stack``, connect a brain, warm both up.
    The stack's own ``stop()`` (the caller's) ends the processes."""
    start_vancetope(stack)
    with vancetope_connected(stack) as vt:
        yield vt


@contextmanager
def vancetope_connected(stack: EmbeddedStack) -> Iterator[Vancetope]:
    """Connect a brain to ``stack``'s running brain and server pool and warm them up."""
    brain = Brain.connect(stack.settings, stack.redis_url)
    vt = Vancetope(stack, brain)
    try:
        vt.run_tree(echo_tree("warmup", 4, chained=False), WARMUP_TIMEOUT_S)
        yield vt
    finally:
        vt.close()
        brain.app.close()
        brain.close()
