"""One measure of a result's size (workers.contracts.result_size), held by the server worker,
the client agent and the brain alike.

Issue 21: the brain measured a result as ASCII-escaped JSON with spaces, the worker and the agent
as compact UTF-8 JSON, so with a 10,000-byte cap a 9,902-byte result passed the worker and the
agent and was refused by the brain at about twice its size."""

from __future__ import annotations

import json
from typing import Any

import pytest

from brain.runtime.intake import checked_payload
from client_agent.redact import capped
from workers.contracts import ToolCall, ToolResult, ToolType, result_size
from workers.execute import execute
from workers.tools import builtin
from workers.tools.builtin import BuiltinTool

CAP = 10_000
# Non-ASCII text and the separators JSON may add are what the three measures disagreed on.
TEXT = "Grüße, ☃ — " * 400


def whole(text: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "isError": False}


def test_result_size_is_compact_utf8_json_of_the_value_and_the_whole_result() -> None:
    assert result_size("é") == len('"é"'.encode())
    assert result_size({"a": [1, 2]}, {"b": None}) == len(b'{"a":[1,2]}') + len(b'{"b":null}')
    assert result_size(None) == 0
    with pytest.raises(ValueError):
        result_size(float("nan"))


def run_in_worker(value: Any, cap: int, monkeypatch: pytest.MonkeyPatch) -> ToolResult:
    echo = builtin.BUILTINS["echo"].descriptor
    monkeypatch.setitem(builtin.BUILTINS, "echo", BuiltinTool(echo, lambda args, ctx: value))
    call = ToolCall(
        run_id="r1",
        tree_id="t1",
        task_id="k1",
        tool="echo",
        tool_type=ToolType.BUILT_IN,
        args={"value": 1},
        timeout_s=10,
        max_result_bytes=cap,
    )
    return execute(call, mcp=None, worker="w")


@pytest.mark.parametrize("mcp", [False, True], ids=["value", "value+mcp"])
def test_what_passes_the_worker_passes_the_agent_and_the_brain_at_the_same_cap(
    mcp: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = run_in_worker(TEXT, CAP, monkeypatch)
    assert result.ok, result.error
    if mcp:
        result = result.model_copy(update={"mcp": whole(TEXT[: len(TEXT) // 3])})
    size = result_size(result.value, result.mcp)
    assert 5_000 < size <= CAP
    # The brain's old measure (ASCII escapes, spaced separators) refused this very result.
    old = len(json.dumps(result.value, default=str)) + (len(json.dumps(result.mcp)) if mcp else 0)
    assert old > 1.5 * size
    assert capped(result, size).ok  # exactly at the cap: the agent sends it
    ok, value, _whole, error = checked_payload(result, size)  # and the brain records it
    assert ok and error is None and value == (TEXT[: len(TEXT) // 3] if mcp else TEXT)


def test_one_byte_over_all_three_refuse_naming_the_same_size(monkeypatch: pytest.MonkeyPatch) -> None:
    size = result_size(TEXT)
    from_worker = run_in_worker(TEXT, size - 1, monkeypatch)
    assert from_worker.error is not None and f"is {size} bytes" in from_worker.error.message
    ok_result = run_in_worker(TEXT, size, monkeypatch)
    from_agent = capped(ok_result, size - 1)
    assert from_agent.error is not None and f"is {size} bytes" in from_agent.error.message
    ok, _value, _whole, error = checked_payload(ok_result, size - 1)
    assert not ok and error is not None and error.type == "ResultTooLarge"
    assert f"is {size} bytes, over the cap of {size - 1} bytes" in error.message
