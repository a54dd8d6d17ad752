"""workers.execute: every outcome is a ToolResult; built-ins and real MCP servers."""

from __future__ import annotations

import itertools
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import InThread, wait_until
from tests.unit.workers.helpers import DEMO_SERVER, make_config, stdio
from workers.contracts import ToolCall, ToolResult, ToolType
from workers.errors import InvalidArguments
from workers.execute import execute
from workers.mcp_clients import MCPClientManager, value_of
from workers.tools import builtin
from workers.tools.builtin import BuiltinTool


def call(tool: str, tool_type: ToolType = ToolType.BUILT_IN, **overrides: Any) -> ToolCall:
    fields: dict[str, Any] = {
        "run_id": "r1",
        "tree_id": "t1",
        "task_id": "k1",
        "tool": tool,
        "tool_type": tool_type,
        "args": {},
        "timeout_s": 10,
        "max_result_bytes": 10_000,
    }
    return ToolCall(**(fields | overrides))


def failed(result: ToolResult) -> tuple[str, str]:
    assert not result.ok and result.value is None and result.error is not None
    return result.error.type, result.error.message


def test_builtin_ok_fills_the_result() -> None:
    ticks = itertools.count(100)
    result = execute(
        call("echo", args={"value": [1, "two"]}), mcp=None, worker="w1", clock=lambda: next(ticks)
    )
    assert result.ok and result.value == [1, "two"] and result.error is None
    assert (result.run_id, result.tree_id, result.task_id, result.tool) == ("r1", "t1", "k1", "echo")
    assert (result.worker, result.started_at, result.finished_at, result.client_id) == ("w1", 100, 101, None)


@pytest.mark.parametrize(
    ("tool", "args", "message"),
    [
        ("echo", {}, "invalid arguments for tool 'echo': args: 'value' is a required property"),
        (
            "echo",
            {"value": 1, "extra": 2},
            "invalid arguments for tool 'echo': args: Additional properties are not allowed ('extra' was unexpected)",
        ),
        (
            "sleep",
            {"seconds": "5"},
            "invalid arguments for tool 'sleep': args.seconds: '5' is not of type 'number'",
        ),
        (
            "text_transform",
            {"text": "x", "op": "shout"},
            "invalid arguments for tool 'text_transform': args.op: 'shout' is not one of",
        ),
        (
            "http_get",
            {"url": "ftp://h/"},
            "invalid arguments for tool 'http_get': args.url: 'ftp://h/' does not match",
        ),
    ],
)
def test_bad_args_are_invalid_arguments(tool: str, args: dict[str, Any], message: str) -> None:
    kind, text = failed(execute(call(tool, args=args), mcp=None, worker="w"))
    assert kind == "InvalidArguments" and text.startswith(message)


def test_every_argument_problem_is_listed_in_the_words_the_brain_uses() -> None:
    """Issue 10 item 7: the same wording as `vancetope explain` (brain.core.validation), all problems."""
    kind, text = failed(execute(call("sleep", args={"seconds": "5", "extra": 1}), mcp=None, worker="w"))
    assert kind == "InvalidArguments"
    assert text == (
        "invalid arguments for tool 'sleep': args: Additional properties are not allowed ('extra' was unexpected); "
        "args.seconds: '5' is not of type 'number'"
    )


def test_builtin_timeout_stops_the_sleep_thread() -> None:
    # asked for 10 minutes: the 0.2 s timeout answers long before
    running = InThread(
        lambda: execute(call("sleep", args={"seconds": 600}, timeout_s=0.2), mcp=None, worker="w")
    )
    wait_until(running.done, timeout=60, what="execute to answer at the timeout")
    assert failed(running.result()) == ("ToolTimeout", "tool 'sleep' did not answer within 0.2s")
    wait_until(
        lambda: not any(t.name == "builtin:sleep" for t in threading.enumerate()),
        timeout=60,
        what="the cancelled sleep thread to end",
    )


def test_a_builtin_whose_task_is_cancelled_while_it_runs_is_stopped() -> None:
    asks: list[int] = []

    def cancelled() -> bool:  # the cancel lands while the call runs, found at the second ask
        asks.append(1)
        return len(asks) >= 2

    running = InThread(
        lambda: execute(
            call("sleep", args={"seconds": 600}, timeout_s=600), mcp=None, worker="w", stopped=cancelled
        )
    )
    wait_until(running.done, timeout=60, what="execute to give the call up")
    assert failed(running.result()) == (
        "Cancelled",
        "tool 'sleep' was stopped: its task was cancelled or expired while it ran",
    )
    assert len(asks) == 2
    wait_until(
        lambda: not any(t.name == "builtin:sleep" for t in threading.enumerate()),
        timeout=60,
        what="the stopped sleep thread to end",
    )


