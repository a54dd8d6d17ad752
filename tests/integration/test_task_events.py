"""The task-sent events Flower shows while a call waits in its queue: one per server call,
with the tool and argument names (never values), none twice
(a real Redis, a Celery event receiver; no workers, so every call stays queued)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from brain.service import Brain
from tests.conftest import tree, wait_until
from workers.contracts import RUN_TOOL_TASK

pytestmark = pytest.mark.integration


class Captured:
    """task-sent events, from Celery's own event receiver in a thread."""

    def __init__(self, brain: Brain) -> None:
        self.events: list[dict[str, Any]] = []
        app = brain.scheduler.publisher.app
        self.conn = app.connection_for_read()

        def on_any(event: dict[str, Any]) -> None:
            if event["type"] == "task-sent":
                self.events.append(event)

        self.receiver = app.events.Receiver(self.conn, handlers={"*": on_any})
        self.thread = threading.Thread(
            target=lambda: self.receiver.capture(limit=None, timeout=None, wakeup=False), daemon=True
        )
        self.thread.start()

    def close(self) -> None:
        self.receiver.should_stop = True
        self.thread.join(5)
        self.conn.release()


def test_a_submit_sends_one_task_sent_per_server_call_with_argument_names_only(brain_on_redis: Brain) -> None:
    brain = brain_on_redis
    captured = Captured(brain)
    try:
        time.sleep(0.3)  # the receiver's subscription is in place before anything is sent
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
        wait_until(lambda: len(captured.events) >= n, timeout=30, what=f"{n} task-sent events")
    finally:
        captured.close()
    runs = {t.run_id for t in brain.store.get_tasks(rec.tree_id)}
    assert {e["uuid"] for e in captured.events} == runs
    assert len(captured.events) == n  # one each, none twice
    one = captured.events[0]
    assert one["name"] == RUN_TOOL_TASK and one["args"] == "echo(value)" and one["queue"] == "server"
    assert not any("secret-" in str(e) for e in captured.events)
