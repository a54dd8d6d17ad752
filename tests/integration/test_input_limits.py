"""Bad input against a real Redis and store: anything a tree may hold fits on the wire, and a
sweep that fails on one task logs it and repairs the others (issue 8)."""

from __future__ import annotations

import json
import logging
import time

import pytest

from brain.core.models import MAX_TASK_ID_CHARS, MAX_TREE_ID_CHARS, TaskRecord, TaskState
from brain.runtime.service import Brain
from tests.conftest import messages_on, tree
from workers.contracts import SERVER_QUEUE, ToolCall, queue_keys

pytestmark = pytest.mark.integration


def shout(task_id: str, tree_id: str = "t") -> dict:
    return {
        "id": tree_id,
        "tasks": [{"id": task_id, "tool": "text_transform", "args": {"op": "upper", "text": "hi"}}],
    }


def published_calls(brain: Brain) -> list[ToolCall]:
    bodies = [json.loads(raw) for raw in messages_on(brain.hot.r, SERVER_QUEUE)]
    import base64

    return [ToolCall.model_validate(json.loads(base64.b64decode(b["body"]))[0][0]) for b in bodies]


def test_the_longest_ids_a_tree_may_hold_are_published_not_stuck_in_queued_server(
    brain_on_redis: Brain,
) -> None:
    brain = brain_on_redis
    task_id = "x" * MAX_TASK_ID_CHARS
    rec = brain.scheduler.submit(tree(shout(task_id, tree_id="t" * MAX_TREE_ID_CHARS)))
    assert brain.store.get_task(rec.tree_id, task_id).state is TaskState.QUEUED_SERVER
    (call,) = published_calls(brain)
    assert (call.tree_id, call.task_id) == (rec.tree_id, task_id)
    assert call.run_id == brain.store.get_task(rec.tree_id, task_id).run_id


def test_a_sweep_that_fails_on_one_task_logs_it_and_resends_the_others(
    brain_on_redis: Brain, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    brain = brain_on_redis
    first = brain.scheduler.submit(tree(shout("bad", tree_id="one")))
    second = brain.scheduler.submit(tree(shout("good", tree_id="two")))
    brain.hot.r.delete(*queue_keys(SERVER_QUEUE))  # both messages lost: the reconciler must re-send both
    real_call = brain.scheduler.call

    def call_failing_for_bad(spec, rec: TaskRecord, *args):  # type: ignore[no-untyped-def]
        if rec.task_id == "bad":
            raise ValueError("this record cannot become a ToolCall")
        return real_call(spec, rec, *args)

    monkeypatch.setattr(brain.scheduler, "call", call_failing_for_bad)
    later = time.time() + 60  # past reconcile_grace_s, without waiting for it
    for part in (brain.scheduler, brain.sweeps):  # one clock: the sweep's cutoff, the records' stamps
        monkeypatch.setattr(part, "clock", lambda: later)
    with caplog.at_level(logging.ERROR, logger="vancetope.brain"):
        resent = brain.sweeps.run_once()
    assert resent == ["good"]
    assert [c.task_id for c in published_calls(brain)] == ["good"]
    assert f"re-sending task 'bad' of tree {first.tree_id} failed" in caplog.text
    assert "this record cannot become a ToolCall" in caplog.text
    assert brain.store.get_task(second.tree_id, "good").attempt == 2
