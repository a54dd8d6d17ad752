"""brain.core.submission: one check for every way in. Invalid trees and run ids raise
InvalidTaskTree naming the source and every problem at once; a tool nothing declares and
no client of the run announces is one of them, with "did you mean"."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from brain.core.models import Location, SessionKind, TaskTree, ToolSpec
from brain.core.snapshot import RegistrySnapshot
from brain.core.submission import SubmitRequest, check_submission
from brain.core.treefile import load_registry, merge_registry, spec_from_descriptor
from brain.errors import InvalidTaskTree
from workers.contracts import ToolType
from workers.tools.builtin import builtin_descriptors

EXAMPLES = Path(__file__).resolve().parents[4] / "examples"


@pytest.fixture(scope="module")
def registry() -> RegistrySnapshot:
    builtins = {d.name: spec_from_descriptor(d, Location.SERVER) for d in builtin_descriptors()}
    return RegistrySnapshot(tools=merge_registry(builtins, load_registry(EXAMPLES / "registry.yaml")))


def tree(*tasks: dict[str, Any], **fields: Any) -> TaskTree:
    return TaskTree.model_validate({"id": "t", "tasks": list(tasks), **fields})


@pytest.mark.parametrize(
    "tree_id",
    [None, "nightly-2026.01.01", "a", "A_b.c-d", "x" * 128],
)
def test_a_well_formed_run_id_is_accepted(registry: RegistrySnapshot, tree_id: str | None) -> None:
    assert (
        check_submission(
            tree({"id": "a", "tool": "echo", "args": {"value": 1}}), registry, source="s", tree_id=tree_id
        )
        == []
    )


@pytest.mark.parametrize("tree_id", ["", "-starts-with-dash", "has space", "has:colon", "x" * 129, "ü"])
def test_a_malformed_run_id_is_refused_naming_the_source(registry: RegistrySnapshot, tree_id: str) -> None:
    with pytest.raises(InvalidTaskTree) as caught:
        check_submission(
            tree({"id": "a", "tool": "echo", "args": {"value": 1}}),
            registry,
            source="nightly.yaml",
            tree_id=tree_id,
        )
    assert caught.value.path == "nightly.yaml"
    assert caught.value.problems == [
        f"tree_id {tree_id!r}: use letters, digits, '_', '.', '-' (max 128, starting with a letter or digit)"
    ]


def test_an_invalid_tree_is_refused_naming_every_problem(registry: RegistrySnapshot) -> None:
    bad = tree(
        {"id": "a", "tool": "echo", "args": {"value": "${tasks.nope.result}"}},
        {"id": "b", "tool": "echo", "pool": "no-such-pool"},
    )
    with pytest.raises(InvalidTaskTree) as caught:
        check_submission(bad, registry, source="run.yaml")
    assert caught.value.path == "run.yaml"
    assert len(caught.value.problems) >= 2
    assert any("nope" in p for p in caught.value.problems)
    assert any("no-such-pool" in p for p in caught.value.problems)


def test_a_tool_a_client_of_the_run_announced_is_accepted(registry: RegistrySnapshot) -> None:
    t = tree({"id": "x", "tool": "laptop_only_tool"})
    assert check_submission(t, registry, source="s", announced=frozenset({"laptop_only_tool"})) == []


def test_a_client_tool_the_registry_declares_is_accepted_while_no_client_is_connected(
    registry: RegistrySnapshot,
) -> None:
    """It parks (routing's offline strategies): known, though nobody offers it now."""
    assert (
        check_submission(
            tree({"id": "x", "tool": "read_local_file", "args": {"path": "a"}}), registry, source="s"
        )
        == []
    )


def test_an_unknown_tool_is_refused_with_did_you_mean_over_every_known_name(
    registry: RegistrySnapshot,
) -> None:
    """Issue 22 item 6: a typo was submitted and recorded as failed, with no suggestion."""
    t = tree(
        {"id": "now", "tool": "get_curent_time", "args": {"timezone": "UTC"}},
        {"id": "mine", "tool": "laptop_only_tol"},
        {"id": "bad", "tool": "echo", "args": {"value": "${tasks.nope.result}"}},
    )
    with pytest.raises(InvalidTaskTree) as caught:
        check_submission(
            t,
            registry.model_copy(
                update={"tools": {**registry.tools, "get_current_time": registry.tools["echo"]}}
            ),
            source="run.yaml",
            tree_id="has space",
            elsewhere=frozenset({"laptop_only_tool"}),
        )
    problems = caught.value.problems
    assert len(problems) == 4, problems  # every problem at once: the run id, the reference, two tools
    assert problems[0].startswith("tree_id 'has space'")
    assert "task 'bad': args.value: references unknown task 'nope'" in problems
    assert (
        "task 'now': tool 'get_curent_time' is unknown: no registry entry declares it and no connected client "
        "this run may use announces it; did you mean `get_current_time`?"
    ) in problems
    assert any(
        p.startswith("task 'mine'") and p.endswith("did you mean `laptop_only_tool`?") for p in problems
    )


def test_an_unknown_tool_names_the_mcp_servers_that_failed(registry: RegistrySnapshot) -> None:
    from workers.contracts import MCPServerFailure

    failed = registry.model_copy(update={"mcp_failures": [MCPServerFailure(server="time", message="exit 1")]})
    with pytest.raises(InvalidTaskTree, match=r"MCP server\(s\) 'time' failed to start"):
        check_submission(tree({"id": "x", "tool": "get_current_time"}), failed, source="s")


def test_a_submit_request_is_frozen_and_refuses_unknown_fields() -> None:
    request = SubmitRequest(tree=tree({"id": "a", "tool": "echo"}), source="s")
    assert request.session is SessionKind.AUTONOMOUS and request.user is None and request.tree_id is None
    with pytest.raises(ValidationError):
        SubmitRequest(tree=request.tree, source="s", priority=1)  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        request.user = "ada"  # type: ignore[misc]


# --- arguments of a tool only clients describe (issue 24, item D) ----------------------------

ADD_SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
}


