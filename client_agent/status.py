"""``vancetope-agent status``: does this agent run, is it connected, is it enrolled (layer: client_agent).

One job: gather the facts (the service manager's view, the state file the agent writes,
one PING with the agent's own credential) and judge them purely in ``assess``, which
also picks the exit code. "Connected" means the broker took a heartbeat within its TTL
and the brain had accepted this session's announcement: what the brain itself requires.
A running agent's state also says what it made of its ``mcp.json`` (the MCP tools it offers,
an edit that did not load and why, servers not running and why): shown, not judged.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from enum import IntEnum
from pathlib import Path
from typing import Any

import redis

from client_agent.config import AgentConfig
from client_agent.local_state import AgentState, heartbeat_recent, pid_alive, read_state
from client_agent.service import ServiceKind, ServiceState
from workers.redis_connect import redis_client
from workers.urls import url_password

PING_TIMEOUT_S = 3.0


class StatusExit(IntEnum):
    OK = 0  # running, connected, enrolled
    NOT_CONNECTED = 1  # running, but no recent heartbeat or no accepted announcement
    BAD_CONFIG = 2
    NOT_ENROLLED = 3  # no credential, or the broker refuses it (revoked)
    NOT_RUNNING = 4


@dataclass(frozen=True)
class Enrollment:
    enrolled: bool | None  # None: unknown (the broker could not be reached)
    detail: str


def check_enrollment(
    broker_url: str | None, timeout_s: float = PING_TIMEOUT_S, master: str | None = None
) -> Enrollment:
    """One PING with the agent's own credential: WRONGPASS/NOAUTH means not enrolled or revoked."""
    if broker_url is None or url_password(broker_url) is None:
        return Enrollment(False, "no credential: set credential_file to the file `vancetope clients enroll "
                                 "--output` wrote")  # fmt: skip
    client = redis_client(
        broker_url, master=master, socket_connect_timeout=timeout_s, socket_timeout=timeout_s
    )
    try:
        client.ping()
    except redis.AuthenticationError as exc:
        return Enrollment(False, f"the broker refused its credential ({exc}): not enrolled or revoked")
    except redis.RedisError as exc:
        return Enrollment(None, f"unknown: cannot reach the broker ({exc})")
    finally:
        client.close()
    return Enrollment(True, "the broker accepts its credential")


@dataclass(frozen=True)
class Facts:
    client_id: str
    config: Path
    kind: ServiceKind | None
    service_file: Path | None
    installed: bool
    service: ServiceState | None
    service_error: str | None  # the service manager could not be asked
    state: AgentState | None
    state_pid_alive: bool
    enrollment: Enrollment
    log_file: Path | None
    now: float


@dataclass(frozen=True)
class Status:
    client_id: str
    config: str
    service: dict[str, Any]
    running: bool
    pid: int | None
    connected: bool
    connection: str
    heartbeat_age_s: float | None
    enrolled: bool | None
    enrollment: str
    log_file: str | None
    exit_code: int
    summary: str
    mcp_json: dict[str, Any] | None = None  # a running agent's MCPJsonState

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def assess(f: Facts) -> Status:
    """Running: the service manager says so, or the pid the agent recorded is alive. Exit code:
    not enrolled (3) before not running (4) before not connected (1), else 0."""
    live_state = f.state if f.state is not None and f.state_pid_alive else None
    by_service = f.service is not None and f.service.running
    running = by_service or live_state is not None
    pid = (f.service.pid if by_service and f.service is not None else None) or (
        live_state.pid if live_state else None
    )
    connected, connection, age = _connection(live_state, running, f.now)
    code = (
        StatusExit.NOT_ENROLLED if f.enrollment.enrolled is False
        else StatusExit.NOT_RUNNING if not running
        else StatusExit.NOT_CONNECTED if not connected
        else StatusExit.OK
    )  # fmt: skip
    mcp = None if live_state is None else live_state.mcp_json
    mcp_json = None if mcp is None else mcp.model_dump()
    summary = {
        StatusExit.OK: "running, connected and enrolled",
        StatusExit.NOT_CONNECTED: "running but not connected",
        StatusExit.NOT_ENROLLED: "not enrolled or revoked",
        StatusExit.NOT_RUNNING: "not running",
    }[code]
    return Status(
        client_id=f.client_id, config=str(f.config), service=_service(f), running=running, pid=pid,
        connected=connected, connection=connection, heartbeat_age_s=age,
        enrolled=f.enrollment.enrolled, enrollment=f.enrollment.detail,
        log_file=None if f.log_file is None else str(f.log_file), exit_code=int(code), summary=summary,
        mcp_json=mcp_json,
    )  # fmt: skip


