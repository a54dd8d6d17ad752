"""A server call's priority orders its pool's queue with fair share off, the default
(docs/fair-share.md, "Priorities"): the brain publishes each call on kombu's list for its
priority step, and the pool takes a higher step first, so a person's call waiting behind a
night batch already in the queue starts next, not after the batch.

Real parts: a redis-server, the brain, the default server pool (prefork, 2 processes)."""

from __future__ import annotations

from typing import Any

import pytest

from brain.core.models import SessionKind, TreeStatus
from brain.hot.parked import ParkedWork
from brain.hot.presence import PresenceBook
from brain.hot.queues import read_queues
from tests.conftest import tree, wait_for_tree, waiting_on
from workers.contracts import SERVER_QUEUE, queue_keys

pytestmark = pytest.mark.integration

BATCH = 30


def echoes(tree_id: str, n: int, **extra: Any) -> dict[str, Any]:
    return {
        "id": tree_id,
        **extra,
        "tasks": [{"id": f"e{i}", "tool": "echo", "args": {"value": i}} for i in range(n)],
    }


def test_a_persons_call_goes_ahead_of_a_batch_already_waiting_and_a_low_one_after_it(
    stack_factory, brain_factory
) -> None:
    # One pool process of one slot: with late acks and prefetch 1 it takes the next message
    # only once it has run the last, so the order the calls start in is the order the pool
    # took them from the queue (with two slots, one slot's first call may start late).
    stack = stack_factory(services=("brain",), server_concurrency=1)  # no pool yet: all wait
    brain = brain_factory(stack)
    low = brain.scheduler.submit(tree(echoes("cleanup", 1, priority="low")), user="ada")
    batch = brain.scheduler.submit(tree(echoes("night", BATCH)), user="ada")  # autonomous: normal
    person = brain.scheduler.submit(tree(echoes("chat", 1)), session=SessionKind.INTERACTIVE, user="bob")
    r = brain.hot.r
    # One list per step: high on the queue's own key, normal on step 3, low on step 6.
    assert [int(r.llen(key)) for key in queue_keys(SERVER_QUEUE)] == [1, BATCH, 1, 0]
    report = read_queues(r, PresenceBook(r, brain.store), ParkedWork(r), [])
    assert report.pools[0].waiting == BATCH + 2  # `status --queues` counts every step

    stack.start_service("server-pool")
    for rec in (low, batch, person):
        assert wait_for_tree(brain, rec.tree_id).status is TreeStatus.DONE
    started = {
        (rec.tree_id, t.task_id): t.started_at
        for rec in (low, batch, person)
        for t in brain.store.get_tasks(rec.tree_id)
    }
    order = sorted(started, key=lambda k: started[k] or 0.0)
    # The person's call first, the batch in the order it was sent, the low call last.
    expected = [
        (person.tree_id, "e0"),
        *((batch.tree_id, f"e{i}") for i in range(BATCH)),
        (low.tree_id, "e0"),
    ]
    assert order == expected
    assert waiting_on(r, SERVER_QUEUE) == 0
