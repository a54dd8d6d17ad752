"""A cancelled tree's server calls still in the queue are dropped by the pool's main process
on receipt (Celery's own revoke, ``Publisher.drop_queued``), not handed one by one to a pool
process that begins each and finds it cancelled: a real stack, a real server pool (-c 2)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from brain.core.models import SessionKind, TaskState, TreeStatus
from brain.runtime.service import Brain
from brain.stack.embedded import EmbeddedStack
from tests.conftest import tree, wait_for_tree, wait_until

pytestmark = pytest.mark.integration

QUEUED = 200


def test_the_calls_of_a_cancelled_tree_still_queued_never_reach_a_pool_process(
    stack_factory: Callable[..., EmbeddedStack], brain_factory: Callable[[EmbeddedStack], Brain]
) -> None:
    stack = stack_factory()
    brain = brain_factory(stack)
    naps = [{"id": f"nap{i}", "tool": "sleep", "args": {"seconds": 3}} for i in range(2)]
    echoes = [{"id": f"e{i}", "tool": "echo", "args": {"value": i}} for i in range(QUEUED)]
    rec = brain.scheduler.submit(
        tree({"id": "cancelled-batch", "tasks": naps + echoes}), session=SessionKind.AUTONOMOUS
    )

    def both_naps_running() -> bool:
        return all(brain.store.get_task(rec.tree_id, n["id"]).state is TaskState.RUNNING for n in naps)

    wait_until(both_naps_running, timeout=120, what="both naps to run (the pool's two processes busy)")
    assert len(brain.sweeps.cancel(rec.tree_id)) == QUEUED + 2
    # A tree sent after the cancel runs once every message ahead of it is consumed (one queue, in order).
    after = brain.scheduler.submit(
        tree({"id": "after", "tasks": [{"id": "one", "tool": "echo", "args": {"value": 1}}]})
    )
    assert wait_for_tree(brain, after.tree_id).status is TreeStatus.DONE
    log = stack.service("server-pool").log_path
    assert log is not None
    text = log.read_text(errors="replace")
    runs = {t.run_id for t in brain.store.get_tasks(rec.tree_id) if t.task_id.startswith("e")}
    begun_and_refused = [
        line for line in text.splitlines() if "not starting it" in line and any(r in line for r in runs)
    ]
    # At most the few a pool process had reserved before the broadcast reached it (was: all 200).
    assert len(begun_and_refused) <= 4, begun_and_refused[:5]
    assert {t.state for t in brain.store.get_tasks(rec.tree_id)} == {TaskState.SKIPPED}