def _connection(state: AgentState | None, running: bool, now: float) -> tuple[bool, str, float | None]:
    if state is None:
        why = "no agent process of this config has recorded a heartbeat" if running else "not running"
        return False, why, None
    if state.heartbeat_at is None:
        return False, "no heartbeat yet (starting, or the broker is unreachable)", None
    age = round(now - state.heartbeat_at, 1)
    if not heartbeat_recent(state, now):
        return False, f"last heartbeat {age:g}s ago (over its {state.heartbeat_ttl_s:g}s TTL)", age
    if not state.accepted:
        return False, f"heartbeat {age:g}s ago, but the brain has not accepted its announcement yet", age
    return True, f"last heartbeat {age:g}s ago, announcement accepted", age


def _service(f: Facts) -> dict[str, Any]:
    out: dict[str, Any] = {
        "manager": None if f.kind is None else f.kind.value,
        "file": None if f.service_file is None else str(f.service_file),
        "installed": f.installed,
    }
    if f.service is not None:
        out.update(
            loaded=f.service.loaded, running=f.service.running, pid=f.service.pid, state=f.service.detail
        )
    if f.service_error is not None:
        out["error"] = f.service_error
    return out


def gather(
    config: AgentConfig,
    config_path: Path,
    kind: ServiceKind | None,
    service_file: Path | None,
    service: ServiceState | None,
    service_error: str | None,
    log_file: Path | None,
) -> Facts:
    state = read_state(config.data_dir)
    if state is not None and state.client_id != config.client_id:
        state = None  # another client's agent used this data_dir: not ours to report
    return Facts(
        client_id=config.client_id, config=config_path, kind=kind, service_file=service_file,
        installed=service_file is not None and service_file.exists(), service=service,
        service_error=service_error, state=state, state_pid_alive=state is not None and pid_alive(state.pid),
        enrollment=check_enrollment(config.broker_url, master=config.redis_sentinel_master),
        log_file=Path(state.log_file) if state is not None and state.log_file else log_file, now=time.time(),
    )  # fmt: skip


def describe(s: Status) -> str:
    """The human form: one line per question."""
    svc = s.service
    if svc["manager"] is None:
        service = "no service manager supported on this platform"
    elif not svc["installed"]:
        service = f"not installed ({svc['file']} absent; `vancetope-agent install` adds it)"
    elif "error" in svc:
        service = f"installed ({svc['file']}), but {svc['error']}"
    else:
        service = f"installed ({svc['file']}): {svc.get('state', 'unknown')}"
    running = f"yes, pid {s.pid}" if s.running and s.pid else "yes" if s.running else "no"
    connected = ("yes, " if s.connected else "no: ") + s.connection
    enrolled = {True: "yes, ", False: "no: ", None: ""}[s.enrolled] + s.enrollment
    lines = [
        f"client agent {s.client_id} ({s.config}): {s.summary}",
        f"  service:   {service}",
        f"  running:   {running}",
        f"  connected: {connected}",
        f"  enrolled:  {enrolled}",
    ]
    if s.log_file:
        lines.append(f"  log:       {s.log_file}")
    if s.mcp_json is not None:
        lines += _mcp_lines(s.mcp_json)
    return "\n".join(lines)


def _mcp_lines(m: dict[str, Any]) -> list[str]:
    """What the agent offers of its mcp.json; then why the last edit did not load (the servers
    in use stay), which servers run their last good definition, which do not run."""
    pad = " " * len("  mcp.json:  ")
    if m["loaded_at"] is None:
        lines = [f"  mcp.json:  {m['path']}: no MCP tools (it never loaded)"]
    else:
        servers = f" from {', '.join(m['servers'])}" if m["servers"] else ""
        lines = [
            f"  mcp.json:  {m['path']}: {m['tools']} MCP tools{servers}, loaded at {_clock(m['loaded_at'])}"
        ]
    if m["error"]:
        kept = "keeping the MCP servers in use" if m["loaded_at"] is not None else "no MCP tools offered"
        lines.append(f"{pad}did not load at {_clock(m['error_at'])}, {kept}: {m['error']}")
    lines += [f"{pad}kept: {why}" for why in m["kept"].values()]
    lines += [f"{pad}not running: {server}: {why}" for server, why in m["failed"].items()]
    return lines


def _clock(at: float | None) -> str:
    return "?" if at is None else time.strftime("%H:%M:%S", time.localtime(at))
