"""client_agent.mcp_json: the user's mcp.json with real MCP servers; broken ones never stop the agent."""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from client_agent.errors import PolicyViolation
from client_agent.mcp_json import FileWatcher, load_mcp_tools, localize, merge_tools, name_on_server
from client_agent.policy import Policy
from tests.conftest import FIXTURES
from workers.contracts import ToolDescriptor, ToolType
from workers.mcp_config import StdioServerSpec, parse_mcp_config
from workers.tools.native import Sandbox

DEMO = {"command": sys.executable, "args": [str(FIXTURES / "mcp_demo_server.py")]}
CRASH = {"command": sys.executable, "args": [str(FIXTURES / "mcp_crash_server.py")]}
NATIVE = ["read_local_file", "git_status"]


def mcp_tool(name: str, server: str) -> ToolDescriptor:
    return ToolDescriptor(name=name, type=ToolType.MCP, mcp_server=server)


def write(path: Path, servers: dict[str, Any]) -> Path:
    path.write_text(json.dumps({"mcpServers": servers}))
    return path


@pytest.fixture
def policy(tmp_path: Path) -> Policy:
    return Policy(Sandbox([tmp_path]))


def test_merge_policy_first_then_a_shared_name_is_offered_qualified(tmp_path: Path) -> None:
    """Issue 10 item 3: a name the native tools or an earlier server already use is offered
    as <server>.<tool>, never dropped, never confused with the other."""
    discovered = [
        mcp_tool("git_status", "git"), mcp_tool("git_log", "git"),
        mcp_tool("git_log", "mirror"), mcp_tool("secret", "mirror"),
    ]  # fmt: skip
    policy = Policy(Sandbox([tmp_path]), allowed_tools=("git_*",))
    merged = merge_tools(NATIVE, discovered, policy)
    assert [(t.mcp_server, t.name) for t in merged.offered] == [
        ("git", "git.git_status"), ("git", "git_log"), ("mirror", "mirror.git_log"),
    ]  # fmt: skip
    assert [name_on_server(t) for t in merged.offered] == ["git_status", "git_log", "git_log"]
    assert merged.refused == {
        ("mirror", "secret"): "tool of MCP server 'mirror' is not allowed on this client agent "
        "(allowed_tools: [git_*])",
    }
    assert merged.notes == [
        "MCP tool 'git_status' of server 'git' shares its name with the native tool; it is offered as 'git.git_status'",
        "MCP tool 'git_log' of server 'mirror' shares its name with MCP server 'git'; it is offered as 'mirror.git_log'",
    ]


def test_a_tool_named_after_its_own_server_is_offered_qualified_and_patterns_match_both_forms(
    tmp_path: Path,
) -> None:
    """The brain would read "git.status" of server git as git's tool "status": it is offered as
    git.git.status. allowed_tools written with the old '/' still match (client_agent.toolnames)."""
    discovered = [mcp_tool("git.status", "git"), mcp_tool("log", "git"), mcp_tool("other", "hg")]
    policy = Policy(Sandbox([tmp_path]), allowed_tools=("git/*",))
    merged = merge_tools(NATIVE, discovered, policy)
    assert [t.name for t in merged.offered] == ["git.git.status", "log"]
    assert [name_on_server(t) for t in merged.offered] == ["git.status", "log"]
    assert set(merged.refused) == {("hg", "other")}


def test_broken_servers_are_reported_and_the_rest_is_offered(tmp_path: Path, policy: Policy) -> None:
    path = write(tmp_path / "mcp.json", {
        "demo": DEMO, "missing": {"command": "no-such-mcp-server-xyz"}, "crash": CRASH, "second": DEMO,
    })  # fmt: skip
    mcp = load_mcp_tools(path, policy, NATIVE, timeout=60)
    try:
        names = {"add", "fail", "slow", "big", "pid", "die"}
        assert {t.name for t in mcp.tools} == names | {f"second.{n}" for n in names}  # "second" qualified
        failures = {f.server: f for f in mcp.failures}
        assert set(failures) == {"missing", "crash"}
        assert "command not found: no-such-mcp-server-xyz" in failures["missing"].message
        assert "demo crash: missing API token" in failures["crash"].stderr_tail
        assert mcp.manager is not None
        assert mcp.manager.call_tool("demo", "add", {"a": 2, "b": 3}, timeout=60) == 5
        assert mcp.manager.call_tool("second", "add", {"a": 4, "b": 3}, timeout=60) == 7
        with pytest.raises(PolicyViolation, match="crash: MCP server is not running on this client agent"):
            mcp.manager.connect("crash")
    finally:
        mcp.close()


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("{not json", "not valid JSON: "),
        ('{"servers": {}}', 'missing the "mcpServers" object'),
    ],
)
def test_a_bad_file_is_one_failure_and_no_tools(
    tmp_path: Path, policy: Policy, text: str, fragment: str
) -> None:
    path = tmp_path / "mcp.json"
    path.write_text(text)
    mcp = load_mcp_tools(path, policy, NATIVE, timeout=5)
    assert mcp.tools == [] and mcp.manager is None and mcp.config is None
    assert [f.server for f in mcp.failures] == ["mcp.json"]
    assert str(path) in mcp.failures[0].message and fragment in mcp.failures[0].message
    assert mcp.error == mcp.failures[0].message  # the agent keeps the servers it has (client_agent.agent)


