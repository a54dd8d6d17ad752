"""What a tree does next (pure): ready, skipped with the upstream's name, finished."""

from __future__ import annotations

import pytest

from brain.models import TaskState, TaskTree, TreeStatus
from brain.transitions import plan, tree_status

P, D, F, S, X, Q = (
    TaskState.PENDING,
    TaskState.DONE,
    TaskState.FAILED,
    TaskState.SKIPPED,
    TaskState.EXPIRED,
    TaskState.QUEUED_SERVER,
)

TREE = TaskTree.model_validate(
    {
        "id": "t",
        "tasks": [
            {"id": "a", "tool": "echo"},
            {"id": "b", "tool": "echo", "depends_on": ["a"]},
            {"id": "c", "tool": "echo", "depends_on": ["a", "b"]},
        ],
    }
)


@pytest.mark.parametrize(
    ("states", "ready", "skip"),
    [
        ({"a": P, "b": P, "c": P}, ["a"], []),
        ({"a": Q, "b": P, "c": P}, [], []),
        ({"a": D, "b": P, "c": P}, ["b"], []),
        ({"a": D, "b": D, "c": P}, ["c"], []),
        (
            {"a": F, "b": P, "c": P},
            [],
            [("b", "upstream task 'a' failed"), ("c", "upstream task 'a' failed")],
        ),
        ({"a": D, "b": S, "c": P}, [], [("c", "upstream task 'b' skipped")]),
        (
            {"a": X, "b": P, "c": P},
            [],
            [("b", "upstream task 'a' expired"), ("c", "upstream task 'a' expired")],
        ),
    ],
    ids=[
        "a root task is ready",
        "nothing is ready while a dependency runs",
        "a task is ready when its dependency is done",
        "a task waits for all its dependencies",
        "dependents of a failed task are skipped naming it",
        "a skipped dependency skips its dependents",
        "an expired dependency skips its dependents",
    ],
)
def test_plan(states: dict[str, TaskState], ready: list[str], skip: list[tuple[str, str]]) -> None:
    step = plan(TREE, states)
    assert (step.ready, step.skip) == (ready, skip)


@pytest.mark.parametrize(
    ("states", "status"),
    [({"a": D, "b": D}, TreeStatus.DONE), ({"a": D, "b": S}, TreeStatus.FAILED), ({"a": D, "b": Q}, None)],
    ids=["all done is done", "final but not all done is failed", "anything unfinished is still running"],
)
def test_tree_status(states: dict[str, TaskState], status: TreeStatus | None) -> None:
    assert tree_status(states) == status
