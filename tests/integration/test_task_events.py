"""The task-sent events Flower shows while a call waits in its queue: one per server call,
with the tool and argument names (never values), none twice; the task-revoked and task-failed
the brain sends for calls it ended that no worker will speak of again
(a real Redis, a Celery event receiver; no workers, so every call stays queued). With
``task_events = false`` a stack sends no task events at all, and its workers still their
heartbeats (a real stack)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from brain.core.models import TaskState
from brain.runtime.service import Brain
from brain.stack.embedded import EmbeddedStack
from tests.conftest import tree, wait_for_tree, wait_until, waiting_on
from workers.contracts import RUN_TOOL_TASK, ErrorInfo, ToolResult, queue_keys

pytestmark = pytest.mark.integration

PROBE = "vancetope-test-probe"  # an event type no part of the stack sends or reads


class Captured:
    """Events of the given types (default: task-sent), from Celery's own event receiver in a
    thread."""

    def __init__(self, brain: Brain, kinds: Callable[[str], bool] = "task-sent".__eq__) -> None:
        self.events: list[dict[str, Any]] = []
        self.app = app = brain.scheduler.publisher.app
        self.conn = app.connection_for_read()
        self.probed = threading.Event()

        def on_any(event: dict[str, Any]) -> None:
            if event["type"] == PROBE:
                self.probed.set()
            elif kinds(event["type"]):
                self.events.append(event)

        self.receiver = app.events.Receiver(self.conn, handlers={"*": on_any})
        self.thread = threading.Thread(
            target=lambda: self.receiver.capture(limit=None, timeout=None, wakeup=False), daemon=True
        )
        self.thread.start()

    def wait_subscribed(self) -> None:
        """Until the receiver hears an event of ours: its subscription is in place, so it
        hears everything sent from now on."""
        with self.app.events.default_dispatcher() as dispatcher:

            def heard() -> bool:
                dispatcher.send(PROBE)
                return self.probed.wait(0.1)

            wait_until(heard, timeout=60, what="the event receiver to hear a probe event")

    def close(self) -> None:
        self.receiver.should_stop = True
        self.thread.join(5)
        self.conn.release()


def test_a_submit_sends_one_task_sent_per_server_call_with_argument_names_only(brain_on_redis: Brain) -> None:
    brain = brain_on_redis
    captured = Captured(brain)
    try:
        captured.wait_subscribed()  # before anything is sent
        n = 250  # more than one dispatch chunk (200): two batches
        rec = brain.scheduler.submit(
            tree(
                {
                    "id": "sent",
                    "tasks": [
                        {"id": f"t{i}", "tool": "echo", "args": {"value": f"secret-{i}"}} for i in range(n)
                    ],
                }
            )
        )
        wait_until(lambda: len(captured.events) >= n, timeout=60, what=f"{n} task-sent events")
    finally:
        captured.close()
    runs = {t.run_id for t in brain.store.get_tasks(rec.tree_id)}
    assert {e["uuid"] for e in captured.events} == runs
    assert len(captured.events) == n  # one each, none twice
    one = captured.events[0]
    assert one["name"] == RUN_TOOL_TASK and one["args"] == "echo(value)" and one["queue"] == "server"
    assert not any("secret-" in str(e) for e in captured.events)


def test_a_cancel_and_an_expiry_send_task_revoked_for_each_call_no_worker_began(
    brain_on_redis: Brain,
) -> None:
    """Calls still in their queue (no workers here) when their tree is cancelled, or their
    ``max_total_s`` passes: one ``task-revoked`` each, with the fields a Celery worker sends,
    the expired one ``expired``."""
    brain = brain_on_redis
    captured = Captured(brain, kinds="task-revoked".__eq__)
    try:
        captured.wait_subscribed()
        echo = [{"id": f"t{i}", "tool": "echo", "args": {"value": i}} for i in range(3)]
        cancelled = brain.scheduler.submit(tree({"id": "cancelled", "tasks": echo}))
        expiring = brain.scheduler.submit(
            tree({"id": "expiring", "tasks": [{**echo[0], "max_total_s": 0.5}, echo[1]]})
        )
        assert sorted(brain.sweeps.cancel(cancelled.tree_id)) == ["t0", "t1", "t2"]
        wait_until(lambda: brain.sweeps.expire_overdue() == ["t0"], timeout=60, what="t0 to expire")
        wait_until(lambda: len(captured.events) >= 4, timeout=60, what="4 task-revoked events")
    finally:
        captured.close()
    cancelled_runs = {t.run_id for t in brain.store.get_tasks(cancelled.tree_id)}
    expired_run = next(t.run_id for t in brain.store.get_tasks(expiring.tree_id) if t.task_id == "t0")
    assert len(captured.events) == 4  # one each, none twice; t1 of "expiring" still queued
    assert {e["uuid"]: e["expired"] for e in captured.events} == {
        **dict.fromkeys(cancelled_runs, False),
        expired_run: True,
    }
    assert {(e["terminated"], e["signum"]) for e in captured.events} == {(False, None)}
    # The brain's events go under one anonymous node name (gen<pid>@host), as its task-sent do.
    assert len({e["hostname"] for e in captured.events}) == 1


def test_a_run_whose_worker_was_lost_is_told_failed_and_a_cancelled_retry_revoked(
    brain_on_redis: Brain,
) -> None:
    """Issue 26: a server run begun whose message nothing holds any more (its worker died with
    it) is sent again as a new run, and the old one told failed (``WorkerLostError``), not left
    STARTED; a failed attempt (RETRY) whose tree is cancelled while it waits is told revoked."""
    brain = brain_on_redis
    captured = Captured(brain, kinds=("task-failed", "task-revoked").__contains__)
    try:
        captured.wait_subscribed()
        retry = {"max_attempts": 2, "backoff_s": 600, "jitter": False}
        rec = brain.scheduler.submit(
            tree(
                {
                    "id": "gone",
                    "tasks": [
                        {"id": "lost", "tool": "echo", "args": {"value": 1}},
                        {"id": "retries", "tool": "echo", "args": {"value": 2}, "retry": retry},
                    ],
                }
            )
        )
        lost, retries = (brain.store.get_task(rec.tree_id, t) for t in ("lost", "retries"))
        assert lost is not None and retries is not None and lost.run_id and retries.run_id
        now = time.time()
        error = ErrorInfo(type="ToolTimeout", message="on purpose")
        failed = ToolResult(run_id=retries.run_id, tree_id=rec.tree_id, task_id="retries", tool="echo",
                            ok=False, error=error, started_at=now, finished_at=now)  # fmt: skip
        assert brain.intake.take(failed) is TaskState.RETRYING
        # A pool worker took "lost", began it, and died with its message (no pool here).
        wait_until(
            lambda: waiting_on(brain.hot.r, "server") == 2, timeout=60, what="both calls in their queue"
        )
        brain.hot.r.delete(*queue_keys("server"))
        assert brain.scheduler.move(rec.tree_id, "lost", TaskState.RUNNING, {TaskState.QUEUED_SERVER})
        wait_until(lambda: brain.sweeps.resend_lost() == ["lost"], timeout=60, what="the lost run re-sent")
        resent = brain.store.get_task(rec.tree_id, "lost")
        assert resent is not None and resent.run_id != lost.run_id
        assert sorted(brain.sweeps.cancel(rec.tree_id)) == ["lost", "retries"]
        wait_until(lambda: len(captured.events) >= 3, timeout=60, what="3 task events")
    finally:
        captured.close()
    assert len(captured.events) == 3  # one each, none twice
    told = {e["uuid"]: e for e in captured.events}
    assert {uuid: e["type"] for uuid, e in told.items()} == {
        lost.run_id: "task-failed",  # its worker was lost mid-call
        retries.run_id: "task-revoked",  # RETRY in Flower, cancelled before its next attempt
        resent.run_id: "task-revoked",  # the new run, cancelled in its queue
    }
    assert told[lost.run_id]["exception"].startswith("WorkerLostError(")
    assert told[lost.run_id]["worker_lost"] is True


@pytest.mark.parametrize("task_events", [True, False])
def test_task_events_off_sends_no_task_event_and_the_pool_still_its_heartbeats(
    stack_factory: Callable[..., EmbeddedStack],
    brain_factory: Callable[[EmbeddedStack], Brain],
    task_events: bool,
) -> None:
    stack = stack_factory(task_events=task_events)
    brain = brain_factory(stack)
    captured = Captured(brain, kinds=lambda kind: kind.startswith(("task-", "worker-")))
    try:
        captured.wait_subscribed()  # before anything is sent
        rec = brain.scheduler.submit(
            tree(
                {
                    "id": "events",
                    "tasks": [
                        *({"id": f"t{i}", "tool": "echo", "args": {"value": i}} for i in range(5)),
                        # A failed call: its task-failed event is a task event too.
                        {"id": "fails", "tool": "json_transform", "args": {"data": {}, "pick": "nope"}},
                    ],
                }
            )
        )
        assert wait_for_tree(brain, rec.tree_id).status.value == "failed"
        finished = time.time()

        def pool_heard() -> bool:
            return any(
                e["type"] == "worker-heartbeat" and e["hostname"].startswith("server@")
                for e in captured.events
            )

        # Heartbeats come every 2 s: the worker is listed in Flower either way.
        wait_until(pool_heard, timeout=120, what="a heartbeat of the server pool")
        if task_events:
            wait_until(
                lambda: (
                    {"task-sent", "task-succeeded", "task-failed"} <= {e["type"] for e in captured.events}
                ),
                timeout=120,
                what="the tree's task events",
            )
        else:
            # What would have been sent for the tree was published before the tree finished;
            # Redis hands a subscriber its messages in the order it got them, so it has all
            # reached the receiver once a heartbeat the pool sent after the finish has.
            wait_until(
                lambda: any(
                    e["type"] == "worker-heartbeat"
                    and e["hostname"].startswith("server@")
                    and e["timestamp"] > finished
                    for e in captured.events
                ),
                timeout=120,
                what="a heartbeat the server pool sent after the tree finished",
            )
    finally:
        captured.close()
    sent = sorted({e["type"] for e in captured.events if e["type"].startswith("task-")})
    assert bool(sent) is task_events, sent
