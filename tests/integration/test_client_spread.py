"""Client work spreads over a user's connected clients that offer the tool (brain.core.routing picks the
least loaded; brain.hot.presence reads each client's load from its queue and unacked hash in Redis)."""

from __future__ import annotations

import pytest

from brain.core.models import SessionKind, TaskState
from brain.runtime.service import Brain
from tests.conftest import tree
from tests.integration.test_parking import connect, queued_task_ids, reads, states

pytestmark = pytest.mark.integration


def enroll_and_connect(brain: Brain, *client_ids: str) -> None:
    for cid in client_ids:
        brain.scheduler.presence.enroll(cid, "ada")
        ack = connect(brain, cid)
        assert ack is not None and ack.accepted, ack


def test_twenty_tasks_of_an_autonomous_run_land_on_both_connected_clients_of_the_user(
    brain_on_redis: Brain,
) -> None:
    brain = brain_on_redis
    enroll_and_connect(brain, "desktop", "laptop")
    rec = brain.scheduler.submit(tree(reads(20)), session=SessionKind.AUTONOMOUS, user="ada")
    assert set(states(brain, rec.tree_id).values()) == {TaskState.QUEUED_CLIENT}
    on_desktop, on_laptop = queued_task_ids(brain, "desktop"), queued_task_ids(brain, "laptop")
    assert len(on_desktop) == len(on_laptop) == 10
    assert sorted(on_desktop + on_laptop) == sorted(f"r{i}" for i in range(20))
    routes = {t.task_id: t.client_id for t in brain.store.get_tasks(rec.tree_id)}
    assert routes["r0"] == "desktop" and routes["r1"] == "laptop"  # equal load: client_id order


def test_a_newly_connected_client_takes_new_work_until_it_carries_as_much_as_the_busy_one(
    brain_on_redis: Brain,
) -> None:
    brain = brain_on_redis
    enroll_and_connect(brain, "laptop")
    brain.scheduler.submit(tree(reads(4, tree_id="first")), session=SessionKind.AUTONOMOUS, user="ada")
    assert len(queued_task_ids(brain, "laptop")) == 4
    enroll_and_connect(brain, "desktop")
    later = brain.scheduler.submit(
        tree(reads(6, tree_id="second")), session=SessionKind.AUTONOMOUS, user="ada"
    )
    routes = [brain.store.get_task(later.tree_id, f"r{i}").client_id for i in range(6)]
    # The laptop's 4 queued calls are read from Redis at view time: the desktop catches up first.
    assert routes == ["desktop"] * 4 + ["desktop", "laptop"]


def test_the_sessions_own_client_keeps_interactive_work_while_another_client_idles(
    brain_on_redis: Brain,
) -> None:
    brain = brain_on_redis
    enroll_and_connect(brain, "desktop", "laptop")
    rec = brain.scheduler.submit(
        tree(reads(5)), session=SessionKind.INTERACTIVE, client_id="laptop", user="ada"
    )
    assert {t.client_id for t in brain.store.get_tasks(rec.tree_id)} == {"laptop"}
    assert queued_task_ids(brain, "desktop") == []
