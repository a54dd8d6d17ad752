"""workers.call_relay: an MCP call's log messages and sampling/elicitation requests, bounded,
passed to the route's channel; asks only for a gateway call (``interactive``), refused inside a
tree with an error naming the tool. Pure pieces, then a real stdio server (the talk fixture)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from mcp import types

from tests.unit.workers.helpers import FIXTURES, make_config, stdio
from workers.call_relay import LOGS_PER_S, LogBudget, capped_data, level_passes, wait_answer
from workers.contracts import MAX_LOG_DATA_BYTES, AskAnswer, ToolAsk, ToolCall, ToolLog, ToolType, json_size
from workers.execute import execute
from workers.mcp_clients import MCPClientManager, _Session

CALL = ToolCall(
    run_id="r1",
    tree_id="t1",
    task_id="k1",
    tool="chatty",
    tool_type=ToolType.MCP,
    mcp_server="talk",
    args={},
    timeout_s=20,
    max_result_bytes=10_000,
)


def test_levels_follow_rfc_5424_and_no_threshold_passes_everything() -> None:
    assert level_passes("debug", None) and level_passes("emergency", None)
    assert not level_passes("debug", "info") and level_passes("info", "info")
    assert level_passes("warning", "notice") and not level_passes("critical", "alert")


def test_data_over_the_cap_is_cut_to_text_that_fits() -> None:
    assert capped_data({"a": 1}) == {"a": 1}
    cut = capped_data("é" * 100_000)
    assert isinstance(cut, str) and cut.endswith("bytes)") and json_size(cut) <= MAX_LOG_DATA_BYTES
    assert json_size(capped_data(list(range(50_000)))) <= MAX_LOG_DATA_BYTES


def test_the_log_budget_passes_a_burst_then_counts_what_it_drops() -> None:
    now = [0.0]
    budget = LogBudget(5, lambda: now[0])
    assert [budget.take() for _ in range(8)] == [True] * 5 + [False] * 3
    assert budget.dropped == 3
    now[0] = 1.0
    assert budget.take()


def test_an_answer_is_waited_for_in_short_blocks_and_others_are_skipped() -> None:
    ask_id, other = "a" * 32, "b" * 32
    replies = [None, b"not json", AskAnswer(ask_id=other, ok=True, result={}).model_dump_json().encode()]
    replies.append(AskAnswer(ask_id=ask_id, ok=True, result={"x": 1}).model_dump_json().encode())
    blocks: list[float] = []

    def pop(block: float) -> bytes | None:
        blocks.append(block)
        return replies.pop(0)

    answer = wait_answer(pop, ask_id, 30)
    assert answer.ok and answer.result == {"x": 1} and max(blocks) <= 2.0


def test_no_answer_in_time_is_a_refusal_saying_so() -> None:
    now = [0.0]

    def pop(block: float) -> bytes | None:
        now[0] += block
        return None

    answer = wait_answer(pop, "c" * 32, 5, clock=lambda: now[0])
    assert not answer.ok and "did not answer within 5s" in answer.error


class Channel:
    """A route's channel that answers each ask at once."""

    def __init__(self) -> None:
        self.logs: list[ToolLog] = []
        self.asks: list[ToolAsk] = []

    def log(self, update: ToolLog) -> None:
        self.logs.append(update)

    def ask(self, ask: ToolAsk, timeout: float) -> AskAnswer:
        self.asks.append(ask)
        if ask.kind == "sampling":
            result = {"role": "assistant", "content": {"type": "text", "text": "four"}, "model": "m1"}
        else:
            result = {"action": "accept", "content": {"name": "Ada"}}
        return AskAnswer(ask_id=ask.ask_id, ok=True, result=result)


@pytest.fixture(scope="module")
def manager() -> Iterator[MCPClientManager]:
    found = MCPClientManager(make_config({"talk": stdio(str(FIXTURES / "mcp_talk_server.py"))}))
    yield found
    found.close()


