"""When a task with many dependencies becomes ready: exactly when its last dependency is
done, whichever that is, and whichever process recorded the others (the brain in-process on
a real Redis and SQLite store, results handed to it as a worker would)."""

from __future__ import annotations

import random

import pytest

from brain.core.models import TaskState, TreeStatus
from brain.runtime.service import Brain
from tests.conftest import result_for, tree
from workers.contracts import ErrorInfo

pytestmark = pytest.mark.integration

N = 100  # several probes of the scheduler's dependency lookups


def fan_in(tree_id: str) -> dict:
    members = [{"id": f"m{i}", "tool": "echo", "args": {"value": i}} for i in range(N)]
    join = {"id": "join", "tool": "echo", "args": {"value": "all"}, "depends_on": [m["id"] for m in members]}
    return {"id": tree_id, "tasks": [*members, join]}


@pytest.mark.parametrize("last", ["m0", "m50", f"m{N - 1}"])
def test_a_fan_in_is_ready_exactly_when_its_last_member_is_done(brain_on_redis: Brain, last: str) -> None:
    brain = brain_on_redis
    rec = brain.scheduler.submit(tree(fan_in(f"fan-{last}")))
    order = [f"m{i}" for i in range(N) if f"m{i}" != last]
    random.Random(7).shuffle(order)
    for i, member in enumerate(order):
        # Half the results as if another worker recorded them: the store has them done,
        # this scheduler never saw them (its own cache of done tasks is incomplete).
        if i % 2:
            brain.store.transition(
                rec.tree_id, member, from_states={TaskState.QUEUED_SERVER}, state=TaskState.DONE, result=i
            )
        else:
            assert brain.intake.on_result(result_for(brain, rec.tree_id, member, None, i))
        assert brain.store.get_task(rec.tree_id, "join").state is TaskState.PENDING, member
    assert brain.intake.on_result(result_for(brain, rec.tree_id, last, None, "last"))
    assert brain.store.get_task(rec.tree_id, "join").state is TaskState.QUEUED_SERVER


def test_a_fan_in_with_a_failed_member_ends_failed_exactly_when_its_last_member_is_recorded(
    brain_on_redis: Brain,
) -> None:
    """The failure skips the join at once; the tree goes on while any member is in flight (a
    result that sees one still queued does not even ask) and ends when the last is recorded."""
    brain = brain_on_redis
    rec = brain.scheduler.submit(tree(fan_in("fan-failed")))
    failed = result_for(brain, rec.tree_id, "m50", None).model_copy(
        update={"ok": False, "value": None, "error": ErrorInfo(type="Boom", message="m50 broke")}
    )
    assert brain.intake.on_result(failed)
    assert brain.store.get_task(rec.tree_id, "join").state is TaskState.SKIPPED
    order = [f"m{i}" for i in range(N) if i != 50]
    random.Random(11).shuffle(order)
    for i, member in enumerate(order[:-1]):
        if i % 2:  # recorded by another worker: this scheduler never saw it
            brain.store.transition(
                rec.tree_id, member, from_states={TaskState.QUEUED_SERVER}, state=TaskState.DONE, result=i
            )
        else:
            assert brain.intake.on_result(result_for(brain, rec.tree_id, member, None, i))
        assert brain.store.get_tree(rec.tree_id).status is TreeStatus.RUNNING, member
    assert brain.intake.on_result(result_for(brain, rec.tree_id, order[-1], None, "last"))
    assert brain.store.get_tree(rec.tree_id).status is TreeStatus.FAILED
