"""Tool names never collide silently, with real MCP servers (issue 10 item 3).

Two instances of the demo server offer the same tools; the reference 'everything' server
from npm offers an ``echo`` like the built-in one.
"""

from __future__ import annotations

from pathlib import Path

from brain.core.models import SessionKind, TaskState, TreeStatus
from brain.core.submission import SubmitRequest
from brain.runtime.registry import build_registry
from tests.conftest import (
    brain_with_client,
    demo_server,
    make_settings,
    tree,
    wait_for_tree,
    write_mcp_config,
)


def servers(tmp_path: Path, everything: dict) -> Path:
    return write_mcp_config(
        tmp_path / "server-mcp.json", {"a": demo_server(), "b": demo_server(), "everything": everything}
    )


def test_the_registry_qualifies_what_clashes_and_says_so(tmp_path: Path, everything_server) -> None:
    registry = build_registry(make_settings(tmp_path, mcp_config=servers(tmp_path, everything_server)))
    assert registry.clashes["add"] == ["a.add", "b.add"]
    assert registry.clashes["echo"] == ["built-in", "everything.echo"]
    assert "add" not in registry.tools and {"a.add", "b.add", "everything.echo"} <= set(registry.tools)
    assert registry.tools["echo"].type.value == "built_in"  # not replaced
    assert "message" in registry.tools["everything.echo"].input_schema["properties"]  # its own schema


def test_qualified_names_reach_each_server_and_a_clashing_bare_name_fails_saying_why(
    tmp_path: Path, stack_factory, brain_factory, everything_server
) -> None:
    stack = stack_factory(services=("brain", "server-pool"), mcp_config=servers(tmp_path, everything_server))
    brain = brain_factory(stack)
    rec = brain.scheduler.submit(
        tree(
            {
                "id": "names",
                "tasks": [
                    {"id": "on_a", "tool": "a.add", "args": {"a": 1, "b": 2}},
                    {"id": "on_b", "tool": "b.add", "args": {"a": 3, "b": 4}},
                    {"id": "builtin", "tool": "echo", "args": {"value": "plain"}},
                    {"id": "theirs", "tool": "everything.echo", "args": {"message": "hi"}},
                    {"id": "which", "tool": "add", "args": {"a": 1, "b": 1}},
                ],
            }
        )
    )
    assert wait_for_tree(brain, rec.tree_id, timeout=120).status is TreeStatus.FAILED  # only 'which'
    tasks = {t.task_id: t for t in brain.store.get_tasks(rec.tree_id)}
    assert (tasks["on_a"].result, tasks["on_b"].result) == (3, 7)
    assert tasks["builtin"].result == "plain"
    assert tasks["theirs"].result == "Echo: hi"
    which = tasks["which"]
    assert which.state is TaskState.FAILED and which.error is not None
    assert "tool name 'add' is offered by a.add, b.add" in which.error.message
    assert "write 'a.add' or 'b.add'" in which.error.message


def test_on_a_client_a_shared_name_is_offered_per_server_and_each_reaches_its_own(
    tmp_path: Path, stack_factory, brain_factory
) -> None:
    brain = brain_with_client(
        stack_factory, brain_factory, tmp_path, {"first": demo_server(), "second": demo_server()}
    )
    rec = brain.scheduler.submit(
        tree(
            {
                "id": "client-names",
                "tasks": [
                    {"id": "bare", "tool": "pid"},
                    {"id": "first", "tool": "first.pid"},
                    {"id": "second", "tool": "second.pid"},
                ],
            }
        ),
        session=SessionKind.INTERACTIVE,
        client_id="laptop",
    )
    assert wait_for_tree(brain, rec.tree_id, timeout=120).status is TreeStatus.DONE
    tasks = {t.task_id: t for t in brain.store.get_tasks(rec.tree_id)}
    assert all(t.route == "client:laptop" for t in tasks.values())
    # Two server processes: the bare name is the first's, the qualified ones each their own.
    assert tasks["bare"].result == tasks["first"].result != tasks["second"].result


def test_a_tree_written_with_the_old_slash_names_still_runs_and_is_warned(
    tmp_path: Path, stack_factory, brain_factory
) -> None:
    """'<server>/<tool>' (before issue 24 item 3) is read as '<server>.<tool>': the run works,
    the submission says what to write, and the stored tree holds the dotted name."""
    config = write_mcp_config(tmp_path / "server-mcp.json", {"a": demo_server(), "b": demo_server()})
    stack = stack_factory(services=("brain", "server-pool"), mcp_config=config)
    brain = brain_factory(stack)
    old = tree({"id": "old-names", "tasks": [{"id": "on_b", "tool": "b/add", "args": {"a": 2, "b": 3}}]})
    accepted = brain.scheduler.accept(SubmitRequest(tree=old, source="old.yaml"))
    assert accepted.warnings == [
        (
            "old.yaml: task 'on_b': tool name 'b/add' is the deprecated '<server>/<tool>' form; it is read as "
            "'b.add', write that (MCP tool names may not hold '/')"
        )
    ]
    tree_id = accepted.record.tree_id
    assert wait_for_tree(brain, tree_id, timeout=120).status is TreeStatus.DONE
    (task,) = brain.store.get_tasks(tree_id)
    assert task.result == 5
    assert brain.store.get_tree(tree_id).tree.tasks[0].tool == "b.add"
