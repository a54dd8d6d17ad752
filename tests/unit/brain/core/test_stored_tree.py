"""``TreeRecord.stored``: a tree read back from the store validates its header at once and each
task only when asked for, and is otherwise the record the store was given."""

from __future__ import annotations

import gc
import json
from typing import Any

import pytest

from brain.core.models import StoredTaskTree, TaskSpec, TaskTree, TreeRecord

TASKS: list[dict[str, Any]] = [
    {"id": "list", "tool": "git/git_status", "args": {"n": [1, 2]}, "timeout_s": 5, "pool": "gpu"},
    {
        "id": "each",
        "tool": "echo",
        "depends_on": ["list"],
        "for_each": "${tasks.list.result}",
        "as": "row",
        "max_fan_out": 10,
        "retry": {"max_attempts": 3},
    },
    {
        "id": "notify",
        "tool": "echo",
        "args": {"value": 1},
        "depends_on": ["list", "each"],
        "run_if": "any_failed",
    },
    {"id": "read", "tool": "read_resource", "args": {"server": "docs", "uri": "file:///a"}},
]


def stored_and_validated() -> tuple[TreeRecord, TreeRecord]:
    tree = TaskTree.model_validate({"id": "t", "pool": "gpu", "max_wait_s": 60, "tasks": TASKS})
    record = TreeRecord(tree_id="t-1", tree=tree, submitted_at=1.0, user="ada")
    doc = record.model_dump_json()
    return TreeRecord.stored(json.loads(doc)), TreeRecord.model_validate_json(doc)


def specs_alive() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is TaskSpec)


def test_a_stored_tree_answers_as_the_validated_one_and_validates_only_what_it_is_asked() -> None:
    before = specs_alive()
    stored, validated = stored_and_validated()
    assert isinstance(stored.tree, StoredTaskTree) and "tasks" not in stored.tree.__dict__
    assert specs_alive() - before == len(TASKS)  # the validated tree's; the stored one holds none
    assert (
        stored.tree.dependents
        == validated.tree.dependents
        == {"list": ["each", "notify"], "each": ["notify"]}
    )
    assert stored.tree.task("each") == validated.tree.task("each")
    assert specs_alive() - before == len(TASKS) + 1  # only the task asked for
    assert stored.tree.task("read").tool == "docs#read_resource"  # as stored: no validator runs twice
    assert (stored.tree.pool, stored.tree.max_wait_s, stored.user) == ("gpu", 60, "ada")
    assert stored.tree.tasks == validated.tree.tasks  # the whole list when asked for it
    with pytest.raises(KeyError):
        stored.tree.task("no-such-task")


def test_a_stored_tree_written_out_or_compared_has_all_its_tasks() -> None:
    stored, validated = stored_and_validated()
    assert stored.model_dump_json() == validated.model_dump_json()  # reads its tasks in first
    stored, validated = stored_and_validated()
    assert stored == validated and validated == stored and stored.tree == validated.tree
    assert validated.tree != TaskTree.model_validate({"id": "t", "tasks": TASKS[:1]})


def test_a_record_not_in_the_shape_a_store_writes_is_validated_whole() -> None:
    _, validated = stored_and_validated()
    data = json.loads(validated.model_dump_json())
    data["tree"]["tasks"] = [{"id": "bad id!", "tool": "echo"}]
    with pytest.raises(ValueError, match="not a valid id"):
        TreeRecord.stored(data)
    data["tree"]["tasks"] = []
    with pytest.raises(ValueError, match="at least 1"):
        TreeRecord.stored(data)
