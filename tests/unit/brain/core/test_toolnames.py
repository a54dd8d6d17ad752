"""Tool names never collide silently (brain.core.toolnames, pure; issue 10 item 3)."""

from __future__ import annotations

import pytest
from mcp.shared.tool_name_validation import validate_tool_name

from brain.core.models import Location, ToolSpec, ToolType
from brain.core.toolnames import clash_lines, client_clashes, keep_declared, place
from brain.core.treefile import merge_registry
from brain.runtime.registry import bind_to_servers
from workers.contracts import ToolDescriptor
from workers.toolnames import canonical, name_on_server, qualified


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
    assert set(placed.tools) == {"get_current_time", "time.get_current_time"}
    assert placed.tools["time.get_current_time"].name == "time.get_current_time"
    assert placed.clashes == {}


def test_an_mcp_tool_never_replaces_a_built_in_of_the_same_name() -> None:
    placed = place({"echo": builtin("echo")}, [mcp("everything", "echo", "message")])
    assert placed.tools["echo"] == builtin("echo")
    assert placed.tools["everything.echo"].input_schema["properties"] == {"message": {}}
    assert placed.clashes == {"echo": ["built-in", "everything.echo"]}
    assert clash_lines(placed.clashes) == [
        (
            "tool name 'echo' is offered by built-in, everything.echo: 'echo' is the built-in; "
            "write 'everything.echo' for the other"
        )
    ]


def test_a_name_two_servers_share_has_no_bare_form() -> None:
    placed = place({}, [mcp("a", "add"), mcp("b", "add"), mcp("b", "pid")])
    assert "add" not in placed.tools and {"a.add", "b.add", "pid", "b.pid"} <= set(placed.tools)
    assert clash_lines(placed.clashes) == [
        "tool name 'add' is offered by a.add, b.add: 'add' alone names none of them; write 'a.add' or 'b.add'"
    ]


def test_a_registry_entry_binds_to_the_server_it_names() -> None:
    placed = place({"echo": builtin("echo")}, [mcp("a", "add"), mcp("b", "add"), mcp("e", "echo")])
    declared = {
        "add": ToolSpec(name="add", location=Location.BOTH, mcp_server="b"),
        "echo": ToolSpec(name="echo", location=Location.SERVER, mcp_server="e", timeout_s=5),
        "own": ToolSpec(name="own", location=Location.CLIENT),
    }
    bound = bind_to_servers(declared, placed.tools)
    assert set(bound) == {"b.add", "e.echo", "own"}  # the built-in echo is left alone
    assert bound["b.add"].name == "b.add"


@pytest.mark.parametrize(
    ("name", "server", "on_server"),
    [
        ("time.get_current_time", "time", "get_current_time"),
        ("echo", None, "echo"),
        ("add", "demo", "add"),  # a bare name: nothing to take off
        ("io.github.fs.read.file", "io.github.fs", "read.file"),  # dots in both: the known prefix only
        ("a.b.c", "a", "b.c"),
        ("git/git_status", "git", "git_status"),  # the deprecated form, announced by older agents
        ("other.add", "demo", "other.add"),  # another server's prefix is the tool's own name
    ],
)
def test_the_name_a_server_knows_a_tool_by_is_its_name_without_that_servers_prefix(
    name: str, server: str | None, on_server: str
) -> None:
    assert name_on_server(name, server) == on_server


@pytest.mark.parametrize(
    ("written", "read"),
    [("git/git_status", "git.git_status"), ("git.git_status", "git.git_status"), ("echo", "echo")],
)
def test_the_deprecated_slash_form_reads_as_the_dotted_one(written: str, read: str) -> None:
    assert canonical(written) == read


def test_every_qualified_name_is_one_the_mcp_spec_allows() -> None:
    placed = place({}, [mcp("fs", "list_directory"), mcp("io.github.git", "git_status"), mcp("x-y_z", "a-b")])
    assert all(validate_tool_name(name).is_valid for name in placed.tools)
    assert qualified("fs", "list_directory") == "fs.list_directory"


def test_a_qualified_name_the_spec_refuses_is_not_registered_and_says_why() -> None:
    long_tool = "t" * 125  # fits alone; "srv." makes it 129
    placed = place({}, [mcp("srv", long_tool), mcp("my server", "add"), mcp("srv", "ok")])
    assert set(placed.tools) == {"srv.ok", "ok"}
    (server_a, why_a), (server_b, why_b) = placed.refused
    assert server_a == "srv" and f"tool {long_tool!r} of MCP server 'srv' is not registered" in why_a
    assert "exceeds maximum length of 128 characters (current: 129)" in why_a
    assert server_b == "my server" and "'my server.add' breaks the MCP tool-name rule" in why_b
    assert "invalid characters: ' '" in why_b


