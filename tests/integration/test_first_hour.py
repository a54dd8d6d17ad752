"""A new user's first hour (issue 22), each as it was tried: real CLI subprocesses."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx2
import pytest

from brain.core.models import TaskRecord, TaskState, TaskTree, TreeRecord, TreeStatus
from brain.stack.redis_server import free_port
from brain.store import open_store
from tests.conftest import EXAMPLES, ROOT, agent_with_servers, wait_until
from tests.integration.test_cli import vancetope

pytestmark = pytest.mark.integration

# Waits for a client tool nobody serves (--no-agent): a tree that stays running, nothing busy.
PARKED_TREE = (
    "id: parked\ntasks:\n  - {id: read, tool: read_local_file, args: {path: notes.txt}}\n"
    "  - {id: after, tool: echo, args: {value: 1}, depends_on: [read]}\n"
)
INTERRUPTED_REASON = "interrupted: vancetope run was stopped (Ctrl-C)"
NO_CONFIG = "no vancetope.toml here or above; using the defaults"


def env_for(data: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "VANCETOPE_DATA_DIR": str(data), "COLUMNS": "250", **extra}


def start(args: list[str], data: Path, log: Path, **env: str) -> subprocess.Popen[bytes]:
    """`vancetope ARGS` in a session of its own, as from a terminal (a Ctrl-C reaches its group)."""
    with open(log, "w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "brain", *args],
            cwd=ROOT,
            env=env_for(data, **env),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def ctrl_c(proc: subprocess.Popen[bytes]) -> int:
    """What the terminal does on Ctrl-C: SIGINT to the foreground process group."""
    os.killpg(proc.pid, signal.SIGINT)
    return proc.wait(120)


def run_then_ctrl_c(
    args: list[str], data: Path, log: Path, submitted_within: float
) -> tuple[TreeRecord, int, str]:
    """Start `vancetope run ARGS`, press Ctrl-C once its tree is recorded: the tree, the exit
    code and the run's output on one line."""
    run = start(["run", *args], data, log)
    try:
        record = wait_until(lambda: running_tree(data), submitted_within, "the tree to be submitted")
        code = ctrl_c(run)
    finally:
        if run.poll() is None:
            run.kill()
    return record, code, " ".join(log.read_text().split())


@contextmanager
def up(data: Path, log: Path, *args: str, **env: str) -> Iterator[subprocess.Popen[bytes]]:
    proc = start(["up", "--no-agent", *args], data, log, **env)
    try:
        wait_until(lambda: "stack up" in log.read_text() or proc.poll() is not None, 120, "`vancetope up`")
        assert proc.poll() is None, log.read_text()
        yield proc
    finally:
        if proc.poll() is None:
            assert ctrl_c(proc) == 0, log.read_text()


def redis_port_in(log: Path) -> int:
    found = re.search(r"redis redis://127\.0\.0\.1:(\d+)/0", log.read_text())
    assert found, log.read_text()
    return int(found.group(1))


def running_tree(data: Path) -> TreeRecord | None:
    if not (data / "vancetope.db").exists():
        return None
    store = open_store(f"sqlite:///{data / 'vancetope.db'}")
    try:
        return next((t for t in store.list_trees(limit=5) if t.status is TreeStatus.RUNNING), None)
    finally:
        store.close()


def tasks_of(data: Path, tree_id: str) -> dict[str, tuple[TaskState, str | None]]:
    store = open_store(f"sqlite:///{data / 'vancetope.db'}")
    try:
        tree = store.get_tree(tree_id)
        assert tree is not None
        return {t.task_id: (t.state, t.reason) for t in store.get_tasks(tree_id)}
    finally:
        store.close()


