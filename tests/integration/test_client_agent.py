"""The client agent as a real process: `python -m client_agent run` against a real redis-server,
with the real mcp-server-git, a server whose command does not exist and one that crashes.
The test plays the brain by hand with redis-py: it pops the client's outbox, writes acks and
publishes run_tool jobs through the client's key prefix, exactly as the brain does."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from brain.hot.acl import client_username
from brain.runtime.enrollment import enroll, revoke
from brain.runtime.relay import Relay
from brain.stack.redis_server import RedisServer
from tests.conftest import FIXTURES
from workers.app import make_app
from workers.contracts import (
    CLIENT_ACK,
    CLIENT_HEARTBEAT,
    CLIENT_MESSAGE,
    CLIENT_OUTBOX,
    RUN_TOOL_TASK,
    AnnouncementAck,
    ClientConnected,
    ClientDisconnected,
    ClientToolResult,
    ClientToolStarted,
    ToolCall,
    ToolResult,
    ToolType,
    client_key,
    client_keyprefix,
    client_queue,
)
from workers.mcp_clients import value_of
from workers.urls import with_credentials

pytestmark = pytest.mark.integration

CID = "laptop"
NATIVE = {"read_local_file", "write_local_file", "list_directory", "git_status"}
GIT = {"command": sys.executable, "args": ["-m", "mcp_server_git", "--repository", "sandbox"]}
DEMO = {"command": sys.executable, "args": [str(FIXTURES / "mcp_demo_server.py")]}
MISSING = {"command": "no-such-mcp-server-xyz"}
CRASH = {"command": sys.executable, "args": [str(FIXTURES / "mcp_crash_server.py")]}


def git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, timeout=120)


def write_mcp_json(path: Path, servers: dict[str, Any]) -> None:
    # Write then rename: the watcher must never see half a file.
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"mcpServers": servers}))
    tmp.replace(path)


@dataclass
class Workspace:
    config: Path
    sandbox: Path
    mcp_json: Path


@pytest.fixture
def workspace(tmp_path: Path) -> Workspace:
    home = tmp_path / "home"
    sandbox = home / "sandbox"
    sandbox.mkdir(parents=True)
    (sandbox / "notes.txt").write_text("meeting at 10\n")
    git(sandbox, "init", "-q", "-b", "main")
    git(sandbox, "add", "notes.txt")
    git(sandbox, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "first notes")
    mcp_json = home / "mcp.json"
    write_mcp_json(mcp_json, {"git": GIT, "missing": MISSING, "crash": CRASH})
    config = home / "agent.toml"
    config.write_text(
        "[agent]\n"
        f'client_id = "{CID}"\nuser = "demo"\n'
        'broker_url = "redis://127.0.0.1:1/0"  # replaced by VANCETOPE_AGENT_BROKER_URL\n'
        'sandbox_roots = ["sandbox"]\nmcp_json = "mcp.json"\n'
        "heartbeat_interval_s = 0.5\nheartbeat_ttl_s = 3\nack_timeout_s = 2\ndefault_timeout_s = 20\n"
        'trust_mcp_servers = ["git", "missing", "crash", "demo"]\n'
    )
    return Workspace(config, sandbox.resolve(), mcp_json)


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    server = RedisServer(tmp_path / "redis", appendonly=False).start()
    try:
        yield server.url
    finally:
        server.stop()


class AgentProcess:
    def __init__(self, config: Path, redis_url: str, log: Path) -> None:
        self.log = log
        env = {**os.environ, "VANCETOPE_AGENT_BROKER_URL": redis_url}
        with log.open("wb") as out:
            # cwd is elsewhere on purpose: paths in agent.toml and mcp.json are relative to their files.
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "client_agent", "run", "--config", str(config)],
                cwd="/", env=env, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def children(self) -> list[int]:
        found = subprocess.run(
            ["pgrep", "-P", str(self.proc.pid)], check=False, capture_output=True, text=True, timeout=120
        )
        return [int(pid) for pid in found.stdout.split()]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def start_agent(workspace: Workspace, redis_url: str, tmp_path: Path) -> Iterator[Any]:
    started: list[AgentProcess] = []

    def start() -> AgentProcess:
        agent = AgentProcess(workspace.config, redis_url, tmp_path / f"agent{len(started)}.log")
        started.append(agent)
        return agent

    yield start
    for agent in started:
        agent.stop()
        print(f"--- agent log ({agent.log}) ---\n{agent.output()}")


class Brain:
    """The brain's side of the protocol, by hand."""

    def __init__(self, redis_url: str) -> None:
        self.r = redis.Redis.from_url(redis_url)
        self.app = make_app(redis_url, keyprefix=client_keyprefix(CID))
        self.started: set[str] = set()

    def next_message(self, timeout: float = 120.0) -> Any:
        # Short blocking pops up to the deadline: redis-py 8 reads with a 5 s socket timeout by
        # default, so one BRPOP of 90 s raised "Timeout reading from socket" while the agent started.
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            item = self.r.brpop([client_key(CID, CLIENT_OUTBOX)], timeout=max(1, min(2, int(left))))
            if item is not None:
                return CLIENT_MESSAGE.validate_json(item[1])
        raise AssertionError(f"no message from the agent within {timeout}s")

    def ack(self, announcement: ClientConnected, accepted: bool = True, reason: str = "") -> None:
        ack = AnnouncementAck(session_id=announcement.session_id, accepted=accepted, reason=reason,
                              tools=len(announcement.available_tools))  # fmt: skip
        self.r.set(client_key(CID, CLIENT_ACK), ack.model_dump_json())

    def send(self, run_id: str, tool: str, args: dict[str, Any], mcp_server: str | None = None) -> None:
        call = ToolCall(
            run_id=run_id, tree_id="tree1", task_id=f"task-{run_id}", tool=tool,
            tool_type=ToolType.MCP if mcp_server else ToolType.NATIVE, mcp_server=mcp_server,
            args=args, timeout_s=20, max_result_bytes=100_000, client_id=CID,
        )  # fmt: skip
        self.send_raw(run_id, call.model_dump(mode="json"))

    def send_raw(self, run_id: str, payload: Any) -> None:
        self.app.send_task(RUN_TOOL_TASK, args=[payload], queue=client_queue(CID), task_id=run_id)

    def results(self, run_ids: set[str], timeout: float = 120.0) -> dict[str, ToolResult]:
        """The results of ``run_ids``. A call still running a moment after it began is said to
        be running first (ClientToolStarted, client_agent.start_notices): noted in ``started``;
        a quick one is not."""
        found: dict[str, ToolResult] = {}
        deadline = time.monotonic() + timeout
        while set(found) != run_ids:
            message = self.next_message(max(0.1, deadline - time.monotonic()))
            if isinstance(message, ClientToolStarted):
                self.started.add(message.started.run_id)
                continue
            assert isinstance(message, ClientToolResult), message
            found[message.result.run_id] = message.result
        return found

    def heartbeat(self) -> tuple[bytes | None, int]:
        key = client_key(CID, CLIENT_HEARTBEAT)
        return self.r.get(key), int(self.r.pttl(key))

    def close(self) -> None:
        self.r.close()
        self.app.close()


