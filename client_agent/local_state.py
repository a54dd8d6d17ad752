"""What a running agent leaves on its own workstation (layer: client_agent).

One job: ``<data_dir>/agent.json``, the agent's pid, session, last successful heartbeat and
what it made of its ``mcp.json``, written atomically by the running agent and read by
``vancetope-agent status`` (which has no other way to know whether this agent runs when no
service manager started it, whether it is connected, or why an edit of ``mcp.json`` did not
load). Nothing secret goes here. Time is passed in, never read.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

STATE_FILE = "agent.json"


class MCPJsonState(BaseModel):
    """What the agent made of its ``mcp.json``: the servers in use, and why the last load did not
    replace them, or why some servers are not running (the messages it logs, which name servers,
    keys and variables, not their values)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    path: str
    loaded_at: float | None = None  # when the servers in use were loaded from it (None: never)
    servers: list[str] = Field(default_factory=list)  # those whose tools are offered
    tools: int = 0
    # The last load of the file failed as a whole (an edit that does not load): why, and when.
    error: str | None = None
    error_at: float | None = None
    # Servers whose edit could not be used and whose last good definition runs, and why.
    kept: dict[str, str] = Field(default_factory=dict)
    # Servers not running (skipped, failed to start, waiting for approval), and why.
    failed: dict[str, str] = Field(default_factory=dict)


class AgentState(BaseModel):
    """One agent process, as it last described itself."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    client_id: str
    pid: int
    session_id: str
    started_at: float
    # The last heartbeat the broker took, and whether the brain had accepted this session's
    # announcement by then: both together are what "connected" means.
    heartbeat_at: float | None = None
    accepted: bool = False
    heartbeat_ttl_s: float = 6.0
    log_file: str | None = None
    mcp_json: MCPJsonState | None = None  # None: no mcp_json in the config (or not loaded yet)


def state_path(data_dir: Path) -> Path:
    return data_dir / STATE_FILE


def write_state(data_dir: Path, state: AgentState) -> None:
    """Write-then-rename, so a reader never sees half a file; the folder is the user's only (0700)."""
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = state_path(data_dir)
    tmp = path.with_name(f".{STATE_FILE}.{os.getpid()}.tmp")
    tmp.write_text(state.model_dump_json(), encoding="utf-8")
    tmp.replace(path)


def read_state(data_dir: Path) -> AgentState | None:
    """The last state written, or None (never ran here, stopped cleanly, or unreadable)."""
    try:
        return AgentState.model_validate_json(state_path(data_dir).read_text(encoding="utf-8"))
    except (OSError, ValidationError, json.JSONDecodeError, UnicodeDecodeError):
        return None


def clear_state(data_dir: Path, pid: int) -> None:
    """Remove the state file if it is still this process's (a newer agent may have replaced it)."""
    state = read_state(data_dir)
    if state is not None and state.pid == pid:
        with contextlib.suppress(OSError):
            state_path(data_dir).unlink()


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (it may belong to someone else: EPERM counts)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def heartbeat_recent(state: AgentState, now: float) -> bool:
    """The broker took a heartbeat within its TTL: the brain still counts this agent as present."""
    return state.heartbeat_at is not None and 0 <= now - state.heartbeat_at <= state.heartbeat_ttl_s
