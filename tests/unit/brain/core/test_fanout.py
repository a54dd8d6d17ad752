"""brain.core.fanout and the checks of for_each at submit (issue 23, item 3)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from brain.core.fanout import FanOutError, ItemIds, gathered, item_specs, items_of, parent_of
from brain.core.models import TaskRecord, TaskSpec, TaskState, TaskTree, ToolSpec
from brain.core.validation import validate_tree

REGISTRY = {
    "echo": ToolSpec(name="echo", location="server"),
    "add": ToolSpec(
        name="add", location="server",
        input_schema={"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
    ),
}  # fmt: skip


def tree(*tasks: dict[str, Any]) -> TaskTree:
    return TaskTree.model_validate({"id": "t", "tasks": [{"id": "list", "tool": "echo"}, *tasks]})


@pytest.mark.parametrize(
    ("task", "problem"),
    [
        ({"for_each": "${tasks.list.result.items}", "depends_on": ["list"]}, None),
        # ${item} stands for a value not known yet, like a result: the schema does not refuse it
        (
            {
                "tool": "add",
                "args": {"a": "${item}"},
                "for_each": "${tasks.list.result}",
                "depends_on": ["list"],
            },
            None,
        ),
        ({"for_each": "${tasks.list.result}"}, "references task 'list', which is not in depends_on"),
        ({"for_each": "${tasks.nope.result}", "depends_on": ["list"]}, "references unknown task 'nope'"),
        ({"for_each": "list", "depends_on": ["list"]}, "write one reference to a dependency's list"),
        (
            {"for_each": "${tasks.list.status}", "depends_on": ["list"]},
            "write one reference to a dependency's list",
        ),
        ({"max_fan_out": 3}, "max_fan_out applies only with for_each"),
    ],
)
def test_for_each_is_checked_at_submit_naming_the_task(task: dict[str, Any], problem: str | None) -> None:
    found = validate_tree(tree({"id": "each", "tool": "echo", **task}), REGISTRY, source="t.yaml")
    if problem is None:
        assert found == []
    else:
        assert len(found) == 1 and found[0].startswith("task 'each': ") and problem in found[0], found


def test_a_tree_file_may_not_name_a_task_as_an_item() -> None:
    with pytest.raises(ValidationError, match="names the items of a for_each task"):
        tree({"id": "each[0]", "tool": "echo"})
    with pytest.raises(ValidationError, match="as"):
        TaskSpec.model_validate({"id": "e", "tool": "echo", "as": "not a name"})


def test_items_take_the_item_whole_or_by_path_and_inside_longer_strings() -> None:
    spec = TaskSpec.model_validate(
        {
            "id": "each", "tool": "echo", "depends_on": ["list"], "for_each": "${tasks.list.result}",
            "as": "file", "args": {"whole": "${file}", "name": "${file.name}", "said": "see ${file.tags}"},
        }
    )  # fmt: skip
    (first,) = item_specs(spec, [{"name": "a", "tags": ["x", 1]}])
    assert first.id == "each[0]" and first.for_each is None
    assert first.args == {"whole": {"name": "a", "tags": ["x", 1]}, "name": "a", "said": 'see ["x", 1]'}
    assert parent_of("each[0]") == "each" and parent_of("each") is None


def test_what_a_fan_out_ends_as() -> None:
    def rec(i: int, state: TaskState, result: Any = None) -> TaskRecord:
        return TaskRecord(tree_id="t", task_id=f"e[{i}]", tool="echo", state=state, result=result)

    assert gathered([rec(0, TaskState.DONE, 1), rec(1, TaskState.DONE, 2)]) == (TaskState.DONE, [1, 2], "")
    state, results, why = gathered([rec(0, TaskState.DONE, 1), rec(1, TaskState.EXPIRED)])
    assert (state, results, why) == (TaskState.FAILED, [1, None], "1 of 2 items not done: e[1] expired")


def test_a_list_over_its_limit_or_not_a_list_is_refused() -> None:
    spec = TaskSpec.model_validate(
        {"id": "e", "tool": "echo", "depends_on": ["l"], "for_each": "${tasks.l.result}"}
    )
    assert items_of(spec, [1, 2], 2) == [1, 2]
    with pytest.raises(FanOutError, match="has 3 items, over max_fan_out 2"):
        items_of(spec, [1, 2, 3], 2)
    with pytest.raises(FanOutError, match="is str, not a list"):
        items_of(spec, "abc", 2)


def test_item_ids_read_as_the_list_of_every_item_id_in_order() -> None:
    ids = ItemIds("each", 5)
    listed = [f"each[{i}]" for i in range(5)]
    assert list(ids) == listed and len(ids) == 5
    assert list(reversed(ids)) == listed[::-1]
    assert (ids[0], ids[-1], ids[1:3], ids[::-2]) == (listed[0], listed[-1], listed[1:3], listed[::-2])
    assert "each[4]" in ids and "each[5]" not in ids
    assert all(parent_of(i) == "each" for i in ids)
    with pytest.raises(IndexError):
        ids[5]
    with pytest.raises(IndexError):
        ids[-6]
    assert list(ItemIds("each", 0)) == []
