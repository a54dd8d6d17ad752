"""The brain's merged registry refuses a fallback_tool that names no tool (brain.runtime.registry)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from brain.errors import InvalidRegistry
from brain.runtime.registry import build_registry
from tests.conftest import make_settings

FALLS_BACK = "tools:\n  - name: local_search\n    location: client\n    offline_strategy: fallback\n"


def registry_file(tmp_path: Path, fallback: str) -> Path:
    path = tmp_path / "registry.yaml"
    path.write_text(FALLS_BACK + f"    fallback_tool: {fallback}\n")
    return path


@pytest.mark.parametrize("fallback", ["echo", "local_search_server"])
def test_a_fallback_tool_that_is_a_builtin_or_declared_is_accepted(tmp_path: Path, fallback: str) -> None:
    path = registry_file(tmp_path, fallback)
    if fallback == "local_search_server":
        path.write_text(path.read_text() + "  - name: local_search_server\n    location: server\n")
    registry = build_registry(make_settings(tmp_path, registry=path), discover=False)
    assert registry.tools["local_search"].fallback_tool == fallback


def test_a_fallback_tool_naming_no_tool_is_refused_naming_both(tmp_path: Path) -> None:
    path = registry_file(tmp_path, "web_serch")
    with pytest.raises(InvalidRegistry) as caught:
        build_registry(make_settings(tmp_path, registry=path), discover=False)
    assert caught.value.path == str(path)
    assert caught.value.problems == [
        (
            "tool 'local_search': fallback_tool 'web_serch' is not a tool of the registry (built-ins, the "
            "brain's MCP servers and this file); name one of those or remove the fallback_tool"
        )
    ]


def test_an_unknown_fallback_tool_is_not_refused_while_mcp_servers_were_not_asked(tmp_path: Path) -> None:
    path = registry_file(tmp_path, "some_mcp_tool")
    mcp = tmp_path / "mcp.json"
    mcp.write_text('{"mcpServers": {}}')
    settings = make_settings(tmp_path, registry=path, mcp_config=mcp)
    assert build_registry(settings, discover=False).tools["local_search"].fallback_tool == "some_mcp_tool"
    with pytest.raises(InvalidRegistry, match="'some_mcp_tool' is not a tool of the registry"):
        build_registry(settings)  # every server answered (there are none): now it is known missing


def _spec(name: str, **fields: object) -> Any:
    from brain.core.models import ToolSpec

    return ToolSpec.model_validate({"name": name, "location": "server", **fields})


@pytest.mark.parametrize(
    ("declared", "servers", "failed", "why"),
    [
        pytest.param(
            _spec("jira_search", mcp_server="jira"),
            ["time"],
            [],
            "tool 'jira_search' names MCP server 'jira', which is not in the brain's mcpServers (they are: 'time')",
            id="a server the brain lacks",
        ),
        pytest.param(
            _spec("jira_search", mcp_server="jira"),
            ["jira"],
            ["jira"],
            "tool 'jira_search' names MCP server 'jira', which failed to start: boom",
            id="a server that failed to start",
        ),
        pytest.param(
            _spec("jira_search", mcp_server="jira"),
            ["jira"],
            [],
            "tool 'jira_search' names MCP server 'jira', which offers no tool 'jira_search'",
            id="a server without the tool",
        ),
        pytest.param(_spec("get_current_time", mcp_server="time"), ["time"], [], None, id="a served tool"),
        pytest.param(
            _spec("notes", mcp_server="notes", location="client"), [], [], None, id="a client's server"
        ),
    ],
)
def test_registry_tools_whose_mcp_server_cannot_run_them_are_named(
    declared: Any, servers: list[str], failed: list[str], why: str | None
) -> None:
    """Issue 22 item 5: explain called such a tree valid; a server run of it fails."""
    from brain.runtime.registry import unserved_mcp_tools
    from workers.contracts import MCPServerFailure

    placed = {"time.get_current_time": _spec("time.get_current_time", mcp_server="time")}
    failures = [MCPServerFailure(server=s, message="boom") for s in failed]
    found = unserved_mcp_tools({declared.name: declared}, placed, servers, failures)
    assert found == ({declared.name: why} if why else {})


def test_the_example_registrys_native_git_status_and_mcp_server_gits_stay_two_tools(tmp_path: Path) -> None:
    """Issue 24 item E: they were merged silently (a native tool inheriting mcp_server 'git'),
    and git.git_status vanished from the gateway's list and the git pool, with no warning."""
    import subprocess
    import sys

    from brain.core.models import Location
    from brain.core.toolnames import clash_lines
    from tests.conftest import EXAMPLES, write_mcp_config
    from workers.contracts import ToolType

    subprocess.run(["git", "init", "-q", str(tmp_path / "repo")], check=True)
    git = {
        "command": sys.executable,
        "args": ["-m", "mcp_server_git", "--repository", str(tmp_path / "repo")],
    }
    settings = make_settings(
        tmp_path,
        registry=EXAMPLES / "registry.yaml",
        mcp_config=write_mcp_config(tmp_path / "mcp.json", {"git": git}),
    )
    registry = build_registry(settings)
    native, served = registry.tools["git_status"], registry.tools["git.git_status"]
    assert (native.type, native.mcp_server, native.location) == (ToolType.NATIVE, None, Location.CLIENT)
    assert (served.type, served.mcp_server, served.location) == (ToolType.MCP, "git", Location.SERVER)
    assert registry.tools["git_log"].mcp_server == "git"  # no clash: bare and qualified
    assert clash_lines(registry.clashes) == [
        (
            "tool name 'git_status' is offered by registry file, git.git_status: 'git_status' is the registry "
            "file's tool; write 'git.git_status' for the other"
        )
    ]


def test_a_qualified_name_over_128_characters_is_refused_at_registration_naming_server_and_tool(
    tmp_path: Path,
) -> None:
    """Issue 24 item 3: MCP tool names are at most 128 characters (the SDK's validate_tool_name).
    A server named with 120 characters keeps git_add (120 + 1 + 7 = 128), not git_diff (129)."""
    import subprocess
    import sys

    from tests.conftest import write_mcp_config

    subprocess.run(["git", "init", "-q", str(tmp_path / "repo")], check=True)
    git = {
        "command": sys.executable,
        "args": ["-m", "mcp_server_git", "--repository", str(tmp_path / "repo")],
    }
    server = "g" * 120
    registry = build_registry(
        make_settings(tmp_path, mcp_config=write_mcp_config(tmp_path / "mcp.json", {server: git}))
    )
    assert f"{server}.git_add" in registry.tools and "git_add" in registry.tools
    assert f"{server}.git_diff" not in registry.tools and "git_diff" not in registry.tools
    refused = {f.message for f in registry.mcp_failures if f.server == server}
    assert (
        f"tool 'git_diff' of MCP server {server!r} is not registered: its name '{server}.git_diff' breaks the "
        "MCP tool-name rule (Tool name exceeds maximum length of 128 characters (current: 129))"
    ) in refused