@pytest.fixture
def brain(redis_url: str) -> Iterator[Brain]:
    b = Brain(redis_url)
    yield b
    b.close()


def wait_for(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def gone(pid: int) -> bool:
    """No such process, or a zombie left for a reaper that is not the agent (it has exited)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def names(announcement: ClientConnected, server: str | None = None) -> set[str]:
    return {t.name for t in announcement.available_tools if server is None or t.mcp_server == server}


def test_agent_announces_runs_tools_reloads_mcp_json_and_says_goodbye(
    start_agent: Any, brain: Brain, workspace: Workspace
) -> None:
    agent = start_agent()

    hello = brain.next_message()  # the agent's start: its MCP servers first, then this
    assert isinstance(hello, ClientConnected), hello
    assert (hello.client_id, hello.client_type.value) == (CID, "desktop")
    assert NATIVE <= names(hello) and "shell_execute" not in names(hello)
    assert {"git_log", "git_diff", "git_branch"} <= names(hello, "git")
    assert "git_status" not in names(hello, "git")  # shadowed by the native tool
    assert not names(hello, "missing") and not names(hello, "crash")
    read = next(t for t in hello.available_tools if t.name == "read_local_file")
    assert read.type is ToolType.NATIVE and read.input_schema["additionalProperties"] is False
    brain.ack(hello)

    session, ttl = wait_for(lambda: brain.heartbeat()[0] and brain.heartbeat(), 120, "the heartbeat")
    assert session == hello.session_id.encode() and 0 < ttl <= 3000

    brain.send("r-read", "read_local_file", {"path": "notes.txt"})
    brain.send("r-escape", "read_local_file", {"path": "/etc/passwd"})
    brain.send("r-git", "git_log", {"repo_path": str(workspace.sandbox), "max_count": 1}, mcp_server="git")
    brain.send_raw("r-bad", {"this is": "not a tool call"})
    brain.send("r-after", "list_directory", {"path": "."})
    results = brain.results({"r-read", "r-escape", "r-git", "r-after"})

    assert all(r.client_id == CID and r.worker == f"client-agent@{CID}" for r in results.values())
    assert results["r-read"].ok and results["r-read"].value["content"] == "meeting at 10\n"
    escape = results["r-escape"]
    assert not escape.ok and escape.error is not None and escape.error.type == "SandboxViolation"
    assert (
        escape.error.message
        == f"read_local_file: path '/etc/passwd' is outside the sandbox roots [{workspace.sandbox}]"
    )
    assert results["r-git"].ok, results["r-git"].error
    # An MCP tool's whole result travels; its convenient value is derived where it is recorded.
    git = results["r-git"]
    assert git.value is None and git.mcp is not None
    assert "first notes" in value_of(git.mcp)
    assert {e["name"] for e in results["r-after"].value["entries"]} >= {"notes.txt", ".git"}
    assert brain.r.brpop([client_key(CID, CLIENT_OUTBOX)], timeout=0.5) is None  # nothing for the bad message
    assert "dropped a message that is not a valid tool call" in agent.output()

    git_servers = [
        pid for pid in agent.children() if "mcp_server_git" in Path(f"/proc/{pid}/cmdline").read_text()
    ]
    assert len(git_servers) == 1
    write_mcp_json(workspace.mcp_json, {"crash": CRASH, "demo": DEMO})
    update = brain.next_message()  # once the new MCP servers started
    assert isinstance(update, ClientConnected) and update.session_id == hello.session_id
    assert not names(update, "git") and NATIVE <= names(update)
    assert {"add", "pid"} <= names(update, "demo")
    brain.ack(update)
    assert wait_for(lambda: gone(git_servers[0]), 120, "the old git server to stop")

    brain.send("r-git-again", "git_log", {"repo_path": str(workspace.sandbox)}, mcp_server="git")
    brain.send("r-demo", "add", {"a": 40, "b": 2}, mcp_server="demo")
    after = brain.results({"r-git-again", "r-demo"})
    assert after["r-demo"].mcp is not None and value_of(after["r-demo"].mcp) == 42
    assert after["r-git-again"].error is not None
    assert after["r-git-again"].error.message == (
        "git: MCP server is not running on this client agent (it failed to start, or all its tools were left out)"
    )

    children = agent.children()
    assert children, "the demo MCP server runs as a child of the agent"
    agent.proc.send_signal(signal.SIGTERM)
    goodbye = brain.next_message()
    assert isinstance(goodbye, ClientDisconnected), goodbye
    assert (goodbye.session_id, goodbye.reason) == (hello.session_id, "shutdown (SIGTERM)")
    assert agent.proc.wait(120) == 0
    assert brain.heartbeat() == (None, -2)
    assert all(gone(pid) for pid in children), "an MCP server outlived the agent"


def test_rejected_announcement_is_retried_until_accepted(
    start_agent: Any, brain: Brain, workspace: Workspace
) -> None:
    write_mcp_json(workspace.mcp_json, {})
    agent = start_agent()
    first = brain.next_message()  # the agent's start
    assert isinstance(first, ClientConnected)
    brain.ack(first, accepted=False, reason="client laptop belongs to another user")
    second = brain.next_message()
    assert isinstance(second, ClientConnected) and second.session_id == first.session_id
    brain.ack(second)
    wait_for(lambda: "the brain accepted the announcement" in agent.output(), 120, "the agent to log the ack")
    assert "the brain rejected the announcement: client laptop belongs to another user" in agent.output()
    agent.proc.send_signal(signal.SIGINT)
    assert isinstance(brain.next_message(), ClientDisconnected)
    assert agent.proc.wait(120) == 0


def exit_code_within(agent: AgentProcess, timeout: float) -> int:
    try:
        return agent.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the agent still runs after {timeout}s:\n{agent.output()}") from None


NOT_ENROLLED = (
    f"not enrolled or revoked: ask the operator to run `vancetope clients enroll {CID} --user demo`"
)


@pytest.mark.parametrize("credentials", ["an unknown user", "none"])
def test_an_unenrolled_agent_is_told_so_and_exits_instead_of_retrying_forever(
    workspace: Workspace, redis_server: RedisServer, tmp_path: Path, credentials: str
) -> None:
    url = redis_server.address_url  # no credentials: the broker answers NOAUTH
    if credentials == "an unknown user":
        url = with_credentials(url, f"client-{CID}", "not-a-secret-it-knows")  # WRONGPASS
    agent = AgentProcess(workspace.config, url, tmp_path / "agent.log")
    try:
        code = exit_code_within(agent, timeout=120)
    finally:
        agent.stop()
    if credentials == "none":
        # No credential at all is refused before the broker is asked (exit 2), with the command
        # that makes one.
        assert code == 2, agent.output()
        assert f"this client has no credential: enroll it on the brain: vancetope clients enroll {CID}" in (
            agent.output()
        )
    else:
        assert code == 3, agent.output()
        assert NOT_ENROLLED in agent.output()
    assert "did not acknowledge" not in agent.output()


@pytest.mark.parametrize("how", ["revoked", "re-enrolled"])
def test_a_revoked_or_re_enrolled_agent_stops_with_the_reason(
    workspace: Workspace, brain_on_redis: Any, redis_server: RedisServer, tmp_path: Path, how: str
) -> None:
    """Re-enrolled: seen by a new user, the old agent went on taking calls it could not answer.
    An agent the brain accepted waits a refusal out for ``refused_grace_s`` first (2 s here)."""
    with workspace.config.open("a") as f:
        f.write("refused_grace_s = 2\n")
    credential = enroll(brain_on_redis.scheduler.presence, CID, "demo", redis_server.address_url)
    agent = AgentProcess(workspace.config, credential.broker_url, tmp_path / "agent.log")
    try:
        wait_for(
            lambda: brain_on_redis.hot.r.exists(client_key(CID, CLIENT_HEARTBEAT)),
            120,
            "the agent's heartbeat",
        )
        if how == "revoked":
            assert revoke(brain_on_redis.clients, CID)
        else:
            enroll(brain_on_redis.scheduler.presence, CID, "demo", redis_server.address_url)
        code = exit_code_within(agent, timeout=120)
    finally:
        agent.stop()
    assert code == 3, agent.output()
    assert NOT_ENROLLED in agent.output()


def test_an_agent_waits_out_a_redis_that_lost_its_user_until_the_brain_restores_it(
    workspace: Workspace, brain_on_redis: Any, redis_server: RedisServer, tmp_path: Path
) -> None:
    """A Redis restarted without its ACL users refuses every agent until the brain restores them
    from the store (its reconciler, every few seconds). The agents that came back first used to
    take that for a revocation and exit 3, which a service manager does not restart: a fleet
    lost at 09:00. Now an agent the brain accepted tries again for ``refused_grace_s``."""
    credential = enroll(brain_on_redis.scheduler.presence, CID, "demo", redis_server.address_url)
    stop = threading.Event()
    relay = Relay(brain_on_redis.intake, brain_on_redis.clients).run(stop)  # the brain's announcement desk
    agent = AgentProcess(workspace.config, credential.broker_url, tmp_path / "agent.log")
    try:
        wait_for(lambda: "the brain accepted the announcement" in agent.output(), 120, "the announcement")
        admin = redis.Redis.from_url(redis_server.url)
        admin.execute_command("ACL", "DELUSER", client_username(CID))  # as a restart without its users
        wait_for(lambda: "trying again for up to 60s" in agent.output(), 120, "the agent to be refused")
        time.sleep(3)  # several heartbeats refused meanwhile
        assert agent.proc.poll() is None, agent.output()
        brain_on_redis.sync_client_users()  # the reconciler's step: the store is the record
        wait_for(
            lambda: "the broker accepts this agent's credentials again" in agent.output(),
            120,
            "the agent back",
        )
        assert agent.proc.poll() is None, agent.output()
        admin.close()
    finally:
        agent.stop()
        stop.set()
        relay.join(10)
    assert NOT_ENROLLED not in agent.output()
