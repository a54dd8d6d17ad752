"""Whole-tree validation, topological order and argument references (brain.core.validation)."""

from __future__ import annotations

from typing import Any

import pytest

from brain.core.models import TaskTree, ToolSpec
from brain.core.validation import (
    UnresolvedReference,
    check_tree,
    resolve_args,
    topological_order,
    unknown_tools,
    validate_tree,
)
from brain.errors import BrainError, InvalidTaskTree


def _spec(name: str, location: str = "server", **fields: Any) -> ToolSpec:
    return ToolSpec.model_validate({"name": name, "location": location, **fields})


TIME_SCHEMA = {
    "type": "object",
    "properties": {
        "timezone": {"type": "string"},
        "count": {"type": "integer"},
        "items": {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}}}},
        "filter": {
            "type": "object",
            "properties": {"user": {"oneOf": [{"type": "integer"}, {"type": "null"}]}},
            "additionalProperties": False,
        },
    },
    "required": ["timezone"],
    "additionalProperties": False,
}
REGISTRY = {
    s.name: s
    for s in [
        _spec("echo"),
        _spec("get_time", input_schema=TIME_SCHEMA),
        _spec("read_local_file", "client"),
        _spec("drive", "both"),
        _spec("broken", input_schema={"type": "no-such-type"}),
    ]
}


def tree(*tasks: dict[str, Any]) -> TaskTree:
    return TaskTree.model_validate({"id": "t", "tasks": [{"tool": "echo", **t} for t in tasks]})


def problems(*tasks: dict[str, Any]) -> list[str]:
    return validate_tree(tree(*tasks), REGISTRY, source="tree.yaml")


# --- structure ------------------------------------------------------------------------


def test_a_valid_tree_has_no_problems() -> None:
    assert (
        problems(
            {"id": "a", "tool": "get_time", "args": {"timezone": "UTC"}},
            {"id": "b", "depends_on": ["a"], "args": {"text": "${tasks.a.result.datetime}"}},
        )
        == []
    )


def test_duplicate_task_ids() -> None:
    assert problems({"id": "a"}, {"id": "b"}, {"id": "a"}, {"id": "a"}) == [
        "task 'a': id is used by more than one task (tasks #1, #3 and #4)"
    ]


def test_unknown_dependency() -> None:
    assert problems({"id": "a"}, {"id": "b", "depends_on": ["a", "zz"]}) == [
        "task 'b': depends_on names unknown task 'zz'"
    ]


def test_self_dependency() -> None:
    assert problems({"id": "a", "depends_on": ["a"]}) == ["task 'a': depends_on names the task itself"]


def test_cycle_is_named_from_its_first_task_in_file_order() -> None:
    assert problems(
        {"id": "start"},
        {"id": "a", "depends_on": ["start", "b"]},
        {"id": "b", "depends_on": ["c"]},
        {"id": "c", "depends_on": ["a"]},
        {"id": "after", "depends_on": ["c"]},  # downstream of the cycle, not on it
    ) == ["dependency cycle: a -> b -> c -> a"]


def test_each_separate_cycle_is_reported_once_with_its_shortest_loop() -> None:
    assert problems(
        {"id": "x", "depends_on": ["y"]},
        {"id": "y", "depends_on": ["x"]},
        {"id": "a", "depends_on": ["b", "d"]},
        {"id": "b", "depends_on": ["c"]},
        {"id": "c", "depends_on": ["a"]},
        {"id": "d", "depends_on": ["a"]},
    ) == ["dependency cycle: x -> y -> x", "dependency cycle: a -> d -> a"]


def test_a_long_chain_does_not_exhaust_the_stack() -> None:
    chain = [{"id": f"t{i}", "depends_on": [f"t{i + 1}"]} for i in range(3000)]
    chain.append({"id": "t3000", "depends_on": ["t0"]})
    (problem,) = problems(*chain)
    assert problem.startswith("dependency cycle: t0 -> t1 -> t2 -> ") and problem.endswith("t3000 -> t0")


def test_tool_must_be_in_the_declared_tools() -> None:
    assert problems({"id": "a", "tool": "echo", "tools": ["drive", "get_time"]}) == [
        "task 'a': tool 'echo' is not in its tools list ['drive', 'get_time']"
    ]


# --- references -----------------------------------------------------------------------


def test_reference_must_name_a_direct_dependency() -> None:
    assert problems(
        {"id": "a"},
        {"id": "b", "depends_on": ["a"]},
        {"id": "c", "depends_on": ["b"], "args": {"text": "from a: ${tasks.a.result}"}},
    ) == ["task 'c': args.text: references task 'a', which is not in depends_on"]


def test_reference_to_an_unknown_task() -> None:
    assert problems({"id": "a", "args": {"x": ["${tasks.zz.result.items.0}"]}}) == [
        "task 'a': args.x[0]: references unknown task 'zz'"
    ]