def test_a_dotted_bare_name_that_spells_another_tools_qualified_name_is_a_clash() -> None:
    # Server a offers "b.c"; server b offers "c", so "b.c" is also b's tool's qualified name.
    placed = place({}, [mcp("a", "b.c", "from_a"), mcp("b", "c", "from_b")])
    assert placed.tools["b.c"].mcp_server == "b"  # the qualified name keeps its meaning
    assert placed.tools["a.b.c"].mcp_server == "a"  # the other is reachable by its own
    assert placed.clashes == {"b.c": ["b.c", "a.b.c"]}
    assert clash_lines(placed.clashes) == [
        (
            "tool name 'b.c' is offered by b.c, a.b.c: 'b.c' is the qualified name of the tool of that name; "
            "write 'a.b.c' for the other"
        )
    ]


def test_a_tool_named_after_its_own_server_has_no_bare_form() -> None:
    # "git.status" of server git would read as git's tool "status": only "git.git.status" names it.
    placed = place({}, [mcp("git", "git.status")])
    assert set(placed.tools) == {"git.git.status"}
    assert name_on_server("git.git.status", "git") == "git.status"
    assert clash_lines(placed.clashes) == [
        (
            "tool name 'git.status' is offered by git.git.status: 'git.status' alone names none of them; "
            "write 'git.git.status'"
        )
    ]


# --- a registry-file tool of another kind under an MCP tool's bare name (issue 24, item E) ------


def native(name: str) -> ToolSpec:
    return ToolSpec.model_validate({"name": name, "location": "client", "type": "native"})


def test_a_registry_files_native_tool_keeps_its_name_and_the_mcp_tool_keeps_its_qualified_one() -> None:
    # Before: merged silently (native, with mcp_server 'git' inherited), and git.git_status
    # vanished from the gateway's list and the git pool, with no warning.
    declared = {"git_status": native("git_status")}
    placed = keep_declared(declared, place({}, [mcp("git", "git_status"), mcp("git", "git_log")]))
    tools = merge_registry(placed.tools, bind_to_servers(declared, placed.tools))
    assert tools["git_status"].type is ToolType.NATIVE and tools["git_status"].mcp_server is None
    assert tools["git.git_status"].mcp_server == "git" and tools["git_log"].mcp_server == "git"
    assert clash_lines(placed.clashes) == [
        (
            "tool name 'git_status' is offered by registry file, git.git_status: 'git_status' is the registry "
            "file's tool; write 'git.git_status' for the other"
        )
    ]


def test_an_entry_without_a_type_still_describes_the_mcp_tool_it_names() -> None:
    declared = {"git_status": ToolSpec(name="git_status", location=Location.BOTH)}
    placed = keep_declared(declared, place({}, [mcp("git", "git_status")]))
    tools = merge_registry(placed.tools, bind_to_servers(declared, placed.tools))
    assert placed.clashes == {} and tools["git_status"].mcp_server == "git"
    assert tools["git_status"].location is Location.BOTH


def test_a_name_two_servers_share_means_the_registry_files_tool_once_it_declares_one() -> None:
    declared = {"add": native("add")}
    placed = keep_declared(declared, place({}, [mcp("a", "add"), mcp("b", "add")]))
    assert placed.clashes == {"add": ["registry file", "a.add", "b.add"]}


def test_a_clients_mcp_tool_whose_bare_name_the_registry_gives_to_another_is_reported() -> None:
    registry = {"git_status": native("git_status"), "add": mcp("demo", "add"), "echo": builtin("echo")}
    announced = [
        ToolDescriptor(name="git_status", type=ToolType.MCP, mcp_server="git"),
        ToolDescriptor(name="add", type=ToolType.MCP, mcp_server="demo"),  # the registry's own: no clash
        ToolDescriptor(name="echo", type=ToolType.MCP, mcp_server="notes"),
        ToolDescriptor(name="git.git_log", type=ToolType.MCP, mcp_server="git"),  # already qualified
    ]
    assert clash_lines(client_clashes(registry, announced)) == [
        "tool name 'echo' is offered by built-in, notes.echo: 'echo' is the built-in; write 'notes.echo' for the other",
        (
            "tool name 'git_status' is offered by registry's native tool, git.git_status: 'git_status' is the "
            "registry's native tool; write 'git.git_status' for the other"
        ),
    ]


def test_a_registry_file_entry_written_with_the_old_slash_name_is_the_dotted_tool() -> None:
    spec = ToolSpec(name="git/git_status", location=Location.BOTH, mcp_server="git", fallback_tool="fs/read")
    assert (spec.name, spec.fallback_tool) == ("git.git_status", "fs.read")


@pytest.mark.parametrize(
    "name",
    ["echo", "everything.echo", "fs/list_directory", "my tool", "a,b", "-x", "x.", "é", "", "x" * 128, "x" * 129,
     "git.git_status", "a b/c,d", "日本"],
)  # fmt: skip
def test_the_spec_name_rule_agrees_with_the_sdks_validate_tool_name(name: str) -> None:
    """Checked without importing the SDK (that loads all of ``mcp``): the same verdict, and the
    SDK's words but its "Allowed characters" line."""
    from mcp.shared.tool_name_validation import validate_tool_name

    from workers.toolnames import spec_name_problem

    sdk = validate_tool_name(name)
    ours = spec_name_problem(name)
    assert (ours is None) is sdk.is_valid
    if not sdk.is_valid:
        assert ours == "; ".join(w for w in sdk.warnings if not w.startswith("Allowed characters"))
