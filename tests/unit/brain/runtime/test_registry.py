"""The brain's merged registry refuses a fallback_tool that names no tool (brain.runtime.registry)."""

from __future__ import annotations

from pathlib import Path

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
