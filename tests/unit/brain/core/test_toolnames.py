"""Tool names never collide silently (brain.core.toolnames, pure; issue 10 item 3)."""

from __future__ import annotations

from brain.core.models import Location, ToolSpec, ToolType
from brain.core.toolnames import clash_lines, name_on_server, place
from brain.runtime.registry import bind_to_servers


def builtin(name: str) -> ToolSpec:
    return ToolSpec(name=name, location=Location.SERVER)


def mcp(server: str, name: str, schema_field: str = "x") -> ToolSpec:
    return ToolSpec(
        name=name,
        location=Location.SERVER,
        type=ToolType.MCP,
        mcp_server=server,
        input_schema={"type": "object", "properties": {schema_field: {}}},
    )


def test_a_unique_mcp_tool_has_its_bare_and_its_qualified_name() -> None:
    placed = place({}, [mcp("time", "get_current_time")])
    assert set(placed.tools) == {"get_current_time", "time/get_current_time"}
    assert placed.tools["time/get_current_time"].name == "time/get_current_time"
    assert placed.clashes == {}


def test_an_mcp_tool_never_replaces_a_built_in_of_the_same_name() -> None:
    placed = place({"echo": builtin("echo")}, [mcp("everything", "echo", "message")])
    assert placed.tools["echo"] == builtin("echo")
    assert placed.tools["everything/echo"].input_schema["properties"] == {"message": {}}
    assert placed.clashes == {"echo": ["built-in", "everything/echo"]}
    assert clash_lines(placed.clashes) == [
        (
            "tool name 'echo' is offered by built-in, everything/echo: 'echo' is the built-in; "
            "write 'everything/echo' for the other"
        )
    ]


def test_a_name_two_servers_share_has_no_bare_form() -> None:
    placed = place({}, [mcp("a", "add"), mcp("b", "add"), mcp("b", "pid")])
    assert "add" not in placed.tools and {"a/add", "b/add", "pid", "b/pid"} <= set(placed.tools)
    assert clash_lines(placed.clashes) == [
        "tool name 'add' is offered by a/add, b/add: 'add' alone names none of them; write 'a/add' or 'b/add'"
    ]


def test_a_registry_entry_binds_to_the_server_it_names() -> None:
    placed = place({"echo": builtin("echo")}, [mcp("a", "add"), mcp("b", "add"), mcp("e", "echo")])
    declared = {
        "add": ToolSpec(name="add", location=Location.BOTH, mcp_server="b"),
        "echo": ToolSpec(name="echo", location=Location.SERVER, mcp_server="e", timeout_s=5),
        "own": ToolSpec(name="own", location=Location.CLIENT),
    }
    bound = bind_to_servers(declared, placed.tools)
    assert set(bound) == {"b/add", "e/echo", "own"}  # the built-in echo is left alone
    assert bound["b/add"].name == "b/add"


def test_the_name_a_server_knows_a_tool_by() -> None:
    assert (name_on_server("time/get_current_time"), name_on_server("echo")) == ("get_current_time", "echo")
