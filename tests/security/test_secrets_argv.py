"""Issue 20, H7: a ``${vault:NAME}`` never reaches a command line.

Resolved into an MCP server's ``args``, a secret is in clear in ``ps`` and /proc/<pid>/cmdline
for every local user. Such a server is refused when the config is loaded — by explain, by a
reload and by the brain's start (all three build the registry the same way) — with an error
naming the server, the argument and what to do instead; the server never starts, the
others do. Through ``env`` the same secret still reaches its server (tests/integration/
test_vault.py runs that end to end).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from brain.runtime.registry import build_registry
from brain.runtime.reload import Reloader
from brain.runtime.service import Brain
from tests.conftest import ROOT, demo_server, make_settings, write_mcp_config
from workers.mcp_config import parse_mcp_config


def _config(tmp_path: Path) -> Path:
    marker = tmp_path / "argv-server-ran"  # the refused server would make it if it ever ran
    return write_mcp_config(
        tmp_path / "server-mcp.json",
        {
            "argv_secret": {
                "command": sys.executable,
                "args": ["-c", f"open({str(marker)!r}, 'w')", "--token=${vault:GITHUB_TOKEN}"],
            },
            "demo": demo_server(),
        },
    )


def _expected(tmp_path: Path) -> list[str]:
    return [
        f"{tmp_path / 'server-mcp.json'}: server 'argv_secret': args[2] holds ${{vault:GITHUB_TOKEN}}",
        "readable by every local user (ps, /proc/<pid>/cmdline)",
        'Pass it through "env" instead, e.g. "env": {"GITHUB_TOKEN": "${vault:GITHUB_TOKEN}"}',
    ]


def test_a_vault_reference_in_args_or_command_is_refused_naming_the_place() -> None:
    text = """{"mcpServers": {
        "a": {"command": "srv", "args": ["--x", "--token=${vault:my.token}"]},
        "b": {"command": "${vault:CMD}"},
        "c": {"command": "srv", "env": {"T": "${vault:my.token}"}, "args": ["--plain"]}
    }}"""
    config = parse_mcp_config(text, "cfg.json", environ={})
    assert list(config.servers) == ["c"]  # through env it is fine
    assert config.skipped["a"].startswith("cfg.json: server 'a': args[1] holds ${vault:my.token}; ")
    assert '"env": {"MY_TOKEN": "${vault:my.token}"}' in config.skipped["a"]
    assert config.skipped["b"].startswith("cfg.json: server 'b': command holds ${vault:CMD}; ")


def test_build_registry_used_by_start_and_reload_reports_the_refused_server(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, mcp_config=_config(tmp_path))
    registry = build_registry(settings)
    failures = {f.server: f.message for f in registry.mcp_failures}
    assert list(failures) == ["argv_secret"]
    assert all(part in failures["argv_secret"] for part in _expected(tmp_path)), failures
    assert "demo.echo" in registry.tools or "echo" in registry.tools  # the other server still loads
    assert not (tmp_path / "argv-server-ran").exists(), "the refused server was started"


def test_a_reload_reports_the_refused_server(tmp_path: Path, brain_on_redis: Brain) -> None:
    brain_on_redis.settings = make_settings(tmp_path, mcp_config=_config(tmp_path))
    Reloader(brain_on_redis.settings, brain_on_redis.hot, brain_on_redis.scheduler).reload()
    failures = {f.server: f.message for f in brain_on_redis.scheduler.registry.mcp_failures}
    assert all(part in failures["argv_secret"] for part in _expected(tmp_path)), failures
    assert not (tmp_path / "argv-server-ran").exists()


def test_explain_warns_naming_the_server_the_argument_and_the_fix(tmp_path: Path) -> None:
    config = _config(tmp_path)
    tree_file = tmp_path / "t.yaml"
    tree_file.write_text("id: t\ntasks:\n  - id: a\n    tool: echo\n    args: {value: 1}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("VANCETOPE_")}
    env.update(VANCETOPE_DATA_DIR=str(tmp_path / "data"), COLUMNS="400")
    shown = subprocess.run(
        [sys.executable, "-m", "brain", "--mcp-config", str(config), "explain", str(tree_file)],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    said = " ".join(shown.stderr.split())
    assert "warning: MCP server 'argv_secret' failed to start" in said, shown.stderr
    assert all(part in said for part in _expected(tmp_path)), said
    assert not (tmp_path / "argv-server-ran").exists()


def test_a_vault_header_for_a_plain_http_server_off_loopback_is_refused() -> None:
    text = """{"mcpServers": {
        "remote": {"url": "http://mcp.example.com/mcp", "headers": {"Authorization": "Bearer ${vault:T}"}},
        "tls": {"url": "https://mcp.example.com/mcp", "headers": {"Authorization": "Bearer ${vault:T}"}},
        "local": {"url": "http://127.0.0.1:9/mcp", "headers": {"Authorization": "Bearer ${vault:T}"}}
    }}"""
    config = parse_mcp_config(text, "cfg.json", environ={})
    assert sorted(config.servers) == ["local", "tls"]
    assert config.skipped["remote"].startswith(
        "cfg.json: server 'remote': header 'Authorization' holds ${vault:T} but the url is plain http://"
    )
