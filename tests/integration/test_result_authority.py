"""Who may complete a task (issue 7), on a real Redis and SQLite store, no workers: the
test plays a hostile client or a forger pushing onto the brain queue by calling the
brain's entry point for each source (``on_result`` with ``from_client``).
"""

from __future__ import annotations

import pytest

from brain.core.models import SessionKind, TaskState
from brain.runtime.service import Brain
from tests.conftest import result_for, tree
from tests.integration.test_parking import connect, reads
from workers.contracts import ToolResult

pytestmark = pytest.mark.integration


def forged(brain: Brain, tree_id: str, task_id: str, client_id: str | None) -> ToolResult:
    return result_for(brain, tree_id, task_id, client_id)


def test_a_result_on_the_brain_queue_cannot_complete_a_task_routed_to_a_client(brain_on_redis: Brain) -> None:
    brain = brain_on_redis
    brain.scheduler.presence.enroll("laptop", "ada")
    connect(brain, "laptop")
    rec = brain.scheduler.submit(tree(reads(1)), session=SessionKind.INTERACTIVE, client_id="laptop")
    for claimed in (None, "laptop"):
        assert brain.intake.on_result(forged(brain, rec.tree_id, "r0", claimed)) is False
    task = brain.store.get_task(rec.tree_id, "r0")
    assert task.state is TaskState.QUEUED_CLIENT and task.result is None and task.client_id == "laptop"
    # ...and the client it was sent to still can.
    assert brain.intake.on_result(forged(brain, rec.tree_id, "r0", "laptop"), from_client="laptop") is True


def test_client_a_cannot_complete_a_task_routed_to_client_b(brain_on_redis: Brain) -> None:
    brain = brain_on_redis
    for cid in ("alice-laptop", "bob-laptop"):
        brain.scheduler.presence.enroll(cid, cid.split("-")[0])
        connect(brain, cid, session=f"s-{cid}")
    rec = brain.scheduler.submit(tree(reads(1)), session=SessionKind.INTERACTIVE, client_id="bob-laptop")
    for claimed in ("alice-laptop", "bob-laptop"):
        result = forged(brain, rec.tree_id, "r0", claimed)
        assert brain.intake.on_result(result, from_client="alice-laptop") is False
    task = brain.store.get_task(rec.tree_id, "r0")
    assert task.state is TaskState.QUEUED_CLIENT and task.client_id == "bob-laptop"


def test_a_client_cannot_complete_a_server_task_and_the_server_pool_can(brain_on_redis: Brain) -> None:
    brain = brain_on_redis
    brain.scheduler.presence.enroll("laptop", "ada")
    connect(brain, "laptop")
    shout = {"id": "shout", "tool": "text_transform", "args": {"op": "upper", "text": "hi"}}
    rec = brain.scheduler.submit(tree({"id": "s", "tasks": [shout]}))
    task = brain.store.get_task(rec.tree_id, "shout")
    assert task.state is TaskState.QUEUED_SERVER and task.client_id is None
    assert (
        brain.intake.on_result(forged(brain, rec.tree_id, "shout", "laptop"), from_client="laptop") is False
    )
    assert brain.intake.on_result(forged(brain, rec.tree_id, "shout", None)) is True