def test_malformed_reference() -> None:
    assert problems({"id": "a"}, {"id": "b", "depends_on": ["a"], "args": {"x": "${tasks.a.output}"}}) == [
        (
            "task 'b': args.x: malformed reference '${tasks.a.output}': "
            "write ${tasks.<id>.result}, ${tasks.<id>.result.<path>}, ${tasks.<id>.mcp.<path>}, ${tasks.<id>.status} or ${tasks.<id>.error}"
        )
    ]


def test_references_to_ids_with_dots_and_nested_places_are_found() -> None:
    assert (
        problems(
            {"id": "fetch.v2"},
            {
                "id": "use",
                "depends_on": ["fetch.v2"],
                "args": {"deep": {"list": [{"v": "${tasks.fetch.v2.result.a}"}]}},
            },
        )
        == []
    )


# --- arguments against the tool's input_schema ------------------------------------------


def test_argument_type_mismatch_names_the_json_path() -> None:
    assert problems({"id": "x", "tool": "get_time", "args": {"timezone": 5}}) == [
        "task 'x': args.timezone: 5 is not of type 'string'"
    ]


def test_missing_required_and_unexpected_arguments() -> None:
    assert problems({"id": "x", "tool": "get_time", "args": {"tz": "UTC"}}) == [
        "task 'x': args: 'timezone' is a required property",
        "task 'x': args: Additional properties are not allowed ('tz' was unexpected)",
    ]


def test_nested_argument_paths() -> None:
    args = {"timezone": "UTC", "items": [{"name": "ok"}, {"name": 7}]}
    assert problems({"id": "x", "tool": "get_time", "args": args}) == [
        "task 'x': args.items[1].name: 7 is not of type 'string'"
    ]


def test_arguments_holding_a_reference_are_not_checked_against_the_schema() -> None:
    args = {
        "timezone": "${tasks.a.result}",
        "count": "${tasks.a.result.n}",
        "filter": {"user": "${tasks.a.result}"},
    }
    assert problems({"id": "a"}, {"id": "x", "tool": "get_time", "depends_on": ["a"], "args": args}) == []


def test_key_level_schema_checks_still_apply_around_a_reference() -> None:
    args = {"count": "${tasks.a.result}", "filter": {"user": "${tasks.a.result}", "extra": 1}}
    assert problems({"id": "a"}, {"id": "x", "tool": "get_time", "depends_on": ["a"], "args": args}) == [
        "task 'x': args: 'timezone' is a required property",
        "task 'x': args.filter: Additional properties are not allowed ('extra' was unexpected)",
    ]


def test_a_broken_input_schema_is_reported_once_per_task() -> None:
    assert problems({"id": "x", "tool": "broken"}) == [
        "task 'x': tool 'broken' has an invalid input_schema: 'no-such-type' is not valid under any of the given schemas"
    ]


# --- execution_target against location -------------------------------------------------------