def test_three_log_messages_reach_the_channel_in_order(manager: MCPClientManager) -> None:
    channel = Channel()
    result = execute(CALL, mcp=manager, worker="w1", channel=channel)
    assert result.ok, result.error
    assert [(u.level, u.data, u.logger) for u in channel.logs] == [
        ("debug", "debug message 0", "talk"),
        ("info", "info message 1", "talk"),
        ("warning", "warning message 2", "talk"),
    ]
    assert {(u.run_id, u.task_id) for u in channel.logs} == {("r1", "k1")}


def test_a_flood_of_logs_is_cut_to_the_budget_and_the_call_goes_on(manager: MCPClientManager) -> None:
    channel = Channel()
    call = CALL.model_copy(update={"tool": "flood", "args": {"n": 500}})
    started = time.monotonic()
    result = execute(call, mcp=manager, worker="w1", channel=channel)
    took = time.monotonic() - started
    assert result.ok, result.error
    # A burst of LOGS_PER_S, then LOGS_PER_S a second for as long as the flood lasted.
    assert LOGS_PER_S <= len(channel.logs) <= LOGS_PER_S * (1 + took) + 1 < 500


def test_a_gateway_calls_sampling_and_elicitation_round_trip(manager: MCPClientManager) -> None:
    channel = Channel()
    sampled = execute(
        CALL.model_copy(update={"tool": "ask_llm", "args": {"prompt": "2+2?"}, "interactive": True}),
        mcp=manager,
        worker="w1",
        channel=channel,
    )
    assert sampled.ok, sampled.error
    assert sampled.mcp is not None and "LLM said: four (m1)" in sampled.mcp["content"][0]["text"]
    asked = execute(
        CALL.model_copy(update={"tool": "ask_user", "args": {"question": "name?"}, "interactive": True}),
        mcp=manager,
        worker="w1",
        channel=channel,
    )
    assert asked.ok, asked.error
    assert asked.mcp is not None and "user said: Ada" in asked.mcp["content"][0]["text"]
    assert [a.kind for a in channel.asks] == ["sampling", "elicitation"]
    assert channel.asks[0].params["messages"][0]["content"]["text"] == "2+2?"


def test_inside_a_tree_sampling_is_refused_at_once_naming_the_tool(manager: MCPClientManager) -> None:
    channel = Channel()
    result = execute(
        CALL.model_copy(update={"tool": "ask_llm", "args": {"prompt": "2+2?"}}),
        mcp=manager,
        worker="w1",
        channel=channel,
    )
    assert not result.ok and result.error is not None
    assert "sampling is not available to calls from task trees" in result.error.message
    assert "'ask_llm'" in result.error.message
    assert channel.asks == []


class Hooks:
    def __init__(self) -> None:
        self.tool = "t"
        self.interactive = True
        self.logs: list[object] = []

    def log(self, level: object, logger: str | None, data: object) -> None:
        self.logs.append(data)

    async def ask(self, kind: object, params: dict[str, object]) -> dict[str, object]:
        return {"action": "decline"}


def test_a_server_message_goes_to_the_only_call_in_flight_and_with_two_to_neither() -> None:
    # The SDK's callbacks name no request: with two calls on one session, whose is unknown.
    session = _Session("talk", make_config({"talk": stdio("x")}).servers["talk"])
    one, two = Hooks(), Hooks()
    params = types.LoggingMessageNotificationParams(level="info", data="hello")
    elicit = types.ElicitRequestFormParams(
        message="name?", requested_schema={"type": "object", "properties": {}}
    )

    async def scenario() -> tuple[object, object]:
        session.inflight[:] = [one]
        await session._on_log(params)
        alone = await session._on_elicitation(None, elicit)
        session.inflight[:] = [one, two]
        await session._on_log(params)
        crowded = await session._on_elicitation(None, elicit)
        return alone, crowded

    alone, crowded = asyncio.run(scenario())
    assert one.logs == ["hello"] and two.logs == []
    assert isinstance(alone, types.ElicitResult) and alone.action == "decline"
    assert isinstance(crowded, types.ErrorData) and "2 calls in flight" in crowded.message
    if session.stderr is not None:
        session.stderr.close()
