"""client_agent.status: the judgement (pure, a table) and the enrollment check against a real
redis-server that requires a password (the agent's real broker is an ACL'd Redis)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from brain.stack.redis_server import RedisServer
from client_agent.local_state import AgentState, MCPJsonState
from client_agent.service import ServiceKind, ServiceState
from client_agent.status import Enrollment, Facts, StatusExit, assess, check_enrollment, describe
from workers.urls import with_credentials

NOW = 1000.0
ENROLLED = Enrollment(True, "the broker accepts its credential")
REFUSED = Enrollment(False, "the broker refused its credential (WRONGPASS): not enrolled or revoked")
UNREACHABLE = Enrollment(None, "unknown: cannot reach the broker (refused)")
ACTIVE = ServiceState(loaded=True, running=True, pid=77, detail="active (running), enabled")
FAILED = ServiceState(loaded=True, running=False, pid=None, detail="failed (failed), enabled")


def state(heartbeat_age: float | None, accepted: bool = True, pid: int = 77) -> AgentState:
    beat = None if heartbeat_age is None else NOW - heartbeat_age
    return AgentState(client_id="laptop", pid=pid, session_id="s", started_at=NOW - 60, heartbeat_at=beat,
                      accepted=accepted, heartbeat_ttl_s=6.0)  # fmt: skip


def facts(
    service: ServiceState | None = None,
    agent: AgentState | None = None,
    alive: bool = True,
    enrollment: Enrollment = ENROLLED,
) -> Facts:
    return Facts(
        client_id="laptop", config=Path("/a/agent.toml"), kind=ServiceKind.SYSTEMD,
        service_file=Path("/h/.config/systemd/user/vancetope-agent.service"), installed=service is not None,
        service=service, service_error=None, state=agent, state_pid_alive=alive, enrollment=enrollment,
        log_file=Path("/h/agent.log"), now=NOW,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("f", "running", "connected", "code", "connection"),
    [
        (facts(ACTIVE, state(1.0)), True, True, StatusExit.OK, "last heartbeat 1s ago, announcement accepted"),
        # Started by hand, no service: the recorded pid is alive.
        (facts(None, state(2.0)), True, True, StatusExit.OK, "last heartbeat 2s ago, announcement accepted"),
        (facts(ACTIVE, state(30.0)), True, False, StatusExit.NOT_CONNECTED, "last heartbeat 30s ago (over its 6s TTL)"),
        (facts(ACTIVE, state(1.0, accepted=False)), True, False, StatusExit.NOT_CONNECTED,
         "heartbeat 1s ago, but the brain has not accepted its announcement yet"),
        (facts(ACTIVE, state(None)), True, False, StatusExit.NOT_CONNECTED,
         "no heartbeat yet (starting, or the broker is unreachable)"),
        (facts(ACTIVE, None), True, False, StatusExit.NOT_CONNECTED,
         "no agent process of this config has recorded a heartbeat"),
        # Killed: its file is left behind, but its pid is gone.
        (facts(FAILED, state(1.0), alive=False), False, False, StatusExit.NOT_RUNNING, "not running"),
        (facts(None, None), False, False, StatusExit.NOT_RUNNING, "not running"),
        # Not enrolled wins: it is what the user must fix first.
        (facts(None, None, enrollment=REFUSED), False, False, StatusExit.NOT_ENROLLED, "not running"),
        (facts(ACTIVE, state(1.0), enrollment=REFUSED), True, True, StatusExit.NOT_ENROLLED,
         "last heartbeat 1s ago, announcement accepted"),
        # An unreachable broker leaves enrollment unknown; it does not decide the exit code.
        (facts(ACTIVE, state(1.0), enrollment=UNREACHABLE), True, True, StatusExit.OK,
         "last heartbeat 1s ago, announcement accepted"),
    ],
)  # fmt: skip
def test_assess_judges_running_connected_and_enrolled(
    f: Facts, running: bool, connected: bool, code: StatusExit, connection: str
) -> None:
    status = assess(f)
    assert (status.running, status.connected, status.exit_code, status.connection) == (
        running, connected, int(code), connection
    )  # fmt: skip


def test_describe_answers_each_question_on_its_own_line() -> None:
    text = describe(assess(facts(ACTIVE, state(1.0))))
    assert text.splitlines() == [
        "client agent laptop (/a/agent.toml): running, connected and enrolled",
        "  service:   installed (/h/.config/systemd/user/vancetope-agent.service): active (running), enabled",
        "  running:   yes, pid 77",
        "  connected: yes, last heartbeat 1s ago, announcement accepted",
        "  enrolled:  yes, the broker accepts its credential",
        "  log:       /h/agent.log",
    ]
    assert "not installed" in describe(assess(facts(None, None)))


@pytest.fixture(scope="module")
def locked_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A redis-server that serves nobody without credentials, with one user vtc-box."""
    server = RedisServer(tmp_path_factory.mktemp("redis"), appendonly=False).start()
    admin = redis.Redis.from_url(server.url)
    admin.acl_setuser("vtc-box", enabled=True, passwords=["+right"], commands=["+ping"])
    admin.close()
    try:
        yield server.address_url
    finally:
        server.stop()