def test_a_server_whose_edit_cannot_be_used_keeps_running_its_last_good_definition(
    tmp_path: Path, policy: Policy
) -> None:
    path = tmp_path / "mcp.json"
    path.write_text('{"mcpServers": {\n  // the demo server\n  "demo": ' + json.dumps(DEMO) + ",\n}}")
    first = load_mcp_tools(path, policy, NATIVE, timeout=60)
    first.close()
    assert first.error is None and first.config is not None and "add" in {t.name for t in first.tools}
    write(
        tmp_path / "mcp.json",
        {"demo": {"command": DEMO["command"], "arg": DEMO["args"]}, "other": {"cmd": "x"}},
    )
    again = load_mcp_tools(path, policy, NATIVE, timeout=60, previous=first.config)
    try:
        assert "add" in {t.name for t in again.tools}
        assert again.config is not None and list(again.config.kept) == ["demo"]
        assert "server 'demo': unknown key 'arg' (did you mean 'args'?)" in again.config.kept["demo"]
        assert [
            (f.server, "unknown key 'cmd' (did you mean 'command'?)" in f.message) for f in again.failures
        ] == [("other", True)]
    finally:
        again.close()


def test_a_missing_file_is_a_failure_not_a_crash(tmp_path: Path, policy: Policy) -> None:
    mcp = load_mcp_tools(tmp_path / "absent.json", policy, NATIVE, timeout=5)
    assert "cannot read the MCP config" in mcp.failures[0].message


def test_stdio_servers_start_in_the_files_folder_and_find_commands_beside_python(tmp_path: Path) -> None:
    config = parse_mcp_config(json.dumps({"mcpServers": {
        "git": {"command": "mcp-server-git", "args": ["--repository", "sandbox"]},
        "pinned": {"command": "/bin/true", "cwd": "sub"},
    }}), "mcp.json")  # fmt: skip
    servers = localize(config, tmp_path).servers
    git, pinned = servers["git"], servers["pinned"]
    assert isinstance(git, StdioServerSpec) and isinstance(pinned, StdioServerSpec)
    assert git.cwd == str(tmp_path) and pinned.cwd == str(tmp_path / "sub")
    # a bare name found on PATH stays bare; otherwise it is found beside this Python
    assert Path(git.command).name == "mcp-server-git" and shutil.which(git.command)
    assert pinned.command == "/bin/true"


def test_watcher_calls_back_once_per_settled_change(tmp_path: Path) -> None:
    path = write(tmp_path / "mcp.json", {})
    changed = threading.Event()
    stop = threading.Event()
    watcher = FileWatcher(path, changed.set, stop, interval_s=0.1)
    watcher.start()
    try:
        assert not changed.wait(0.4)
        write(path, {"demo": DEMO})
        assert changed.wait(60), "the watcher did not notice the edit"
        changed.clear()
        path.unlink()
        assert changed.wait(60), "the watcher did not notice the removal"
    finally:
        stop.set()
        watcher.join(5)
    assert not watcher.is_alive()


def test_watcher_sees_a_file_whose_folder_appears_later_and_a_replace_by_rename(tmp_path: Path) -> None:
    path = tmp_path / "later" / "approvals.stamp"
    changed = threading.Event()
    stop = threading.Event()
    watcher = FileWatcher(path, changed.set, stop, interval_s=0.1)
    watcher.start()
    try:
        assert not changed.wait(0.3) and watcher.is_alive()
        path.parent.mkdir()
        path.write_text("1")
        assert changed.wait(60), "the watcher did not notice the file in the new folder"
        changed.clear()
        time.sleep(0.3)  # the watch is set up on the folder by now
        (tmp_path / "later" / "tmp").write_text("22")
        os.replace(tmp_path / "later" / "tmp", path)  # what an editor's atomic save does
        assert changed.wait(60), "the watcher did not notice the replaced file"
    finally:
        started = time.monotonic()
        stop.set()
        watcher.join(5)
    assert not watcher.is_alive() and time.monotonic() - started < 2
