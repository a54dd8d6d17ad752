"""The active registry of one user (brain.gateway.catalog): tables of registry + sessions."""

from __future__ import annotations

from typing import Any

import pytest

from brain.core.models import Location, ToolSpec
from brain.core.sessions import ClientSession
from brain.gateway.catalog import GatewayTool, StateMemo, catalog, catalog_digest, user_states
from workers.contracts import ToolDescriptor, ToolType


def spec(name: str, location: str = "server", **extra: Any) -> ToolSpec:
    return ToolSpec.model_validate({"name": name, "location": location, **extra})


def session(client_id: str, user: str, *tools: ToolDescriptor) -> ClientSession:
    return ClientSession(
        client_id=client_id, user=user, session_id="s", client_type="cli", tools=list(tools), connected_at=0
    )


def native(name: str) -> ToolDescriptor:
    return ToolDescriptor(name=name, type=ToolType.NATIVE, input_schema={"type": "object", "title": name})


def mcp(server: str, name: str) -> ToolDescriptor:
    return ToolDescriptor(name=name, type=ToolType.MCP, mcp_server=server, description=f"{server} {name}")


REGISTRY = {
    "echo": spec("echo", type="built_in"),
    "get_current_time": spec("time.get_current_time", mcp_server="time"),
    "time.get_current_time": spec("time.get_current_time", mcp_server="time"),
    "read_local_file": spec("read_local_file", "client", type="native"),
}


def names(tools: list[GatewayTool]) -> list[str]:
    return [t.name for t in tools]


def by_name(tools: list[GatewayTool], name: str) -> GatewayTool:
    return next(t for t in tools if t.name == name)


def test_an_mcp_tool_registered_bare_and_qualified_is_listed_once_under_its_bare_name() -> None:
    tools = catalog(REGISTRY, [], "ada")
    assert names(tools) == ["echo", "get_current_time", "read_local_file"]
    time_tool = by_name(tools, "get_current_time")
    assert (time_tool.pool, time_tool.action) == ("time", "get_current_time")


@pytest.mark.parametrize(
    ("sessions", "available", "clients"),
    [
        ([], False, ()),
        ([session("laptop", "ada", native("read_local_file"))], True, ("laptop",)),
        ([session("desk", "bob", native("read_local_file"))], False, ()),  # never another user's client
        (
            [session("b", "ada", native("read_local_file")), session("a", "ada", native("read_local_file"))],
            True,
            ("a", "b"),
        ),
    ],
)
def test_a_registry_client_tool_is_available_only_while_a_client_of_the_user_offers_it(
    sessions: list[ClientSession], available: bool, clients: tuple[str, ...]
) -> None:
    tool = by_name(catalog(REGISTRY, sessions, "ada"), "read_local_file")
    assert (tool.available, tool.clients, tool.location) == (available, clients, Location.CLIENT)


def test_client_only_tools_of_the_user_are_added_with_their_announced_schema() -> None:
    laptop = session("laptop", "ada", native("list_notes"), mcp("git", "git_log"))
    other = session("desk", "bob", native("bobs_tool"))
    tools = catalog(REGISTRY, [laptop, other], "ada")
    assert "bobs_tool" not in names(tools)
    notes = by_name(tools, "list_notes")
    assert (notes.pool, notes.input_schema["title"], notes.clients) == ("native", "list_notes", ("laptop",))
    assert (by_name(tools, "git_log").pool, by_name(tools, "git_log").action) == ("git", "git_log")


@pytest.mark.parametrize(
    ("announced", "listed_as"),
    [
        (mcp("notes", "echo"), "notes.echo"),  # a built-in keeps its bare name
        (mcp("clock", "get_current_time"), "clock.get_current_time"),  # another server's tool
        (mcp("time", "get_current_time"), None),  # the registry's own tool: listed once, from it
        (native("echo"), None),  # a server-only name: its calls never reach the client
    ],
)
def test_a_client_tool_whose_bare_name_is_taken_is_listed_qualified_or_not_at_all(
    announced: ToolDescriptor, listed_as: str | None
) -> None:
    tools = catalog(REGISTRY, [session("laptop", "ada", announced)], "ada")
    extra = [n for n in names(tools) if n not in ("echo", "get_current_time", "read_local_file")]
    assert extra == ([listed_as] if listed_as else [])


def test_the_same_client_only_tool_on_two_clients_of_the_user_is_one_tool() -> None:
    sessions = [session("a", "ada", mcp("git", "git_log")), session("b", "ada", mcp("git", "git_log"))]
    tools = catalog({}, sessions, "ada")
    assert names(tools) == ["git_log"] and tools[0].clients == ("a", "b")


