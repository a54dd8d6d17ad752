"""Scheduler.accept (the one way in) refuses a call whose arguments its tool's schema refuses
on both routes before anything runs (issue 24, item D): a registry tool's schema, or the one
the client that would run it announced. A rig on a real Redis; nothing is sent."""

from __future__ import annotations

import pytest

from brain.core.models import SessionKind
from brain.core.submission import SubmitRequest
from brain.errors import InvalidTaskTree
from tests.unit.brain.runtime.rig import Rig, tree
from workers.contracts import ClientConnected, ClientType, ToolDescriptor, ToolType

ADD = ToolDescriptor(
    name="add",
    type=ToolType.MCP,
    mcp_server="notes",
    input_schema={
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
)


def connect_with_add(rig: Rig) -> None:
    rig.presence.enroll("laptop", "ada")
    msg = ClientConnected(
        client_id="laptop",
        session_id="s1",
        client_type=ClientType.CLI,
        available_tools=[ADD],
        sent_at=rig.clock(),
    )
    assert rig.clients.on_connected(msg, "laptop").accepted


def call(tool: str, args: dict[str, object]) -> SubmitRequest:
    return SubmitRequest(
        tree=tree({"id": "call", "tool": tool, "args": args}),
        source=f"tools/call {tool}",
        session=SessionKind.INTERACTIVE,
        user="ada",
    )


def test_a_client_only_tools_bad_arguments_are_refused_at_submit_as_a_server_tools_are(rig: Rig) -> None:
    connect_with_add(rig)
    with pytest.raises(InvalidTaskTree) as client_route:
        rig.scheduler.accept(call("notes.add", {"a": 1}))
    with pytest.raises(InvalidTaskTree) as server_route:
        rig.scheduler.accept(call("echo", {}))
    assert client_route.value.problems == ["task 'call': args: 'b' is a required property"]
    assert server_route.value.problems == ["task 'call': args: 'value' is a required property"]
    assert (
        rig.store.list_trees(limit=10) == [] and rig.sent.of("call") == []
    )  # nothing recorded, nothing sent


def test_a_client_only_tools_good_arguments_are_accepted_and_sent_to_it(rig: Rig) -> None:
    connect_with_add(rig)
    accepted = rig.scheduler.accept(call("add", {"a": 1, "b": 2}))
    assert [c.client_id for c in rig.sent.of("call")] == ["laptop"], accepted
