"""A call held for approval as the operator sees it: Flower (the brain's events read by Celery's own
event state, the one Flower keeps) and `vancetope status`."""

from __future__ import annotations

import time
from typing import Any

from celery import Celery
from celery.events.state import State

from brain.cli.display import shown_state
from brain.core.models import TaskRecord, TaskState
from brain.runtime.events import ClientEvents
from workers.contracts import ToolAwaiting, ToolStarted


class Recorder(ClientEvents):
    def __init__(self) -> None:
        super().__init__(Celery("test"))
        self.sent: list[dict[str, Any]] = []

    def _send(self, client_id: str, event: str, **fields: Any) -> None:
        now = time.time()
        self.sent.append(
            {"type": event, "hostname": f"client-agent@{client_id}", "timestamp": now,
             "local_received": now, "clock": len(self.sent), **fields}
        )  # fmt: skip


def update(waiting: bool) -> ToolAwaiting:
    return ToolAwaiting(
        run_id="r1", tree_id="t", task_id="w", waiting=waiting, approval_id="c-1234abcd", at=time.time(),
        client_id="laptop",
    )  # fmt: skip


def test_flower_shows_awaiting_approval_then_approved() -> None:
    events, state = Recorder(), State()
    state.event({"type": "task-received", "uuid": "r1", "hostname": "client-agent@laptop", "timestamp": 0.0,
                 "local_received": 0.0, "clock": 0, "name": "vancetope.run_tool"})  # fmt: skip
    seen = []
    for waiting in (True, False):
        events.task_awaiting(update(waiting))
        state.event(events.sent[-1])
        seen.append(state.tasks["r1"].state)
    assert seen == ["AWAITING_APPROVAL", "APPROVED"]
    assert events.sent[0]["approval"] == "c-1234abcd"


def test_status_shows_awaiting_approval_though_the_agent_marked_the_run_started() -> None:
    rec = TaskRecord(
        tree_id="t", task_id="w", tool="write_local_file", state=TaskState.AWAITING_APPROVAL, run_id="r1",
        reason="awaiting approval on client laptop (vancetope-agent approve c-1234abcd)",
    )  # fmt: skip
    running = {"w": {"run_id": "r1", "worker": "client-agent@laptop"}}
    assert shown_state(rec, running) == "awaiting_approval"
    approved = rec.model_copy(update={"state": TaskState.RUNNING, "reason": ""})  # Intake.on_awaiting
    assert shown_state(approved, running) == "running"
    assert shown_state(approved, {}) == "running"  # the record says so: no Redis mark needed


def test_flower_shows_a_clients_call_started_then_awaiting_approval_then_approved() -> None:
    events, state = Recorder(), State()
    state.event({"type": "task-received", "uuid": "r1", "hostname": "client-agent@laptop", "timestamp": 0.0,
                 "local_received": 0.0, "clock": 0, "name": "vancetope.run_tool"})  # fmt: skip
    events.task_started(
        ToolStarted(run_id="r1", tree_id="t", task_id="w", started_at=1.0, client_id="laptop")
    )
    state.event(events.sent[-1])
    seen = [state.tasks["r1"].state]
    for waiting in (True, False):
        events.task_awaiting(update(waiting))
        state.event(events.sent[-1])
        seen.append(state.tasks["r1"].state)
    assert seen == ["STARTED", "AWAITING_APPROVAL", "APPROVED"]
