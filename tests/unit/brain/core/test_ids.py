"""The id grammar (brain.core.models) and the reference grammar (brain.core.validation) decided together,
and sized so that whatever a tree file may hold fits the wire (workers.contracts.ToolCall)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from brain.core.models import MAX_TASK_ID_CHARS, MAX_TREE_ID_CHARS, TaskSpec, TaskTree
from brain.core.treefile import load_tree
from brain.core.validation import resolve_args, validate_tree
from brain.errors import InvalidTaskTree
from brain.runtime.scheduler import new_run_id
from workers.contracts import MAX_WIRE_ID_CHARS, ToolCall, ToolType


@pytest.mark.parametrize(
    ("task_id", "problem"),
    [
        ("fetch", None),
        ("fetch.v2", None),
        ("a.resultset", None),  # only a whole part that is a reference's root is ambiguous
        ("a.results", "holds '.results' as a dot-separated part"),  # ${tasks.<id>.results}: for_each
        ("a.status", "holds '.status' as a dot-separated part"),
        ("a.error.x", "holds '.error' as a dot-separated part"),
        ("each[3]", None),  # an item of a for_each task (a tree file may not name one: test_models)
        ("result", None),  # the first part: `${tasks.result.result}` is unambiguous
        ("result.x", None),
        ("a.result:b", None),
        ("x" * MAX_TASK_ID_CHARS, None),
        (
            "x" * (MAX_TASK_ID_CHARS + 1),
            "is 129 characters long; at most 128 (it travels in every tool call)",
        ),
        ("a.result", "holds '.result' as a dot-separated part"),
        ("a.result.b", "holds '.result' as a dot-separated part"),
        ("a.mcp", "holds '.mcp' as a dot-separated part"),
        ("a.mcp.b", "holds '.mcp' as a dot-separated part"),
        ("a.mcpx", None),
        ("has space", "is not a valid id: use letters, digits"),
        ("-lead", "is not a valid id"),
    ],
)
def test_task_ids_follow_one_grammar(task_id: str, problem: str | None) -> None:
    if problem is None:
        assert TaskSpec(id=task_id, tool="echo").id == task_id
        return
    with pytest.raises(ValidationError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        TaskSpec(id=task_id, tool="echo")


@pytest.mark.parametrize(
    ("tree_id", "ok"),
    [("t" * MAX_TREE_ID_CHARS, True), ("t" * (MAX_TREE_ID_CHARS + 1), False)],
)
def test_a_tree_id_leaves_room_for_the_run_suffix(tree_id: str, ok: bool) -> None:
    data = {"id": tree_id, "tasks": [{"id": "a", "tool": "echo"}]}
    if ok:
        assert TaskTree.model_validate(data).id == tree_id
    else:
        with pytest.raises(ValidationError, match=f"at most {MAX_TREE_ID_CHARS}"):
            TaskTree.model_validate(data)


@pytest.mark.parametrize(
    ("ids", "ref", "expected"),
    [
        (["a", "b"], "${tasks.a.result}", 1),
        (["a.v2", "b"], "${tasks.a.v2.result}", 2),
        (["a.resultset", "b"], "${tasks.a.resultset.result}", 3),
        (["result", "b"], "${tasks.result.result}", 4),
        (["a:x", "b"], "${tasks.a:x.result.k}", "deep"),
    ],
)
def test_a_reference_names_exactly_one_task_whatever_dots_its_id_holds(
    ids: list[str], ref: str, expected: object
) -> None:
    # "a" stands for a shorter id the lazy match could wrongly stop at.
    results = {"a": "wrong", ids[0]: {"k": "deep"} if expected == "deep" else expected}
    tree = TaskTree.model_validate(
        {
            "id": "t",
            "tasks": [
                {"id": ids[0], "tool": "echo"},
                {"id": ids[1], "tool": "echo", "depends_on": [ids[0]], "args": {"v": ref}},
            ],
        }
    )
    assert validate_tree(tree, {}, source="t.yaml") == []
    assert resolve_args(tree.tasks[1].args, results) == {"v": expected}


def test_a_task_id_with_a_result_part_is_refused_naming_the_task(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text("id: t\ntasks:\n  - id: fetch.result\n    tool: echo\n")
    with pytest.raises(InvalidTaskTree) as caught:
        load_tree(path)
    assert caught.value.problems == [
        (
            "task 'fetch.result': id: 'fetch.result' holds '.result' as a dot-separated part, which "
            "${tasks.<id>.result} references could not tell apart; rename it (e.g. 'result' -> 'res')"
        )
    ]


def test_a_task_id_over_the_wire_limit_is_refused_naming_the_task(tmp_path: Path) -> None:
    long_id = "x" * 129
    path = tmp_path / "t.yaml"
    path.write_text(f"id: t\ntasks:\n  - id: {long_id}\n    tool: echo\n")
    with pytest.raises(InvalidTaskTree) as caught:
        load_tree(path)
    assert caught.value.problems == [
        f"task '{long_id}': id: is 129 characters long; at most 128 (it travels in every tool call)"
    ]


def test_a_timeout_over_the_wire_limit_is_refused_at_validation() -> None:
    with pytest.raises(ValidationError, match="less than or equal to 86400"):
        TaskSpec(id="a", tool="echo", timeout_s=100_000)


@pytest.mark.parametrize("attempt", [1, 99, 123_456_789])
def test_the_longest_ids_a_tree_may_hold_fit_in_a_tool_call(attempt: int) -> None:
    tree_id = "t" * MAX_TREE_ID_CHARS + "-20261130-172000-abcdef"
    task_id = "x" * MAX_TASK_ID_CHARS
    run_id = new_run_id(tree_id, task_id, attempt, token="0123456789ab")
    assert len(tree_id) == MAX_WIRE_ID_CHARS
    assert len(run_id) <= MAX_WIRE_ID_CHARS
    assert run_id.endswith(f".{attempt}.0123456789ab")
    call = ToolCall(
        run_id=run_id, tree_id=tree_id, task_id=task_id, tool="e" * 200, tool_type=ToolType.BUILT_IN,
        timeout_s=86400, max_result_bytes=1,
    )  # fmt: skip
    assert call.task_id == task_id


def test_a_short_run_id_keeps_its_readable_form() -> None:
    assert new_run_id("t-1", "fetch", 2, token="0123456789ab") == "t-1.fetch.2.0123456789ab"
