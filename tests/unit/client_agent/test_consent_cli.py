"""`vancetope-agent pending / approve / deny` as the workstation's user runs them (subprocesses,
no broker): MCP servers wait for their command to be approved."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import FIXTURES, ROOT


def agent_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: PLW1510 - callers assert on returncode
        [sys.executable, "-m", "client_agent", *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def workstation(tmp_path: Path) -> Path:
    (tmp_path / "sandbox").mkdir()
    demo = {
        "command": sys.executable,
        "args": [str(FIXTURES / "mcp_demo_server.py")],
        "env": {"TOKEN": "s3cr3t"},
    }
    (tmp_path / "mcp.json").write_text(json.dumps({"mcpServers": {"demo": demo}}))
    config = tmp_path / "agent.toml"
    config.write_text(
        '[agent]\nclient_id = "box"\nuser = "u"\nbroker_url = "redis://127.0.0.1:1/0"\n'
        'sandbox_roots = ["sandbox"]\nmcp_json = "mcp.json"\n'
    )
    return config


def test_an_unapproved_server_is_not_started_and_pending_shows_its_exact_command(tmp_path: Path) -> None:
    config = str(workstation(tmp_path))
    tools = agent_cli("tools", "--config", config)
    assert tools.returncode == 0, tools.stderr
    assert "pid" not in tools.stdout and "waiting for the workstation's user" in " ".join(
        tools.stdout.split()
    )
    pending = agent_cli("pending", "--config", config)
    assert str(FIXTURES / "mcp_demo_server.py") in pending.stdout
    assert "environment variables: TOKEN" in pending.stdout and "s3cr3t" not in pending.stdout
    assert (tmp_path / ".vancetope-agent" / "consent").stat().st_mode & 0o777 == 0o700

    (request,) = json.loads(agent_cli("pending", "--json", "--config", config).stdout)
    assert agent_cli("approve", request["id"], "--config", config).returncode == 0
    assert "pid" in agent_cli("tools", "--config", config).stdout
    assert json.loads(agent_cli("pending", "--json", "--config", config).stdout) == []


def test_approve_all_servers_is_the_explicit_unattended_setup(tmp_path: Path) -> None:
    config = str(workstation(tmp_path))
    proc = agent_cli("approve", "--all-servers", "--config", config)
    assert proc.returncode == 0, proc.stderr
    assert "approved MCP server 'demo'" in proc.stdout and "mcp_demo_server.py" in proc.stdout
    assert "pid" in agent_cli("tools", "--config", config).stdout


def test_unknown_or_missing_ids_are_refused_with_what_to_do(tmp_path: Path) -> None:
    config = str(workstation(tmp_path))
    unknown = agent_cli("deny", "c-00000000", "--config", config)
    assert unknown.returncode == 1 and "vancetope-agent pending" in unknown.stderr
    nothing = agent_cli("approve", "--config", config)
    assert nothing.returncode == 2 and "--all-servers" in nothing.stderr
