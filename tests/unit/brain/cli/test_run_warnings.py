"""`vancetope run` warns that client tools can only wait only when the router says so (issue 6)."""

from __future__ import annotations

import pytest

from brain.cli.trees import _tasks_waiting_for_a_client
from brain.core.models import TaskTree, ToolSpec
from brain.core.routing import ClientView, Presence, client_tools
from brain.core.snapshot import RegistrySnapshot

TOOLS = {
    s.name: s
    for s in (
        ToolSpec.model_validate({"name": "echo", "location": "server"}),
        ToolSpec.model_validate({"name": "read_local_file", "location": "client"}),
        ToolSpec.model_validate({"name": "shell_execute", "location": "client", "offline_strategy": "skip"}),
        ToolSpec.model_validate(
            {"name": "notes", "location": "client", "offline_strategy": "fallback", "fallback_tool": "echo"}
        ),
        ToolSpec.model_validate({"name": "drive", "location": "both"}),
        ToolSpec.model_validate({"name": "drive_client", "location": "prefer_client"}),
    )
}


@pytest.mark.parametrize(
    ("tool", "waits"),
    [
        ("echo", False),  # a server tool: no client involved
        ("drive", False),  # both, prefer server
        ("shell_execute", False),  # skipped when no client, not waiting
        ("notes", False),  # falls back to a server tool
        ("not_in_registry", False),  # fails at once ("Tool unknown"), never waits
        ("drive_client", False),  # prefers a client, runs on the server without one
        ("read_local_file", True),  # parked as pending_client
    ],
)
def test_only_tasks_the_router_parks_for_a_client_are_said_to_wait(tool: str, waits: bool) -> None:
    tree = TaskTree.model_validate({"id": "t", "tasks": [{"id": "a", "tool": tool}]})
    assert _tasks_waiting_for_a_client(tree, RegistrySnapshot(tools=TOOLS)) == (["a"] if waits else [])


def test_client_tools_are_those_of_the_bound_client_or_of_the_users_clients_only() -> None:
    presence = Presence(
        user="ada",
        clients=(
            ClientView(client_id="laptop", user="ada", tools=frozenset({"git_log"})),
            ClientView(client_id="desk", user="ada", tools=frozenset({"git_diff"})),
            ClientView(client_id="eve-pc", user="eve", tools=frozenset({"steal"})),
        ),
    )
    assert client_tools(presence) == {"git_log", "git_diff"}
    bound = presence.model_copy(update={"session_client": "laptop"})
    assert client_tools(bound) == {"git_log"}  # bound: its own client's only
    assert client_tools(Presence(clients=presence.clients)) == frozenset()