def test_the_embedded_redis_keeps_its_port_across_restarts_and_refuses_a_busy_one(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with up(data, tmp_path / "up1.log", "--no-gateway"):
        port = redis_port_in(tmp_path / "up1.log")
    assert (data / "redis" / "port").read_text().strip() == str(port)
    with up(data, tmp_path / "up2.log", "--no-gateway"):
        assert redis_port_in(tmp_path / "up2.log") == port  # every enrolled client's URL still works
    with socket.socket() as taken:  # another program took it meanwhile
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", port))
        taken.listen()
        busy = vancetope("up", "--no-agent", "--no-gateway", data=data)
    assert busy.returncode == 3, busy.stdout + busy.stderr
    errors = [line for line in busy.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"127.0.0.1:{port}" in errors[0] and "in use" in errors[0], busy.stderr
    assert "VANCETOPE_REDIS_PORT" in errors[0]
    assert (data / "redis" / "port").read_text().strip() == str(port)  # not silently moved


def test_ctrl_c_on_a_run_that_started_its_stack_cancels_the_tree_as_interrupted_and_exits_130(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    tree = tmp_path / "parked.yaml"
    tree.write_text(PARKED_TREE)
    record, code, log = run_then_ctrl_c([str(tree), "--no-agent"], data, tmp_path / "run.log", 120)
    assert code == 130, log
    assert (
        f"interrupted (Ctrl-C): tree {record.tree_id} stopped" in log
        and "2 unfinished task(s) cancelled" in log
    )
    assert "the tree goes on" not in log
    assert tasks_of(data, record.tree_id) == {
        "read": (TaskState.SKIPPED, INTERRUPTED_REASON),
        "after": (TaskState.SKIPPED, INTERRUPTED_REASON),
    }
    assert running_tree(data) is None  # `status` no longer shows it running with nothing behind it


def time_wait_port() -> int:
    """A port whose last connection lingers in TIME_WAIT (the server side closed first), as one
    does for a minute after a stack stopped."""
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = server.accept()
        accepted.close()  # the side that closes first keeps TIME_WAIT on 127.0.0.1:port
        client.close()
    with socket.socket() as plain, pytest.raises(OSError):
        plain.bind(("127.0.0.1", port))  # what the old check did: "already in use"
    return port


def test_up_says_beat_runs_starts_its_gateway_on_a_port_in_time_wait_and_run_leaves_its_tree_on_ctrl_c(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    gateway_port = time_wait_port()
    schedules = json.dumps(
        [{"name": "yearly", "tree": str(EXAMPLES / "night-batch.yaml"), "cron": "0 2 1 1 *"}]
    )
    log = tmp_path / "up.log"
    # --data-dir after the command name, as users type it (refused before issue 22), over
    # the environment's.
    elsewhere = tmp_path / "elsewhere"
    up_args = ("--gateway-port", str(gateway_port), "--data-dir", str(data))
    with up(data, log, *up_args, VANCETOPE_SCHEDULES=schedules, VANCETOPE_DATA_DIR=str(elsewhere)):
        assert (data / "stack.json").exists() and not elsewhere.exists()
        # `up` prints the beat line just after "stack up" (what up() waits for): read after both.
        wait_until(lambda: "beat: fires" in log.read_text(), 120, "the beat line in `up`'s output")
        text = " ".join(log.read_text().split())
        assert "beat: fires 1 schedule(s) (yearly)" in text, text
        assert f"MCP gateway: http://127.0.0.1:{gateway_port}/mcp" in text, text
        assert "already in use" not in text

        # `vancetope gateway --port P` beside it, against the same Redis.
        own = free_port()
        url = json.loads((data / "stack.json").read_text())["redis_url"]
        secret = (data / "redis" / "admin.secret").read_text().strip()
        admin = url.replace("redis://", f"redis://vt-admin:{secret}@")
        gw = start(["gateway", "--port", str(own)], data, tmp_path / "gw.log", VANCETOPE_REDIS_URL=admin)
        try:
            answered = wait_until(lambda: answer(f"http://127.0.0.1:{own}/mcp"), 120, "the gateway on --port")
            assert answered == 401  # served there, and asks for a token
        finally:
            os.killpg(gw.pid, signal.SIGTERM)
            gw.wait(120)

        # Ctrl-C on a run that used this stack: the tree goes on.
        tree = tmp_path / "parked.yaml"
        tree.write_text(PARKED_TREE)
        record, code, run_log = run_then_ctrl_c([str(tree)], data, tmp_path / "run.log", 60)
        assert code == 130, run_log
        assert f"the tree goes on: vancetope status {record.tree_id}" in run_log
        assert running_tree(data) == record
        assert all(state is not TaskState.SKIPPED for state, _ in tasks_of(data, record.tree_id).values())


def answer(url: str) -> int | None:
    try:
        return httpx2.post(url, json={}, timeout=2).status_code
    except httpx2.TransportError:
        return None


def test_a_command_run_below_the_project_uses_its_vancetope_toml(tmp_path: Path) -> None:
    tree = tmp_path / "t.yaml"
    tree.write_text("id: t\ntasks:\n  - {id: read, tool: read_local_file, args: {path: notes.txt}}\n")
    below = vancetope("explain", str(tree), data=tmp_path / "data", cwd=EXAMPLES / "agent")
    assert below.returncode == 0, below.stdout + below.stderr  # the registry of ../../vancetope.toml
    assert "Tool unknown" not in below.stdout and NO_CONFIG not in below.stderr
    elsewhere = vancetope("explain", str(tree), data=tmp_path / "data", cwd=tmp_path)
    assert elsewhere.stderr.count(NO_CONFIG) == 1, elsewhere.stderr
    # The defaults know no read_local_file: said, not silent (refused as `run` would refuse it).
    assert elsewhere.returncode == 2, elsewhere.stdout + elsewhere.stderr
    assert "tool 'read_local_file' is unknown" in " ".join(elsewhere.stderr.split())


def test_users_token_with_no_stack_refuses_and_keeps_the_token(tmp_path: Path) -> None:
    data = tmp_path / "data"
    proc = vancetope("users", "token", "demo", data=data)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert proc.stdout == ""
    errors = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and "no stack is running here" in errors[0], proc.stderr


def test_an_agent_whose_broker_is_gone_says_what_to_do_once_not_per_retry(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there: the stack is down, or moved
    config = agent_with_servers(tmp_path, {})
    text = config.read_text().replace(
        '"redis://127.0.0.1:1/0"', f'"redis://laptop:secret@127.0.0.1:{port}/0"'
    )
    config.write_text(text)
    log = tmp_path / "agent.log"
    with open(log, "w") as out:
        agent = subprocess.Popen(
            [sys.executable, "-m", "client_agent", "run", "--config", str(config), "--log-level", "INFO"],
            cwd=tmp_path,
            env={**os.environ, "VANCETOPE_AGENT_DATA_DIR": str(tmp_path / "agent-data")},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        # The announcer, the heartbeat and Celery's consumer have each retried a few times.
        wait_until(lambda: log.read_text().count("announcing again in") >= 4, 120, "four retries")
    finally:
        agent.terminate()
        agent.wait(120)
    hint = (
        f"cannot reach the broker at 127.0.0.1:{port}: is the stack running (`vancetope up`)? if its "
        "address changed, enroll again: `vancetope clients enroll laptop --user ada --output FILE`"
    )
    lines = log.read_text().splitlines()
    assert sum(hint in line for line in lines) == 1, log.read_text()
    said = [line for line in lines if f"127.0.0.1:{port}" in line and ("WARNING" in line or "ERROR" in line)]
    assert len(said) == 1, log.read_text()  # no retry says it again


def test_status_of_one_task_prints_its_whole_result_where_the_table_shows_a_preview(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    content = "line of a long file\n" * 40
    tree = TaskTree.model_validate({"id": "t", "tasks": [{"id": "read", "tool": "read_local_file"}]})
    store = open_store(f"sqlite:///{data / 'vancetope.db'}")
    try:
        done = TaskRecord(
            tree_id="t-1",
            task_id="read",
            tool="read_local_file",
            state=TaskState.DONE,
            result={"content": content},
        )
        store.put_tree(TreeRecord(tree_id="t-1", tree=tree, submitted_at=0, status=TreeStatus.DONE), [done])
    finally:
        store.close()
    table = vancetope("status", "t-1", data=data, env={"COLUMNS": "80"})
    assert table.returncode == 0, table.stderr
    assert len([line for line in table.stdout.splitlines() if "line of a lon" in line]) == 1, table.stdout
    assert "whole results: vancetope status t-1 TASK (or --json)" in table.stdout

    whole = vancetope("status", "t-1", "read", data=data, env={"COLUMNS": "80"})
    assert whole.returncode == 0, whole.stderr
    shown = whole.stdout[whole.stdout.index("result:") + len("result:") :]
    assert json.loads(shown) == {"content": content}
    as_json = vancetope("status", "t-1", "read", "--json", data=data)
    assert json.loads(as_json.stdout)["result"] == {"content": content}
    missing = vancetope("status", "t-1", "nope", data=data)
    assert missing.returncode == 2 and "tree 't-1' has no task 'nope'; its tasks: read" in missing.stderr


def test_explain_names_each_tasks_retry_policy_and_trigger_rule(tmp_path: Path) -> None:
    """Issue 23, item 4."""
    tree = tmp_path / "night.yaml"
    tree.write_text(
        "id: night\nretry: {max_attempts: 2, backoff_s: 5}\ntasks:\n"
        "  - {id: a, tool: echo, args: {value: 1}, retry: {max_attempts: 4, backoff_s: 1, on: [tool_error]}}\n"
        "  - {id: b, tool: echo, args: {value: '${tasks.a.status}'}, depends_on: [a], run_if: any_failed}\n"
        "  - {id: c, tool: echo, args: {value: '${f}'}, depends_on: [a], for_each: '${tasks.a.result}', as: f}\n"
    )
    said = vancetope("explain", str(tree), data=tmp_path / "data")
    assert said.returncode == 0, said.stdout + said.stderr
    text = " ".join(said.stdout.split())
    assert "task 'a': retry 4 attempts, 1s ×2 (≤300s, jitter) on tool_error (from the task)" in text
    assert "task 'b': retry 2 attempts, 5s ×2 (≤300s, jitter) on unavailable, timeout (from the tree)" in text
    assert "run_if any_failed (a)" in text
    assert (
        "task 'c': retry 2 attempts" in text
        and "for_each ${tasks.a.result} as f (at most 1000 items)" in text
    )
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "id: bad\ntasks:\n"
        "  - {id: a, tool: echo, args: {value: 1}, retry: {max_attempts: 0, backoff_s: -1, on: [typo]}}\n"
        "  - {id: b, tool: echo, args: {value: 1}, depends_on: [a], run_if: sometimes}\n"
    )
    refused = vancetope("run", str(bad), data=tmp_path / "data")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    errors = " ".join(refused.stderr.split())
    for problem in (
        "task 'a': retry.max_attempts: Input should be greater than or equal to 1",
        "task 'a': retry.backoff_s: Input should be greater than or equal to 0",
        "task 'a': retry.on[0]: Input should be 'unavailable', 'timeout' or 'tool_error'",
        "task 'b': run_if: Input should be 'all_succeeded', 'all_done', 'any_failed' or 'none_failed'",
    ):
        assert problem in errors, errors
    assert not (tmp_path / "data" / "stack.json").exists()