@pytest.mark.parametrize(
    ("tool", "target", "expected"),
    [
        (
            "echo",
            "client",
            ["task 'x': execution_target is 'client' but tool 'echo' runs only on the server"],
        ),
        (
            "read_local_file",
            "server",
            ["task 'x': execution_target is 'server' but tool 'read_local_file' runs only on a client"],
        ),
        ("drive", "server", []),
        ("drive", "client", []),
        ("echo", "any", []),
        ("read_local_file", "auto", []),
        ("not_registered", "client", []),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_execution_target_against_location(tool: str, target: str, expected: list[str]) -> None:
    assert problems({"id": "x", "tool": tool, "execution_target": target}) == expected


def test_execution_target_is_checked_for_every_declared_tool() -> None:
    task = {
        "id": "x",
        "tool": "read_local_file",
        "tools": ["read_local_file", "echo"],
        "execution_target": "client",
    }
    assert problems(task) == [
        "task 'x': execution_target is 'client' but tool 'echo' runs only on the server"
    ]


# --- unknown tools are warnings, not problems --------------------------------------------


def test_unknown_tools_are_named_with_close_matches() -> None:
    t = tree({"id": "x", "tool": "nope", "tools": ["nope", "ecko", "echo"]})
    assert validate_tree(t, REGISTRY, source="tree.yaml") == []
    assert unknown_tools(t, REGISTRY, names=REGISTRY) == [
        (
            "task 'x': tool 'nope' is unknown: no registry entry declares it and no connected client this run "
            "may use announces it"
        ),
        "task 'x': tools lists 'ecko', which is unknown (not in the registry, not announced); did you mean `echo`?",
    ]


def test_a_tool_a_reachable_client_announces_is_not_unknown() -> None:
    t = tree({"id": "x", "tool": "git_log", "tools": ["git_log", "echo"]})
    assert unknown_tools(t, set(REGISTRY) | {"git_log"}) == []


def test_check_tree_raises_with_every_problem() -> None:
    with pytest.raises(InvalidTaskTree) as caught:
        check_tree(tree({"id": "a", "depends_on": ["a", "zz"]}), REGISTRY, source="tree.yaml")
    assert caught.value.path == "tree.yaml"
    assert caught.value.problems == [
        "task 'a': depends_on names the task itself",
        "task 'a': depends_on names unknown task 'zz'",
    ]


# --- topological order -----------------------------------------------------------------------


def test_topological_order_keeps_file_order_among_ready_tasks() -> None:
    t = tree(
        {"id": "c", "depends_on": ["a"]},
        {"id": "a"},
        {"id": "b"},
        {"id": "d", "depends_on": ["b", "c"]},
    )
    assert topological_order(t) == ["a", "c", "b", "d"]


def test_topological_order_refuses_a_cycle() -> None:
    with pytest.raises(ValueError, match=r"tasks \['a', 'b'\] can never run"):
        topological_order(tree({"id": "a", "depends_on": ["b"]}, {"id": "b", "depends_on": ["a"]}))


# --- resolving references -----------------------------------------------------------------------

RESULTS = {
    "a": {"datetime": "2025-01-01T09:00", "items": [{"n": 1}, {"n": 2}], "0": "zero-key"},
    "b": "plain text",
    "fetch.v2": 42,
    "none": None,
}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("${tasks.a.result}", RESULTS["a"]),
        ("${tasks.a.result.items}", [{"n": 1}, {"n": 2}]),
        ("${tasks.a.result.items.1.n}", 2),
        ("${tasks.a.result.0}", "zero-key"),
        ("${tasks.fetch.v2.result}", 42),
        ("${tasks.none.result}", None),
        ("at ${tasks.a.result.datetime}!", "at 2025-01-01T09:00!"),
        ("n=${tasks.a.result.items.0.n}, b=${tasks.b.result}", "n=1, b=plain text"),
        ("items: ${tasks.a.result.items}", 'items: [{"n": 1}, {"n": 2}]'),
        ("nothing to resolve", "nothing to resolve"),
        ("${tasks.a.output}", "${tasks.a.output}"),  # malformed: validation reports it, resolution leaves it
        (
            {"deep": ["${tasks.b.result}", 3, {"x": "${tasks.fetch.v2.result}"}]},
            {"deep": ["plain text", 3, {"x": 42}]},
        ),
    ],
    ids=repr,
)
def test_resolve_args(value: Any, expected: Any) -> None:
    assert resolve_args({"v": value, "kept": True}, RESULTS) == {"v": expected, "kept": True}


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("${tasks.zz.result}", "cannot resolve ${tasks.zz.result}: task 'zz' has no result (yet)"),
        (
            "${tasks.a.result.missing.x}",
            "cannot resolve ${tasks.a.result.missing.x}: the result of task 'a' has no key 'missing'",
        ),
        (
            "${tasks.a.result.items.5}",
            "cannot resolve ${tasks.a.result.items.5}: the result.items of task 'a' has no index 5 (it has 2 item(s))",
        ),
        (
            "${tasks.a.result.items.n}",
            "cannot resolve ${tasks.a.result.items.n}: the result.items of task 'a' is a list; 'n' is not an index",
        ),
        (
            "x ${tasks.b.result.len}",
            "cannot resolve ${tasks.b.result.len}: the result of task 'b' is str, not an object or a list",
        ),
    ],
)
def test_unresolved_references(ref: str, message: str) -> None:
    with pytest.raises(UnresolvedReference) as caught:
        resolve_args({"v": ref}, RESULTS)
    assert str(caught.value) == message
    assert isinstance(caught.value, BrainError)


IMAGE_RESULT = {
    "content": [
        {"type": "text", "text": "a tiny image:"},
        {"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"},
    ],
    "structuredContent": {"width": 1},
    "isError": False,
}


def test_an_mcp_reference_reaches_the_whole_result_beside_the_convenient_value() -> None:
    args = {
        "data": "${tasks.img.mcp.content.1.data}",
        "kind": "${tasks.img.mcp.content.1.mimeType}",
        "value": "${tasks.img.result}",
        "said": "it said: ${tasks.img.mcp.content.0.text}",
    }
    got = resolve_args(args, {"img": {"width": 1}}, {"img": IMAGE_RESULT})
    assert got == {
        "data": "iVBORw0KGgo=",
        "kind": "image/png",
        "value": {"width": 1},
        "said": "it said: a tiny image:",
    }


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("${tasks.plain.mcp}", "cannot resolve ${tasks.plain.mcp}: task 'plain' has no MCP result (its tool is not an MCP tool)"),
        ("${tasks.later.mcp.content}", "cannot resolve ${tasks.later.mcp.content}: task 'later' has no MCP result (yet)"),
        ("${tasks.img.mcp.content.5}", "cannot resolve ${tasks.img.mcp.content.5}: the mcp.content of task 'img' has no index 5 (it has 2 item(s))"),
    ],
)  # fmt: skip
def test_an_mcp_reference_that_cannot_be_resolved_says_why(ref: str, message: str) -> None:
    with pytest.raises(UnresolvedReference) as caught:
        resolve_args({"x": ref}, {"plain": "v", "img": {}}, {"plain": None, "img": IMAGE_RESULT})
    assert str(caught.value) == message


def test_unresolved_reference_carries_task_and_path() -> None:
    with pytest.raises(UnresolvedReference) as caught:
        resolve_args({"v": "${tasks.a.result.missing.x}"}, RESULTS)
    assert (caught.value.task_ref, caught.value.path) == ("a", "missing.x")
