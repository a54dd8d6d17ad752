"""The brain's pins of client tool definitions (pure split)."""

from __future__ import annotations

from brain.hot.toolpins import pin_of, split_pinned
from workers.contracts import ToolDescriptor, ToolType


def tool(description: str, name: str = "commit") -> ToolDescriptor:
    return ToolDescriptor(name=name, type=ToolType.MCP, mcp_server="git", description=description)


def test_new_tools_are_pinned_same_ones_accepted_and_changed_ones_held() -> None:
    pins = {"commit": pin_of(tool("Commit."))}
    split = split_pinned([tool("Commit."), tool("Log.", "log")], pins)
    assert [t.name for t in split.accepted] == ["commit", "log"] and split.held == []
    assert split.new_pins == {"log": pin_of(tool("Log.", "log"))}

    changed = split_pinned([tool("Commit, and more."), tool("Log.", "log")], {**pins, **split.new_pins})
    assert [t.name for t in changed.held] == ["commit"] and [t.name for t in changed.accepted] == ["log"]


def test_a_schema_change_is_a_change() -> None:
    a = tool("Commit.")
    b = a.model_copy(update={"input_schema": {"type": "object", "properties": {"x": {"type": "string"}}}})
    assert pin_of(a) != pin_of(b)
