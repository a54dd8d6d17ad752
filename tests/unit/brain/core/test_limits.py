"""brain.core.limits: a tree's size and a user's quota, refused with the setting named."""

from __future__ import annotations

import pytest

from brain.config import load_settings
from brain.core.limits import TreeRefused, check_limits, check_tree_data
from brain.core.models import TaskTree


def settings(**values: object):  # type: ignore[no-untyped-def]
    return load_settings(env={}, **values)


def tree(n: int) -> TaskTree:
    return TaskTree.model_validate({"id": "t", "tasks": [{"id": f"a{i}", "tool": "echo"} for i in range(n)]})


def test_defaults_are_10000_tasks_per_tree_and_50000_unfinished_per_user() -> None:
    s = settings()
    assert (s.max_tasks_per_tree, s.max_unfinished_tasks_per_user) == (10_000, 50_000)
    assert load_settings(env={"VANCETOPE_MAX_TASKS_PER_TREE": "7"}).max_tasks_per_tree == 7


def test_tree_data_over_the_byte_limit_or_the_task_limit_is_refused_before_parsing() -> None:
    s = settings(max_tree_bytes=1000, max_tasks_per_tree=3)
    check_tree_data({"id": "t", "tasks": [{"id": "a", "tool": "echo"}] * 3}, s, source="x")
    with pytest.raises(
        TreeRefused, match=r"x: refused: the tree is [\d,]+ bytes as JSON, over max_tree_bytes"
    ):
        check_tree_data({"id": "t", "tasks": [], "goal": "g" * 2000}, s, source="x")
    with pytest.raises(
        TreeRefused, match=r"4 tasks, over max_tasks_per_tree \(VANCETOPE_MAX_TASKS_PER_TREE\) = 3"
    ):
        check_tree_data({"tree": {"id": "t", "tasks": [{}] * 4}}, s, source="x")
    check_tree_data("not a mapping", s, source="x")  # left to the validator to say what is wrong


def test_the_quota_counts_the_users_unfinished_tasks_and_this_tree() -> None:
    s = settings(max_unfinished_tasks_per_user=10, max_tasks_per_tree=5)
    check_limits(tree(4), s, source="t", user="ann", unfinished=6)  # exactly at the quota
    with pytest.raises(TreeRefused) as refused:
        check_limits(tree(5), s, source="t", user="ann", unfinished=6)
    assert "user 'ann' already has 6 unfinished task(s); this tree's 5 would pass" in str(refused.value)
    assert "max_unfinished_tasks_per_user (VANCETOPE_MAX_UNFINISHED_TASKS_PER_USER) = 10" in str(
        refused.value
    )
    with pytest.raises(TreeRefused, match="runs without a user already has"):
        check_limits(tree(1), s, source="t", user=None, unfinished=10)
    with pytest.raises(TreeRefused, match="6 tasks, over max_tasks_per_tree"):
        check_limits(tree(6), s, source="t", user="ann", unfinished=0)