def test_arguments_a_client_announced_schema_refuses_are_refused_like_a_registry_tools(
    registry: RegistrySnapshot,
) -> None:
    # Before: the registry route refused at submit; the client route ran the call and failed there.
    announced = {"notes.add": [ADD_SCHEMA]}
    with pytest.raises(InvalidTaskTree) as client_route:
        check_submission(
            tree({"id": "call", "tool": "notes.add", "args": {"a": "2"}}),
            registry,
            source="tools/call notes.add",
            announced=frozenset(announced),
            announced_schemas=announced,
        )
    with pytest.raises(InvalidTaskTree) as server_route:
        check_submission(tree({"id": "call", "tool": "echo", "args": {}}), registry, source="tools/call echo")
    assert client_route.value.problems == [
        "task 'call': args: 'b' is a required property",
        "task 'call': args.a: '2' is not of type 'integer'",
    ]
    assert server_route.value.problems == ["task 'call': args: 'value' is a required property"]


def test_arguments_any_client_of_the_run_accepts_pass_and_references_are_judged_by_shape(
    registry: RegistrySnapshot,
) -> None:
    loose = {"type": "object", "properties": {"a": {"type": "string"}}}
    announced = {"add": [ADD_SCHEMA, loose]}  # two clients, two versions: the router may pick either
    for args in ({"a": "2"}, {"a": "${tasks.first.result}", "b": 1}):
        first = {"id": "first", "tool": "echo", "args": {"value": 1}}
        task = {"id": "call", "tool": "add", "args": args, "depends_on": ["first"]}
        assert (
            check_submission(
                tree(first, task),
                registry,
                source="s",
                announced=frozenset(announced),
                announced_schemas=announced,
            )
            == []
        )


def test_a_client_tool_the_registry_gives_a_schema_is_checked_against_the_registrys() -> None:
    registry = RegistrySnapshot(
        tools={
            "read_local_file": ToolSpec(
                name="read_local_file",
                location=Location.CLIENT,
                type=ToolType.NATIVE,
                input_schema={"type": "object", "required": ["path"]},
            ),
            "git_log": ToolSpec(name="git_log", location=Location.CLIENT, mcp_server="git"),
        }
    )
    announced = {
        "read_local_file": [{"type": "object"}],
        "git_log": [{"type": "object", "required": ["repo"]}],
    }
    with pytest.raises(InvalidTaskTree) as caught:
        check_submission(
            tree({"id": "r", "tool": "read_local_file"}, {"id": "g", "tool": "git_log"}),
            registry,
            source="s",
            announced=frozenset(announced),
            announced_schemas=announced,
        )
    # The registry's schema for read_local_file; git_log's entry says nothing, so its client's schema.
    assert caught.value.problems == [
        "task 'r': args: 'path' is a required property",
        "task 'g': args: 'repo' is a required property",
    ]


def test_a_client_schema_that_is_no_schema_is_not_enforced(registry: RegistrySnapshot) -> None:
    announced = {"odd": [{"type": 5}]}
    assert (
        check_submission(
            tree({"id": "o", "tool": "odd", "args": {"x": 1}}),
            registry,
            source="s",
            announced=frozenset(announced),
            announced_schemas=announced,
        )
        == []
    )


# --- the deprecated '<server>/<tool>' form (issue 24 item 3) ---------------------------------


def test_a_tool_written_server_slash_tool_is_read_as_server_dot_tool_with_a_deprecation_warning() -> None:
    registry = RegistrySnapshot(
        tools={
            "git.git_status": ToolSpec(
                name="git.git_status", location=Location.SERVER, type=ToolType.MCP, mcp_server="git"
            )
        }
    )
    written = tree(
        {"id": "old", "tool": "git/git_status", "args": {"repo_path": "."}},
        {"id": "new", "tool": "git.git_status", "args": {"repo_path": "."}},
        {"id": "set", "tool": "git.git_status", "tools": ["git/git_status"], "args": {"repo_path": "."}},
    )
    assert [t.tool for t in written.tasks] == ["git.git_status"] * 3
    assert written.tasks[2].tools == ["git.git_status"]
    assert check_submission(written, registry, source="t.yaml") == [
        (
            "t.yaml: task 'old': tool name 'git/git_status' is the deprecated '<server>/<tool>' form; it is "
            "read as 'git.git_status', write that (MCP tool names may not hold '/')"
        ),
        (
            "t.yaml: task 'set': tool name 'git/git_status' is the deprecated '<server>/<tool>' form; it is "
            "read as 'git.git_status', write that (MCP tool names may not hold '/')"
        ),
    ]
    # What is stored (and read back) is the dotted form only: the warning was given once.
    stored = TaskTree.model_validate(written.model_dump(mode="json"))
    assert stored.tasks[0].tool == "git.git_status" and check_submission(stored, registry, source="t") == []
