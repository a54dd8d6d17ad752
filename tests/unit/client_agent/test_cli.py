"""vancetope-agent's command line as a real subprocess: help, `tools` without a broker, config errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from client_agent.config import load_config
from tests.conftest import EXAMPLES, FIXTURES, ROOT


def agent_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "250"}
    return subprocess.run(
        [sys.executable, "-m", "client_agent", *args],
        check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


@pytest.mark.parametrize("command", [[], ["run"], ["tools"]])
def test_every_command_has_help(command: list[str]) -> None:
    proc = agent_cli(*command, "--help")
    assert proc.returncode == 0 and "Usage: " in proc.stdout
    if command:
        assert "--config" in proc.stdout


def test_tools_shows_the_announcement_and_the_failed_servers_without_a_broker(tmp_path: Path) -> None:
    (tmp_path / "sandbox").mkdir()
    (tmp_path / "mcp.json").write_text(json.dumps({"mcpServers": {
        "demo": {"command": sys.executable, "args": [str(FIXTURES / "mcp_demo_server.py")]},
        "crash": {"command": sys.executable, "args": [str(FIXTURES / "mcp_crash_server.py")]},
    }}))  # fmt: skip
    (tmp_path / "agent.toml").write_text(
        '[agent]\nclient_id = "box"\nuser = "u"\nbroker_url = "redis://127.0.0.1:1/0"\n'
        'sandbox_roots = ["sandbox"]\nmcp_json = "mcp.json"\ntrust_mcp_servers = ["demo", "crash"]\n'
    )
    proc = agent_cli("tools", "--config", str(tmp_path / "agent.toml"))
    assert proc.returncode == 0, proc.stderr
    for name in ("read_local_file", "list_directory", "git_status", "add", "pid"):
        assert name in proc.stdout
    assert "shell_execute is not offered: shell_enabled = false" in proc.stdout
    assert "MCP servers that failed" in proc.stdout and "demo crash: missing API token" in proc.stdout


def test_a_config_error_exits_2_with_the_message(tmp_path: Path) -> None:
    (tmp_path / "agent.toml").write_text('[agent]\nclient_id = "box"\n')
    proc = agent_cli("run", "--config", str(tmp_path / "agent.toml"))
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"error: {tmp_path / 'agent.toml'}: [agent]: user: is required"


NO_CREDENTIAL = (
    "error: this client has no credential: enroll it on the brain: vancetope clients enroll {id} "
    "--user {user} --output {id}.credential, then set credential_file"
)


@pytest.mark.parametrize(
    "broker_line",
    ['broker_url = "redis://127.0.0.1:6379/0"\n', 'broker_url = "redis://vtc-box@127.0.0.1:1/0"\n', ""],
    ids=["placeholder-url", "user-without-password", "no-url"],
)
def test_run_without_a_credential_stops_at_once_saying_how_to_enroll(
    tmp_path: Path, broker_line: str
) -> None:
    # Before: the agent retried 127.0.0.1:6379 for ever with no hint (or said "broker_url: is required").
    (tmp_path / "agent.toml").write_text(f'[agent]\nclient_id = "box"\nuser = "u"\n{broker_line}')
    proc = agent_cli("run", "--config", str(tmp_path / "agent.toml"), timeout=30)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == NO_CREDENTIAL.format(id="box", user="u")


def test_the_example_config_without_a_credential_is_refused_by_run(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VANCETOPE_AGENT_")}
    proc = subprocess.run(
        [sys.executable, "-m", "client_agent", "run", "--config", str(EXAMPLES / "agent" / "agent.toml")],
        check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip() == NO_CREDENTIAL.format(id="laptop", user="demo")


def test_tools_needs_no_broker_url(tmp_path: Path) -> None:
    (tmp_path / "sandbox").mkdir()
    (tmp_path / "agent.toml").write_text(
        '[agent]\nclient_id = "box"\nuser = "u"\nsandbox_roots = ["sandbox"]\n'
    )
    proc = agent_cli("tools", "--config", str(tmp_path / "agent.toml"))
    assert proc.returncode == 0, proc.stderr
    assert "read_local_file" in proc.stdout


def test_the_example_config_loads() -> None:
    config = load_config(EXAMPLES / "agent" / "agent.toml", environ={})
    assert (config.client_id, config.user) == ("laptop", "demo")
    assert config.sandbox_roots == ((EXAMPLES / "agent" / "sandbox").resolve(),)
    assert config.mcp_json == (EXAMPLES / "agent" / "mcp.json").resolve()
    assert (EXAMPLES / "agent" / "sandbox" / "notes.txt").read_text().strip()
