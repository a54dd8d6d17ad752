"""The client path end to end: brain + server pool + a real `vancetope-agent` subprocess with a
real third-party MCP server (mcp-server-git) in its mcp.json, on a real Redis.

The agent is started, killed and restarted; every task's final state is checked, and
that nothing was lost or recorded twice.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from brain.core.models import SessionKind, TaskState, TreeStatus
from tests.conftest import tree, wait_for_tree, wait_until
from workers.contracts import (
    CLIENT_HEARTBEAT,
    CLIENT_OUTBOX,
    ClientConnected,
    ToolDescriptor,
    ToolType,
    client_key,
    client_queue,
)

pytestmark = pytest.mark.integration


def make_agent(tmp_path: Path, *, shell: bool = False) -> Path:
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir()
    (sandbox / "notes.txt").write_text("kept on the laptop\n")
    git = ["git", "-C", str(sandbox), "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "notes.txt"], check=True)
    subprocess.run([*git, "commit", "-qm", "first note"], check=True)
    bin_dir = os.path.dirname(sys.executable)
    git_server = {"command": os.path.join(bin_dir, "mcp-server-git"), "args": ["--repository", str(sandbox)]}
    (tmp_path / "mcp.json").write_text(json.dumps({"mcpServers": {"git": git_server}}))
    config = tmp_path / "agent.toml"
    config.write_text(
        "[agent]\n"
        'client_id = "laptop"\nuser = "ada"\nclient_type = "cli"\n'
        'broker_url = "redis://127.0.0.1:1/0"\n'  # replaced by the stack's VANCETOPE_AGENT_BROKER_URL
        f'sandbox_roots = ["{sandbox}"]\nmcp_json = "{tmp_path / "mcp.json"}"\n'
        f"shell_enabled = {'true' if shell else 'false'}\n"
        "heartbeat_interval_s = 0.5\nheartbeat_ttl_s = 2.0\n"
        'trust_mcp_servers = ["git"]\n'
    )
    return config


def states(brain, tree_id: str) -> dict[str, TaskState]:
    return {t.task_id: t.state for t in brain.store.get_tasks(tree_id)}


def test_offline_client_work_waits_then_runs_in_order_when_the_agent_starts(
    tmp_path: Path, stack_factory, brain_factory
) -> None:
    stack = stack_factory(services=("brain", "server-pool"), agent_config=make_agent(tmp_path))
    brain = brain_factory(stack)  # the stack enrolled its agent "laptop" of "ada", with its own credential
    rec = brain.scheduler.submit(
        tree(
            {
                "id": "offline",
                "tasks": [
                    {"id": "server_side", "tool": "text_transform", "args": {"op": "upper", "text": "go"}},
                    {"id": "read_notes", "tool": "read_local_file", "args": {"path": "notes.txt"}},
                    {"id": "list_sandbox", "tool": "list_directory", "args": {"path": "."}},
                    {
                        "id": "summary",
                        "tool": "text_transform",
                        "depends_on": ["server_side", "read_notes"],
                        "args": {
                            "op": "template",
                            "text": "{a} {b}",
                            "values": {
                                "a": "${tasks.server_side.result}",
                                "b": "${tasks.read_notes.result.content}",
                            },
                        },
                    },
                ],
            }
        ),
        session=SessionKind.INTERACTIVE,
        client_id="laptop",
    )
    wait_until(
        lambda: brain.store.get_task(rec.tree_id, "server_side").state is TaskState.DONE, what="server task"
    )
    now = states(brain, rec.tree_id)
    assert now["read_notes"] is TaskState.BLOCKED
    assert (
        brain.store.get_task(rec.tree_id, "read_notes").reason
        == "Waiting for Client for Tool: read_local_file"
    )
    assert now["list_sandbox"] is TaskState.PENDING_CLIENT  # registry: offline_strategy queue
    assert now["summary"] is TaskState.PENDING

    stack.start_service("client-agent")
    assert wait_for_tree(brain, rec.tree_id, timeout=120).status is TreeStatus.DONE
    tasks = {t.task_id: t for t in brain.store.get_tasks(rec.tree_id)}
    assert tasks["summary"].result == "GO kept on the laptop\n"
    assert tasks["read_notes"].route == "client:laptop" and tasks["read_notes"].attempt == 1
    assert tasks["read_notes"].queued_at <= tasks["list_sandbox"].queued_at  # requeued in parking order


def test_a_tool_of_the_users_own_mcp_server_runs_on_the_client(
    tmp_path: Path, stack_factory, brain_factory
) -> None:
    stack = stack_factory(agent_config=make_agent(tmp_path))
    brain = brain_factory(stack)
    wait_until(lambda: brain.scheduler.presence.session("laptop"), timeout=120, what="agent announcement")
    rec = brain.scheduler.submit(
        tree(
            {
                "id": "git",
                "tasks": [{"id": "log", "tool": "git_log", "args": {"repo_path": str(tmp_path / "sandbox")}}],
            }
        ),
        session=SessionKind.INTERACTIVE,
        client_id="laptop",
    )
    assert wait_for_tree(brain, rec.tree_id, timeout=120).status is TreeStatus.DONE
    log = brain.store.get_task(rec.tree_id, "log")
    assert log.route == "client:laptop" and "first note" in str(log.result)


def test_an_agent_killed_mid_task_has_the_task_blocked_then_run_again_once_after_restart(
    tmp_path: Path, stack_factory, brain_factory
) -> None:
    registry = tmp_path / "registry.yaml"  # the example registry skips shell_execute when offline
    registry.write_text("tools:\n  - {name: shell_execute, location: client, type: native}\n")
    stack = stack_factory(agent_config=make_agent(tmp_path, shell=True), registry=registry)
    brain = brain_factory(stack)
    wait_until(lambda: brain.scheduler.presence.session("laptop"), timeout=120, what="agent announcement")
    marker = tmp_path / "sandbox" / "runs.txt"
    rec = brain.scheduler.submit(
        tree(
            {
                "id": "vanish",
                "tasks": [
                    {
                        "id": "slow",
                        "tool": "shell_execute",
                        "timeout_s": 30,
                        "args": {"command": f"echo run >> {marker}; sleep 4; echo finished"},
                    },
                    {
                        "id": "after",
                        "tool": "echo",
                        "depends_on": ["slow"],
                        "args": {"value": "${tasks.slow.result}"},
                    },
                ],
            }
        ),
        session=SessionKind.INTERACTIVE,
        client_id="laptop",
    )
    wait_until(lambda: marker.exists(), timeout=120, what="the shell command to start")
    first = brain.store.get_task(rec.tree_id, "slow")
    agent = stack.service("client-agent").process
    os.killpg(agent.pid, signal.SIGKILL)  # no goodbye: only the heartbeat tells
    agent.wait(10)
    blocked = wait_until(
        lambda: (t := brain.store.get_task(rec.tree_id, "slow")).state is TaskState.BLOCKED and t,
        timeout=120,
        what="the task to be blocked after the missed heartbeat",
    )
    assert blocked.reason == "Waiting for Client for Tool: shell_execute"
    stack.start_service("client-agent")
    assert wait_for_tree(brain, rec.tree_id, timeout=120).status is TreeStatus.DONE
    slow = brain.store.get_task(rec.tree_id, "slow")
    assert slow.attempt == first.attempt + 1 and slow.run_id != first.run_id
    assert "finished" in str(slow.result)
    assert brain.store.get_task(rec.tree_id, "after").attempt == 1
    assert marker.read_text().count("run") == 2  # killed once, ran again once


def test_a_call_the_agent_began_is_running_in_the_record_until_its_result(
    tmp_path: Path, stack_factory, brain_factory
) -> None:
    """The agent says it began the call (``ClientToolStarted``): the record moves
    ``queued_client -> running`` while the command runs, and ``done`` after its result."""
    registry = tmp_path / "registry.yaml"
    registry.write_text("tools:\n  - {name: shell_execute, location: client, type: native}\n")
    stack = stack_factory(agent_config=make_agent(tmp_path, shell=True), registry=registry)
    brain = brain_factory(stack)
    wait_until(lambda: brain.scheduler.presence.session("laptop"), timeout=120, what="agent announcement")
    began, go = tmp_path / "sandbox" / "began.txt", tmp_path / "sandbox" / "go.txt"
    command = f"echo run > {began}; while [ ! -e {go} ]; do sleep 0.05; done; echo finished"
    rec = brain.scheduler.submit(
        tree(
            {
                "id": "held",
                "tasks": [
                    {"id": "w", "tool": "shell_execute", "timeout_s": 60, "args": {"command": command}}
                ],
            }
        ),
        session=SessionKind.INTERACTIVE,
        client_id="laptop",
    )
    wait_until(lambda: began.exists(), timeout=120, what="the command to start")
    running = wait_until(
        lambda: (t := brain.store.get_task(rec.tree_id, "w")).state is TaskState.RUNNING and t,
        what="the brain to record the run as running",
    )  # the command waits for go.txt: it is still running now, whatever the machine's speed
    assert running.client_id == "laptop" and running.attempt == 1 and running.started_at
    go.write_text("go")
    assert wait_for_tree(brain, rec.tree_id, timeout=120).status is TreeStatus.DONE
    done = brain.store.get_task(rec.tree_id, "w")
    assert done.run_id == running.run_id and "finished" in str(done.result)


def test_an_agent_the_brain_dropped_while_alive_announces_itself_again(
    tmp_path: Path, stack_factory, brain_factory
) -> None:
    stack = stack_factory(agent_config=make_agent(tmp_path))
    brain = brain_factory(stack)
    first = wait_until(
        lambda: brain.scheduler.presence.session("laptop"), timeout=120, what="agent announcement"
    )
    brain.clients.on_disconnected("laptop", first.session_id, "a heartbeat arrived too late")
    back = wait_until(
        lambda: brain.scheduler.presence.session("laptop"), timeout=120, what="the agent to come back"
    )
    assert back.session_id == first.session_id and back.connected_at > first.connected_at


def test_calls_cancelled_while_waiting_in_an_offline_clients_queue_leave_it_and_never_reach_the_agent(
    tmp_path: Path, stack_factory, brain_factory
) -> None:
    stack = stack_factory(services=("brain", "server-pool"), agent_config=make_agent(tmp_path))
    brain = brain_factory(stack)
    # The brain believes laptop is connected (as just before a crash, or a laptop whose lid
    # just closed): the calls go to its queue and wait there.
    brain.hot.r.set(client_key("laptop", CLIENT_HEARTBEAT), "before-crash", ex=120)
    brain.hot.r.lpush(
        client_key("laptop", CLIENT_OUTBOX),
        ClientConnected(
            client_id="laptop",
            session_id="before-crash",
            sent_at=0,
            available_tools=[ToolDescriptor(name="write_local_file", type=ToolType.NATIVE)],
        ).model_dump_json(),
    )
    wait_until(lambda: brain.scheduler.presence.session("laptop"), what="the brain to accept the session")
    sandbox = tmp_path / "sandbox"
    markers = [sandbox / f"must-not-exist-{i}.txt" for i in range(3)]
    writes = [
        {"id": f"w{i}", "tool": "write_local_file", "args": {"path": str(m), "content": "ran"}}
        for i, m in enumerate(markers)
    ]
    rec = brain.scheduler.submit(
        tree({"id": "cancel", "tasks": writes}), session=SessionKind.INTERACTIVE, client_id="laptop"
    )
    queue = client_key("laptop", client_queue("laptop"))
    cancelled = {t.task_id: t.run_id for t in brain.store.get_tasks(rec.tree_id)}
    assert set(states(brain, rec.tree_id).values()) == {TaskState.QUEUED_CLIENT}
    assert brain.hot.r.llen(queue) == 3
    assert sorted(brain.sweeps.cancel(rec.tree_id)) == ["w0", "w1", "w2"]
    assert brain.hot.r.llen(queue) == 0  # taken out, not left for the agent to pop and refuse

    stack.start_service("client-agent")  # the real agent comes back and drains its queue
    wait_until(
        lambda: (s := brain.scheduler.presence.session("laptop")) and s.session_id != "before-crash",
        timeout=120,
        what="the real agent's announcement",
    )
    # A call sent after the cancel runs: the agent is up and consuming its queue. (Not a
    # write: the real agent announced write_local_file unlike the session above, so it waits
    # for `clients approve-tools`.)
    after = brain.scheduler.submit(
        tree(
            {"id": "after", "tasks": [{"id": "r", "tool": "read_local_file", "args": {"path": "notes.txt"}}]}
        ),
        session=SessionKind.INTERACTIVE,
        client_id="laptop",
    )
    assert wait_for_tree(brain, after.tree_id, timeout=120).status is TreeStatus.DONE
    done = brain.store.get_task(after.tree_id, "r")
    assert done.result["content"] == "kept on the laptop\n" and done.attempt == 1
    assert not any(m.exists() for m in markers)
    log = stack.service("client-agent").log_path.read_text()
    assert not [run for run in cancelled.values() if run in log], log[-3000:]  # never even popped
    tasks = brain.store.get_tasks(rec.tree_id)
    assert {(t.state, t.reason, t.result) for t in tasks} == {(TaskState.SKIPPED, "cancelled by user", None)}
    assert {t.task_id: t.run_id for t in tasks} == cancelled  # no run after the cancel
    assert brain.store.get_tree(rec.tree_id).status is TreeStatus.FAILED
