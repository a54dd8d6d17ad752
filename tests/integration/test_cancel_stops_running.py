"""A call running when its tree is cancelled is stopped, and its worker slot freed for the
next call (``workers.call_stop``): the MCP server is told (``notifications/cancelled``), a
cooperative built-in stops. Before, the call ran to its end (here: 100 s) while everyone's
next call waited behind it. Real stacks, the server pool and a client agent (two calls at
once each), the MCP project's reference server from npm."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from brain.core.models import SessionKind, TaskRecord, TaskState, TreeStatus
from brain.runtime.service import Brain
from tests.conftest import agent_with_servers, tree, wait_for_tree, wait_until, write_mcp_config

pytestmark = pytest.mark.integration

# Each would hold its slot for 100 s; the slots are free again within a second or two.
LONG_S = 100
LONG_MCP = {
    "tool": "trigger-long-running-operation",
    "args": {"duration": LONG_S, "steps": LONG_S},
    "timeout_s": 600,
}
LONG_BUILTIN = {"tool": "sleep", "args": {"seconds": LONG_S}, "timeout_s": 600}


def _cancel_both_while_running(brain: Brain, tasks: list[dict[str, Any]], **submit: Any) -> float:
    """Submit ``tasks`` (two long calls), cancel the tree once both run; the later start."""
    rec = brain.scheduler.submit(tree({"id": "long-calls", "tasks": tasks}), **submit)
    ids = [t["id"] for t in tasks]

    def both_running() -> bool:
        return all(brain.store.get_task(rec.tree_id, i).state is TaskState.RUNNING for i in ids)

    wait_until(both_running, timeout=120, what="both long calls to run (the two slots busy)")
    assert sorted(brain.sweeps.cancel(rec.tree_id)) == sorted(ids)
    ended = brain.store.get_tasks(rec.tree_id)
    assert {t.state for t in ended} == {TaskState.SKIPPED}
    started = [t.started_at for t in ended]
    assert all(s is not None for s in started)
    return max(s for s in started if s is not None)


def _next_call_starts_long_before_they_would_have_ended(
    brain: Brain, task: dict[str, Any], long_started: float, **submit: Any
) -> TaskRecord:
    after = brain.scheduler.submit(tree({"id": "after", "tasks": [{"id": "next", **task}]}), **submit)
    assert wait_for_tree(brain, after.tree_id).status is TreeStatus.DONE
    began = brain.store.get_task(after.tree_id, "next").started_at
    assert began is not None
    # On the old code it began only when a long call ended, LONG_S after it started.
    assert began - long_started < LONG_S / 2, (
        f"the next call began {began - long_started:.1f}s after the long ones"
    )
    return brain.store.get_task(after.tree_id, "next")


def test_a_server_call_running_when_its_tree_is_cancelled_is_stopped(
    tmp_path: Path, stack_factory: Any, brain_factory: Any, everything_server: dict[str, Any]
) -> None:
    config = write_mcp_config(tmp_path / "server-mcp.json", {"everything": everything_server})
    stack = stack_factory(services=("brain", "server-pool"), mcp_config=config)
    brain = brain_factory(stack)
    long_started = _cancel_both_while_running(
        brain, [{"id": "mcp", **LONG_MCP}, {"id": "nap", **LONG_BUILTIN}], session=SessionKind.AUTONOMOUS
    )
    _next_call_starts_long_before_they_would_have_ended(
        brain, {"tool": "echo", "args": {"value": 1}}, long_started, session=SessionKind.AUTONOMOUS
    )
    _stopped_say_the_logs(stack.service("server-pool").log_path, {"mcp", "nap"})


def _stopped_say_the_logs(log: Path | None, tasks: set[str]) -> None:
    """The worker's log says it stopped each of ``tasks`` (it never did before)."""
    assert log is not None

    def stopped() -> set[str]:
        return set(
            re.findall(r"of task (\S+) \(tool '[^']*'\) stopped after", log.read_text(errors="replace"))
        )

    wait_until(lambda: stopped() == tasks, timeout=120, what=f"the worker to stop {sorted(tasks)}")


def test_a_client_call_running_when_its_tree_is_cancelled_is_stopped(
    tmp_path: Path, stack_factory: Any, brain_factory: Any, everything_server: dict[str, Any]
) -> None:
    stack = stack_factory(
        services=("brain", "server-pool", "client-agent"),
        agent_config=agent_with_servers(tmp_path, {"everything": everything_server}),
        mcp_config=write_mcp_config(tmp_path / "server-mcp.json", {}),
    )
    assert stack.wait_connected("laptop", 120)
    brain = brain_factory(stack)
    on_laptop = {"session": SessionKind.INTERACTIVE, "client_id": "laptop"}
    long_started = _cancel_both_while_running(
        brain, [{"id": "one", **LONG_MCP}, {"id": "two", **LONG_MCP}], **on_laptop
    )
    after = _next_call_starts_long_before_they_would_have_ended(
        brain, {"tool": "everything.echo", "args": {"message": "hi"}}, long_started, **on_laptop
    )
    assert after.route == "client:laptop"
    _stopped_say_the_logs(stack.service("client-agent").log_path, {"one", "two"})
