"""client_agent.local_state: the file a running agent leaves for `vancetope-agent status`."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from client_agent.local_state import (
    AgentState,
    MCPJsonState,
    clear_state,
    heartbeat_recent,
    pid_alive,
    read_state,
    state_path,
    write_state,
)

STATE = AgentState(
    client_id="laptop", pid=os.getpid(), session_id="s1", started_at=100.0, heartbeat_ttl_s=6.0
)


def test_state_round_trips_through_a_private_folder(tmp_path: Path) -> None:
    data_dir = tmp_path / "state"
    write_state(data_dir, STATE)
    assert read_state(data_dir) == STATE
    assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
    assert [p.name for p in data_dir.iterdir()] == ["agent.json"]  # no temporary file left


def test_what_the_agent_made_of_its_mcp_json_round_trips(tmp_path: Path) -> None:
    mcp = MCPJsonState(
        path="/h/mcp.json", loaded_at=90.0, servers=["git"], tools=3, error="/h/mcp.json: not valid JSON",
        error_at=99.0, kept={"git": "why kept"}, failed={"crash": "exited"},
    )  # fmt: skip
    state = STATE.model_copy(update={"mcp_json": mcp})
    write_state(tmp_path, state)
    assert read_state(tmp_path) == state


def test_missing_or_broken_state_reads_as_none(tmp_path: Path) -> None:
    assert read_state(tmp_path) is None
    state_path(tmp_path).write_text("{not json")
    assert read_state(tmp_path) is None


def test_clear_state_leaves_a_newer_agents_file_alone(tmp_path: Path) -> None:
    write_state(tmp_path, STATE)
    clear_state(tmp_path, pid=STATE.pid + 1)
    assert read_state(tmp_path) == STATE
    clear_state(tmp_path, pid=STATE.pid)
    assert read_state(tmp_path) is None


def test_pid_alive_tells_a_live_process_from_an_exited_one() -> None:
    assert pid_alive(os.getpid())
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True, timeout=30)  # fmt: skip
    assert not pid_alive(int(proc.stdout))  # reaped: that pid is free (or reused, rarely)
    assert not pid_alive(0) and not pid_alive(-1)


@pytest.mark.parametrize(
    ("heartbeat_at", "now", "recent"),
    [
        (None, 100.0, False),
        (100.0, 100.0, True),
        (100.0, 106.0, True),
        (100.0, 106.1, False),
        (100.0, 99.0, False),
    ],
)
def test_a_heartbeat_is_recent_within_its_ttl(heartbeat_at: float | None, now: float, recent: bool) -> None:
    assert heartbeat_recent(STATE.model_copy(update={"heartbeat_at": heartbeat_at}), now) is recent