def test_enrollment_is_a_ping_with_the_agents_own_credential(locked_redis: str) -> None:
    assert check_enrollment(with_credentials(locked_redis, "vtc-box", "right")).enrolled is True
    wrong = check_enrollment(with_credentials(locked_redis, "vtc-box", "wrong"))
    assert wrong.enrolled is False and "not enrolled or revoked" in wrong.detail
    none = check_enrollment(locked_redis)
    assert none.enrolled is False and none.detail.startswith("no credential")
    unreachable = check_enrollment("redis://u:p@127.0.0.1:1/0", timeout_s=1)
    assert unreachable.enrolled is None and unreachable.detail.startswith("unknown: cannot reach the broker")


def clock(at: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at))


def test_status_says_why_an_edit_of_mcp_json_did_not_load_and_what_stays_in_use() -> None:
    mcp = MCPJsonState(
        path="/a/mcp.json", loaded_at=NOW - 50, servers=["demo", "git"], tools=9,
        error="/a/mcp.json: not valid JSON: Expecting ',' delimiter at line 4 column 7", error_at=NOW - 5,
        kept={"git": "/a/mcp.json: server 'git': unknown key 'arg' (did you mean 'args'?); ..."},
        failed={"missing": "command not found: no-such-server"},
    )  # fmt: skip
    status = assess(facts(ACTIVE, state(1.0).model_copy(update={"mcp_json": mcp})))
    assert status.exit_code == StatusExit.OK  # shown, not judged: the agent runs and serves
    assert status.to_json()["mcp_json"] == mcp.model_dump()
    assert describe(status).splitlines()[6:] == [
        f"  mcp.json:  /a/mcp.json: 9 MCP tools from demo, git, loaded at {clock(NOW - 50)}",
        (
            f"             did not load at {clock(NOW - 5)}, keeping the MCP servers in use: "
            "/a/mcp.json: not valid JSON: Expecting ',' delimiter at line 4 column 7"
        ),
        "             kept: /a/mcp.json: server 'git': unknown key 'arg' (did you mean 'args'?); ...",
        "             not running: missing: command not found: no-such-server",
    ]
    never = MCPJsonState(
        path="/a/mcp.json", error='/a/mcp.json: missing the "mcpServers" object', error_at=NOW
    )
    lines = describe(assess(facts(ACTIVE, state(1.0).model_copy(update={"mcp_json": never})))).splitlines()
    assert lines[6:] == [
        "  mcp.json:  /a/mcp.json: no MCP tools (it never loaded)",
        (
            f"             did not load at {clock(NOW)}, no MCP tools offered: "
            '/a/mcp.json: missing the "mcpServers" object'
        ),
    ]
    # an agent that is not running says nothing of its mcp.json
    gone = assess(facts(FAILED, state(1.0).model_copy(update={"mcp_json": mcp}), alive=False))
    assert gone.mcp_json is None and "mcp.json" not in describe(gone)