def test_two_servers_of_the_users_clients_sharing_a_bare_name_keep_the_first_bare() -> None:
    sessions = [session("a", "ada", mcp("git", "log"), mcp("hg", "log"))]
    assert names(catalog({}, sessions, "ada")) == ["log", "hg.log"]


def test_the_gateways_own_names_are_never_given_to_another_tool() -> None:
    registry = {
        **REGISTRY,
        "brain_health": spec("ops.brain_health", mcp_server="ops"),
        "ops.brain_health": spec("ops.brain_health", mcp_server="ops"),
    }
    sessions = [session("laptop", "ada", native("brain_cancel"), mcp("notes", "brain_cancel"))]
    tools = catalog(registry, sessions, "ada", frozenset({"brain_health", "brain_cancel"}))
    assert {"ops.brain_health", "notes.brain_cancel"} <= set(names(tools))
    assert not {"brain_health", "brain_cancel"} & set(names(tools))


# --- every field an MCP server sent (issue 24) ------------------------------------------------

HINTS = {"destructiveHint": True, "readOnlyHint": False}
METADATA: dict[str, Any] = {
    "title": "Reset",
    "annotations": HINTS,
    "icons": [{"src": "data:image/png;base64,AAAA", "mimeType": "image/png"}],
    "output_schema": {"type": "object", "properties": {"ok": {"type": "boolean"}}},
    "execution": {"taskSupport": "forbidden"},
    "meta": {"example.com/owner": "git-team"},
}


def test_a_registry_tool_keeps_what_its_mcp_server_said_of_it() -> None:
    registry = {"git_reset": spec("git.git_reset", mcp_server="git", **METADATA)}
    listed = by_name(catalog(registry, [], "ada"), "git_reset")
    assert {name: getattr(listed, name) for name in METADATA} == METADATA


def test_a_client_only_tool_keeps_what_its_mcp_server_said_of_it() -> None:
    reset = ToolDescriptor(name="git_reset", type=ToolType.MCP, mcp_server="git", **METADATA)
    listed = by_name(catalog({}, [session("laptop", "ada", reset)], "ada"), "git_reset")
    assert {name: getattr(listed, name) for name in METADATA} == METADATA


# --- name clashes: both tools stay reachable (issue 24, item E) --------------------------------


def test_the_registrys_native_tool_and_the_servers_mcp_tool_of_one_bare_name_are_both_listed() -> None:
    # What brain.core.toolnames.keep_declared leaves in the registry for that clash.
    registry = {
        "git_status": spec("git_status", "client", type="native"),
        "git.git_status": spec("git.git_status", mcp_server="git"),
        "git_log": spec("git.git_log", mcp_server="git"),
        "git.git_log": spec("git.git_log", mcp_server="git"),
    }
    tools = catalog(registry, [], "ada")
    assert names(tools) == ["git.git_status", "git_log", "git_status"]
    mcp_status = by_name(tools, "git.git_status")
    assert (mcp_status.pool, mcp_status.action) == ("git", "git_status")


def test_a_clients_mcp_tool_never_counts_as_offering_the_registrys_tool_of_its_bare_name() -> None:
    registry = {"git_status": spec("git_status", "client", type="native")}
    tools = catalog(registry, [session("laptop", "ada", mcp("git", "git_status"))], "ada")
    native_status, mcp_status = by_name(tools, "git_status"), by_name(tools, "git.git_status")
    assert (native_status.available, native_status.clients) == (False, ())  # laptop has no native one
    assert (mcp_status.clients, mcp_status.pool, mcp_status.action) == (("laptop",), "git", "git_status")


def test_an_mcp_tool_the_agent_announced_qualified_is_its_servers_action_by_its_own_name() -> None:
    registry = {"git_status": spec("git_status", "client", type="native")}
    own = session("laptop", "ada", native("git_status"), mcp("git", "git.git_status"))
    mcp_status = by_name(catalog(registry, [own], "ada"), "git.git_status")
    assert (mcp_status.pool, mcp_status.action) == ("git", "git_status")


# --- what list_changed follows (issue 24, item 4) ------------------------------------------------


def held(base: ClientSession, *tools: ToolDescriptor) -> ClientSession:
    return base.model_copy(update={"held_tools": list(tools)})


LAPTOP = session("laptop", "ada", native("list_notes"), mcp("notes", "add"))
DESK = session("desk", "bob", native("bobs_tool"))


