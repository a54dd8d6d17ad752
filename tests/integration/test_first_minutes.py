"""A new user's first ten minutes (issue 6), each as it was tried: real CLI subprocesses."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, wait_until
from tests.integration.test_cli import vancetope

pytestmark = pytest.mark.integration


def flat(text: str) -> str:
    """Output with rich's line wrapping undone."""
    return " ".join(text.split())


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_an_invalid_tree_is_refused_before_the_embedded_stack_starts(tmp_path: Path) -> None:
    data = tmp_path / "data"
    bad_args = write(
        tmp_path / "bad.yaml", "id: t\ntasks:\n  - {id: a, tool: sleep, args: {seconds: soon}}\n"
    )
    proc = vancetope("run", str(bad_args), data=data)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "task 'a'" in proc.stderr and "seconds" in proc.stderr
    assert "starting the embedded stack" not in proc.stderr
    # Nothing was started: the stack makes its log and Redis folders first thing.
    assert not (data / "logs").exists() and not (data / "redis").exists()


def test_explain_shows_a_server_that_cannot_start_with_its_command_stderr_and_the_missing_tools(
    tmp_path: Path,
) -> None:
    missing_script = tmp_path / "gone" / "weather_server.py"
    config = {"mcpServers": {"weather": {"command": sys.executable, "args": [str(missing_script)]}}}
    mcp = write(tmp_path / "server-mcp.json", json.dumps(config))
    tree = write(
        tmp_path / "t.yaml",
        "id: t\ntasks:\n  - {id: now, tool: echo, args: {value: 1}}\n  - {id: rain, tool: forecast}\n",
    )
    proc = vancetope("--mcp-config", str(mcp), "explain", str(tree), data=tmp_path / "data")
    # Nothing declares `forecast` (only the server that failed would have offered it), so the
    # tree is refused as `run` would refuse it, every problem at once, naming the failed server.
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = flat(proc.stderr)
    assert "MCP server 'weather' failed to start" in err
    assert str(missing_script) in err  # the command, so the user sees what was run
    assert "No such file or directory" in err  # the server's own stderr
    assert "task 'rain': tool 'forecast' is unknown" in err
    assert "MCP server(s) 'weather' failed to start, so their tools are missing" in err


def test_explain_of_a_runnable_tree_exits_zero_even_when_an_unused_server_fails(tmp_path: Path) -> None:
    config = {"mcpServers": {"weather": {"command": sys.executable, "args": [str(tmp_path / "gone.py")]}}}
    mcp = write(tmp_path / "server-mcp.json", json.dumps(config))
    tree = write(tmp_path / "t.yaml", "id: t\ntasks:\n  - {id: now, tool: echo, args: {value: 1}}\n")
    proc = vancetope("--mcp-config", str(mcp), "explain", str(tree), data=tmp_path / "data")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 task(s), valid" in flat(proc.stdout)
    assert "MCP server 'weather' failed to start" in flat(proc.stderr)


def test_a_tool_the_stacks_agent_announces_is_not_called_unknown(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "-C", str(repo), "init", "-q"], check=True)
    git_server = {
        "command": str(Path(sys.executable).parent / "mcp-server-git"),
        "args": ["--repository", str(repo)],
    }
    mcp_json = write(tmp_path / "mcp.json", json.dumps({"mcpServers": {"git": git_server}}))
    # The stack's agent (examples/agent/agent.toml) with this mcp.json: it announces git_branch.
    agent_env = {"VANCETOPE_AGENT_MCP_JSON": str(mcp_json)}
    tree = write(
        tmp_path / "git.yaml",
        f"id: g\ntasks:\n  - {{id: branches, tool: git_branch, args: {{repo_path: {repo}, branch_type: local}}}}\n",
    )
    with_agent = vancetope("run", str(tree), "--timeout", "60", data=tmp_path / "data", env=agent_env)
    assert "git_branch" in with_agent.stdout, with_agent.stdout + with_agent.stderr
    assert "is not in the registry" not in flat(with_agent.stderr)
    # Without the agent nobody declares or announces it: the tree is refused before it is
    # submitted (exit 2), naming the tool.
    without = vancetope(
        "run", str(tree), "--no-agent", "--timeout", "60", data=tmp_path / "data2", env=agent_env
    )
    assert "task 'branches': tool 'git_branch' is unknown" in flat(without.stderr), without.stderr
    assert without.returncode == 2


def test_up_keeps_the_stack_running_when_the_flower_port_is_taken(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with open(tmp_path / "up.log", "w") as up_log:
            up = subprocess.Popen(
                [sys.executable, "-m", "brain", "up", "--no-agent", "--flower-port", str(port)],
                cwd=ROOT,
                env={**os.environ, "VANCETOPE_DATA_DIR": str(data), "COLUMNS": "250"},
                stdout=up_log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            wait_until(
                lambda: "stack up" in (tmp_path / "up.log").read_text(),
                timeout=120,
                what="the stack to be up",
            )
            log = (tmp_path / "up.log").read_text()
            assert f"flower not started: 127.0.0.1:{port} is already in use" in log
            assert "--flower-port" in log
            # The rest of the stack serves: a tree runs on it.
            tree = write(tmp_path / "t.yaml", "id: t\ntasks:\n  - {id: a, tool: echo, args: {value: 1}}\n")
            run = vancetope("run", str(tree), "--timeout", "60", data=data)
            assert run.returncode == 0, run.stdout + run.stderr
            assert up.poll() is None
            # Nothing stopped it before the Ctrl-C below (its own "stopping the stack…" line).
            assert "stopping" not in (tmp_path / "up.log").read_text().lower()
        finally:
            if up.poll() is None:
                os.killpg(up.pid, signal.SIGINT)
                up.wait(120)
    assert "stopping the stack…" in (tmp_path / "up.log").read_text()


def test_one_unusable_mcp_server_entry_does_not_take_the_others_tools_away(tmp_path: Path) -> None:
    servers = {
        "time": {"command": sys.executable, "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"]},
        "old": {"type": "sse", "url": "http://127.0.0.1:9/sse"},
        "off": {"command": "never-started", "disabled": True},
    }
    mcp = write(tmp_path / "server-mcp.json", json.dumps({"mcpServers": servers}))
    tree = write(
        tmp_path / "t.yaml", "id: t\ntasks:\n  - {id: now, tool: get_current_time, args: {timezone: UTC}}\n"
    )
    proc = vancetope("--mcp-config", str(mcp), "explain", str(tree), data=tmp_path / "data")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 task(s), valid" in flat(proc.stdout)
    err = flat(proc.stderr)
    assert "server 'old': unsupported type 'sse'" in err and "server 'off' is disabled in the file" in err


@pytest.mark.parametrize("command", ["explain", "run"])
def test_an_mcp_config_that_does_not_load_is_one_line_and_exit_2(tmp_path: Path, command: str) -> None:
    """Issue 24: `vancetope --mcp-config bad.json explain t.json` ended in a 56-line traceback, exit 1."""
    mcp = write(tmp_path / "bad.json", '{"mcpServers": {"x": {"command": "python", "args": [}}')
    tree = write(tmp_path / "t.yaml", "id: t\ntasks:\n  - {id: now, tool: echo, args: {value: 1}}\n")
    proc = vancetope("--mcp-config", str(mcp), command, str(tree), data=tmp_path / "data")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip() and "vancetope.toml" not in line]
    assert len(lines) == 1 and lines[0].startswith(f"error: {mcp}: not valid JSON"), proc.stderr
    assert "Traceback" not in proc.stderr