def test_builtin_calls_reuse_their_threads_and_one_that_hangs_holds_none_of_the_next() -> None:
    def builtin_threads() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name.startswith("builtin:")]

    for _ in range(50):
        assert execute(call("sleep", args={"seconds": 0}), mcp=None, worker="w").ok
    assert 1 <= len(builtin_threads()) <= 4  # kept spare, not one per call

    hung = execute(call("sleep", args={"seconds": 30}, timeout_s=0.2), mcp=None, worker="w")
    assert failed(hung) == ("ToolTimeout", "tool 'sleep' did not answer within 0.2s")
    # the next call runs at once in another thread while the timed-out one winds down
    assert execute(call("sleep", args={"seconds": 0}), mcp=None, worker="w").ok


def test_a_builtin_that_cannot_block_runs_in_the_calling_thread_one_that_can_in_another(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """echo, text_transform, json_transform declare they cannot block: no hand-off to a thread."""
    assert {name for name, tool in builtin.BUILTINS.items() if not tool.blocks} == {
        "echo",
        "text_transform",
        "json_transform",
    }
    ran_in: list[threading.Thread] = []

    def echo_here(args: dict[str, Any], ctx: builtin.BuiltinContext) -> Any:
        ran_in.append(threading.current_thread())
        return args["value"]

    descriptor = builtin.BUILTINS["echo"].descriptor
    monkeypatch.setitem(builtin.BUILTINS, "echo", BuiltinTool(descriptor, echo_here, blocks=False))
    assert execute(call("echo", args={"value": 1}), mcp=None, worker="w").value == 1
    monkeypatch.setitem(builtin.BUILTINS, "echo", BuiltinTool(descriptor, echo_here))
    assert execute(call("echo", args={"value": 2}), mcp=None, worker="w").value == 2
    assert ran_in[0] is threading.current_thread() and ran_in[1] is not threading.current_thread()


def test_a_builtin_run_inline_that_answers_after_its_timeout_times_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def slow(args: dict[str, Any], ctx: builtin.BuiltinContext) -> Any:
        time.sleep(0.1)  # past the 0.05 s deadline whatever the machine's speed
        return args["value"]

    descriptor = builtin.BUILTINS["echo"].descriptor
    monkeypatch.setitem(builtin.BUILTINS, "echo", BuiltinTool(descriptor, slow, blocks=False))
    kind, text = failed(execute(call("echo", args={"value": 1}, timeout_s=0.05), mcp=None, worker="w"))
    assert (kind, text) == ("ToolTimeout", "tool 'echo' did not answer within 0.05s")


def test_result_cap() -> None:
    result = execute(call("echo", args={"value": "x" * 100}, max_result_bytes=50), mcp=None, worker="w")
    assert failed(result) == (
        "ResultTooLarge",
        (
            "result of tool 'echo' is 102 bytes, over the cap of 50 bytes "
            "(raise max_result_bytes / VANCETOPE_MAX_RESULT_BYTES, or return less)"
        ),
    )
    assert result.error is not None and result.error.data == {"tool": "echo", "size": 102, "cap": 50}


def test_unserialisable_and_unexpected_failures(monkeypatch: pytest.MonkeyPatch) -> None:
    echo = builtin.BUILTINS["echo"].descriptor
    monkeypatch.setitem(builtin.BUILTINS, "echo", BuiltinTool(echo, lambda args, ctx: {1, 2}))
    kind, text = failed(execute(call("echo", args={"value": 1}), mcp=None, worker="w"))
    assert kind == "ToolFailed" and text.startswith("result of tool 'echo' is not JSON-serialisable")
    monkeypatch.setitem(builtin.BUILTINS, "echo", BuiltinTool(echo, lambda args, ctx: 1 / 0))
    assert failed(execute(call("echo", args={"value": 1}), mcp=None, worker="w")) == (
        "ZeroDivisionError",
        "division by zero",
    )


def test_unknown_builtin_native_and_mcp_without_manager() -> None:
    assert failed(execute(call("nope"), mcp=None, worker="w"))[1].startswith(
        "no built-in tool 'nope' on the server (built-ins: echo, http_get"
    )
    assert failed(execute(call("screenshot", ToolType.NATIVE), mcp=None, worker="w")) == (
        "ToolNotFound",
        "native tool 'screenshot' runs only on a client agent, not on the server",
    )
    assert failed(execute(call("add", ToolType.MCP, mcp_server="demo"), mcp=None, worker="w")) == (
        "ToolNotFound",
        "MCP tool 'add' needs server 'demo', but this worker has no MCP config",
    )


def test_mcp_call_through_execute(manager: MCPClientManager) -> None:
    result = execute(
        call("add", ToolType.MCP, mcp_server="demo", args={"a": 1, "b": 2}), mcp=manager, worker="w"
    )
    # The whole CallToolResult travels; the convenient value is derived where it is recorded.
    assert result.ok and result.value is None and result.mcp is not None
    assert result.mcp["content"] == [{"type": "text", "text": "3"}]
    assert result.mcp["structuredContent"] == {"result": 3}
    assert value_of(result.mcp) == 3


def test_an_mcp_call_whose_task_is_cancelled_is_stopped_and_the_server_told(
    manager: MCPClientManager, tmp_path: Path
) -> None:
    mark = tmp_path / "cancelled"
    slow = call("slow", ToolType.MCP, mcp_server="demo", args={"seconds": 600, "cancelled_mark": str(mark)})
    result = execute(
        slow.model_copy(update={"timeout_s": 600}), mcp=manager, worker="w", stopped=lambda: True
    )
    assert failed(result) == (
        "Cancelled",
        "tool 'slow' on MCP server 'demo' was stopped: its task was cancelled or expired while it ran",
    )
    # The SDK sent notifications/cancelled: the server's handler was interrupted.
    wait_until(mark.exists, timeout=60, what="the demo server to see its call cancelled")
    assert manager.call_tool("demo", "add", {"a": 1, "b": 1}, timeout=60) == 2


def test_mcp_args_are_validated_even_on_the_first_call_of_a_process() -> None:
    fresh = MCPClientManager(make_config({"demo": stdio(DEMO_SERVER)}))
    try:
        assert fresh.input_schema("demo", "add") is None  # nothing listed yet
        bad = call("add", ToolType.MCP, mcp_server="demo", args={"a": "x", "b": 2})
        result = execute(bad, mcp=fresh, worker="w")
        assert failed(result) == (
            "InvalidArguments",
            "invalid arguments for tool 'add': args.a: 'x' is not of type 'integer'",
        )
        assert result.error is not None and result.error.data == {"tool": "add", "field": "a"}
        missing = execute(call("add", ToolType.MCP, mcp_server="demo", args={"b": 2}), mcp=fresh, worker="w")
        assert failed(missing)[1] == "invalid arguments for tool 'add': args: 'a' is a required property"
    finally:
        fresh.close()


def test_mcp_failures_become_results(manager: MCPClientManager) -> None:
    big = execute(
        call("big", ToolType.MCP, mcp_server="demo", args={"n": 500}, max_result_bytes=100),
        mcp=manager,
        worker="w",
    )
    # The whole result counts (the text block and the structured copy the SDK server adds),
    # and the message names the block that weighs most.
    assert re.match(
        r"result of tool 'big' is \d+ bytes \(its largest content block, #0 text, is \d+ bytes\), "
        r"over the cap of 100 bytes",
        failed(big)[1],
    )
    slow = execute(
        call("slow", ToolType.MCP, mcp_server="demo", args={"seconds": 5}, timeout_s=0.2),
        mcp=manager,
        worker="w",
    )
    assert failed(slow) == ("ToolTimeout", "tool 'slow' on MCP server 'demo' did not answer within 0.2s")
    crash = execute(call("x", ToolType.MCP, mcp_server="crash"), mcp=manager, worker="w")
    kind, text = failed(crash)
    assert kind == "MCPServerUnavailable" and "demo crash: missing API token" in text
    boom = execute(
        call("fail", ToolType.MCP, mcp_server="demo", args={"msg": "boom"}), mcp=manager, worker="w"
    )
    assert failed(boom)[0] == "ToolFailed" and "boom" in failed(boom)[1]


def test_a_schema_object_is_written_out_once_to_find_its_validator(monkeypatch: pytest.MonkeyPatch) -> None:
    from workers import execute as execute_module

    looked_up: list[str] = []
    real = execute_module._validator

    def counted(schema_json: str) -> Any:
        looked_up.append(schema_json)
        return real(schema_json)

    monkeypatch.setattr(execute_module, "_validator", counted)
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    for n in range(5):
        execute_module.validate_args("t", schema, {"n": n})
    with pytest.raises(InvalidArguments):
        execute_module.validate_args("t", schema, {"n": "x"})
    assert len(looked_up) == 1
    execute_module.validate_args("t", dict(schema), {"n": 1})  # an equal schema, another object
    assert len(looked_up) == 2