@pytest.mark.parametrize(
    ("after", "ada_changed"),
    [
        # The same announcement again: nothing ada sees changed.
        ([session("laptop", "ada", native("list_notes"), mcp("notes", "add")), DESK], False),
        # Re-announced in the same session with a server added to its mcp.json.
        (
            [session("laptop", "ada", native("list_notes"), mcp("notes", "add"), mcp("more", "add")), DESK],
            True,
        ),
        # A tool's definition changed (and was approved): what tools/list shows changed.
        (
            [
                session(
                    "laptop",
                    "ada",
                    native("list_notes"),
                    ToolDescriptor(name="add", type=ToolType.MCP, mcp_server="notes", description="changed"),
                ),
                DESK,
            ],
            True,
        ),
        # A tool held back until approved is gone from what ada can call.
        ([held(session("laptop", "ada", native("list_notes")), mcp("notes", "add")), DESK], True),
        # Only bob's client changed: not ada's business.
        ([LAPTOP, session("desk", "bob", native("bobs_tool"), native("more"))], False),
    ],
)
def test_a_users_state_follows_what_they_see_not_only_who_is_connected(
    after: list[ClientSession], ada_changed: bool
) -> None:
    before = user_states(REGISTRY, [LAPTOP, DESK], ["ada", "bob", "cy"])
    now = user_states(REGISTRY, after, ["ada", "bob", "cy"])
    assert before["ada"][0] == now["ada"][0] == frozenset({("laptop", "s")})  # the same session
    assert (before["ada"] != now["ada"]) is ada_changed
    assert before["cy"] == now["cy"] == (frozenset(), catalog_digest(catalog(REGISTRY, [], "cy")))


def test_a_held_tool_approved_changes_the_state_back() -> None:
    holding = held(session("laptop", "ada", native("list_notes")), mcp("notes", "add"))
    approved = user_states(REGISTRY, [LAPTOP], ["ada"])
    assert user_states(REGISTRY, [holding], ["ada"]) != approved
    assert user_states(REGISTRY, [LAPTOP], ["ada"]) == approved


def test_users_with_a_connected_client_are_looked_at_even_when_not_watched() -> None:
    assert set(user_states(REGISTRY, [LAPTOP, DESK], [])) == {"ada", "bob"}


def test_with_a_memo_a_users_catalog_is_built_again_only_when_their_sessions_changed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built: list[str] = []

    def counting(*args: Any) -> list[GatewayTool]:
        built.append(args[2])
        return catalog(*args)

    monkeypatch.setattr("brain.gateway.catalog.catalog", counting)
    memo: StateMemo = {}
    first = user_states(REGISTRY, [LAPTOP, DESK], ["ada"], memo=memo)
    assert sorted(built) == ["ada", "bob"]
    assert user_states(REGISTRY, [LAPTOP, DESK], ["ada"], memo=memo) == first
    assert sorted(built) == ["ada", "bob"]  # nothing changed: nothing built again
    more = session("laptop", "ada", native("list_notes"), mcp("notes", "add"), mcp("more", "add"))
    after = user_states(REGISTRY, [more, DESK], ["ada"], memo=memo)
    assert built[2:] == ["ada"] and after["ada"] != first["ada"] and after["bob"] == first["bob"]
    assert user_states(dict(REGISTRY), [more, DESK], ["ada"], memo=memo) == after  # another mapping
    assert sorted(built[3:]) == ["ada", "bob"]


# --- names strict MCP hosts accept (issue 24 item 3) ----------------------------------------


def test_an_older_agents_slash_qualified_tool_is_listed_under_the_dotted_name() -> None:
    sessions = [session("laptop", "ada", native("git_log"), mcp("git", "git/git_log"))]
    tools = catalog({}, sessions, "ada")
    assert names(tools) == ["git.git_log", "git_log"]
    assert (by_name(tools, "git.git_log").pool, by_name(tools, "git.git_log").action) == ("git", "git_log")


def test_a_name_the_mcp_spec_refuses_is_never_listed() -> None:
    from mcp.shared.tool_name_validation import validate_tool_name

    sessions = [
        session(
            "laptop", "ada", native("has space"), native("x" * 129), mcp("my server", "add"), mcp("ok", "add")
        )
    ]
    tools = catalog(REGISTRY, sessions, "ada")
    assert all(validate_tool_name(t.name).is_valid for t in tools)
    # Its bare name is valid, so "my server"'s add is listed; "ok"'s, second, qualified.
    assert names(tools) == ["echo", "get_current_time", "read_local_file", "add", "ok.add"]
