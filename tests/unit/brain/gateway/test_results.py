"""A task record as an MCP tool result (brain.gateway.results), and who hears of a change
(brain.gateway.server.changed_users): tables, no I/O."""

from __future__ import annotations

from typing import Any

import pytest

from brain.core.models import TaskRecord, TaskState
from brain.gateway.results import final_result, queued_result, value_result, waited_result
from brain.gateway.server import changed_users
from workers.contracts import ErrorInfo

WHOLE = {
    "content": [{"type": "text", "text": "hi"}, {"type": "image", "data": "AAAA", "mimeType": "image/png"}],
    "structuredContent": {"x": 1},
    "isError": False,
}


def record(state: TaskState, **extra: Any) -> TaskRecord:
    return TaskRecord(tree_id="mcp-t-1", task_id="call", tool="t", state=state, **extra)


def test_an_mcp_tools_whole_result_is_returned_as_its_server_sent_it() -> None:
    result = final_result(record(TaskState.DONE, result={"x": 1}, mcp=WHOLE))
    dumped = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    assert dumped["content"] == WHOLE["content"] and dumped["structuredContent"] == {"x": 1}


@pytest.mark.parametrize(
    ("value", "text", "structured"),
    [({"a": 1}, '{\n "a": 1\n}', {"a": 1}), (5, "5", {"result": 5}), ("plain", "plain", {"result": "plain"})],
)
def test_a_plain_value_becomes_text_and_structured_content(value: Any, text: str, structured: Any) -> None:
    result = value_result(value)
    assert result.content[0].text == text and result.structured_content == structured  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("rec", "words"),
    [
        (
            record(TaskState.FAILED, error=ErrorInfo(type="ToolFailed", message="boom"), reason="x"),
            "tool 't' failed: boom (tree mcp-t-1, task call)",
        ),
        (
            record(TaskState.SKIPPED, reason="client offline (skip)"),
            "tool 't' skipped: client offline (skip)",
        ),
        (record(TaskState.EXPIRED, reason="waited too long"), "tool 't' expired: waited too long"),
    ],
)
def test_a_task_that_did_not_end_done_is_an_error_result_naming_the_tool(rec: TaskRecord, words: str) -> None:
    result = final_result(rec)
    assert result.is_error and words in result.content[0].text  # type: ignore[union-attr]


def test_a_queued_call_returns_its_task_id_to_fetch_later() -> None:
    result = queued_result(record(TaskState.PENDING_CLIENT, reason="Queued for Client: t"))
    assert not result.is_error
    assert result.structured_content == {"tree_id": "mcp-t-1", "task_id": "call", "state": "pending_client"}
    assert "brain_tree_status" in result.content[0].text  # type: ignore[union-attr]


def test_a_blocked_call_that_waited_in_vain_keeps_the_routers_words() -> None:
    result = waited_result(record(TaskState.BLOCKED, reason="Waiting for Client for Tool: t"), 2.0)
    assert result.is_error and result.content[0].text.startswith("Waiting for Client for Tool: t (waited 2s")  # type: ignore[union-attr]


A = (frozenset({("laptop", "s1")}), "d1")
B = (frozenset({("laptop", "s2")}), "d1")
A2 = (frozenset({("laptop", "s1")}), "d2")  # the same session, other tools
NONE = (frozenset(), "d0")  # no client connected


@pytest.mark.parametrize(
    ("before", "after", "told"),
    [
        ((None, {}), (1.0, {"ada": A}), set()),  # nothing known before: nobody
        ((1.0, {"ada": A}), (1.0, {"ada": A}), set()),
        ((1.0, {"ada": A}), (1.0, {"ada": NONE}), {"ada"}),  # ada's client left
        ((1.0, {"ada": A}), (1.0, {}), {"ada"}),  # ada's client left, ada no longer watched
        ((1.0, {}), (1.0, {"bob": A}), {"bob"}),  # bob's client came
        ((1.0, {}), (1.0, {"bob": NONE}), set()),  # bob's first MCP session: he just listed
        ((1.0, {"ada": A}), (1.0, {"ada": B}), {"ada"}),  # reconnected (a new session)
        ((1.0, {"ada": A}), (1.0, {"ada": A2}), {"ada"}),  # re-announced other tools, or one approved
        ((1.0, {"ada": A}), (2.0, {"ada": A}), {"ada", "bob"}),  # the registry reloaded: everyone
    ],
)
def test_list_changed_goes_to_the_users_whose_clients_tools_or_registry_changed(
    before: Any, after: Any, told: set[str]
) -> None:
    assert changed_users(before, after, {"ada", "bob"}) == told
