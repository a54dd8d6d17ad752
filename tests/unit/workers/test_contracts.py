"""workers.contracts: the names everyone builds from one place (queues, keys, ids) and the
limits every envelope enforces. Tables: what is accepted, what is refused and why."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from workers.contracts import (
    BROKER_PRIORITY_STEPS,
    CLIENT_MESSAGE,
    MAX_ANNOUNCED_TOOLS,
    MAX_CALL_TIMEOUT_S,
    MAX_WIRE_ID_CHARS,
    ClientConnected,
    ClientToolResult,
    ScheduleFire,
    SubmitTree,
    ToolCall,
    ToolDescriptor,
    ToolType,
    broker_priority,
    check_pool_name,
    client_key,
    client_keyprefix,
    client_queue,
    key_gateway_reply,
    key_pool_workers,
    key_tool_pins,
    pool_of_queue,
    pool_queue,
    queue_keys,
    submit_queue_of,
)

OK_IDS = ["a", "laptop", "Ada_1.box-2", "x" * 64]
# "laptop\n": a regex ending in "$" let it through
BAD_IDS = ["", "-laptop", ".hidden", "has space", "c:1", "a*", "x" * 65, "é", "laptop\n"]


@pytest.mark.parametrize("cid", OK_IDS)
def test_a_valid_client_id_names_its_queue_prefix_and_keys(cid: str) -> None:
    assert client_queue(cid) == f"client.{cid}"
    assert client_keyprefix(cid) == f"c:{cid}:"
    assert client_key(cid, "ack") == f"c:{cid}:ack"
    assert key_tool_pins(cid) == f"vt:toolpins:{cid}"
    assert submit_queue_of(cid) == f"submit.{cid}"


@pytest.mark.parametrize("cid", BAD_IDS)
@pytest.mark.parametrize("build", [client_queue, client_keyprefix, key_tool_pins, submit_queue_of])
def test_an_invalid_id_names_nothing(cid: str, build: Any) -> None:
    with pytest.raises(ValueError, match="use letters, digits, '_', '.', '-' \\(max 64\\)"):
        build(cid)


@pytest.mark.parametrize(
    ("pool", "queue"),
    [(None, "server"), ("default", "server"), ("gpu", "server.gpu"), ("big_box-2", "server.big_box-2")],
)
def test_pool_queue_and_back(pool: str | None, queue: str) -> None:
    assert pool_queue(pool) == queue
    assert pool_of_queue(queue) == (pool or "default")


@pytest.mark.parametrize(
    "queue", ["brain", "client.laptop", "server.", "server.a.b", "servers", "submit.ada"]
)
def test_a_queue_no_pool_consumes(queue: str) -> None:
    assert pool_of_queue(queue) is None


@pytest.mark.parametrize(
    ("priority", "step"),
    [
        (9, 0), (8, 0),  # high (8): taken first
        (7, 3), (6, 3), (5, 3),  # normal (5)
        (4, 6), (3, 6), (2, 6),  # low (2)
        (1, 9), (0, 9),
    ],
)  # fmt: skip
def test_a_calls_priority_picks_the_broker_step_a_pool_takes_it_in(priority: int, step: int) -> None:
    assert broker_priority(priority) == step


def test_a_queues_keys_are_kombus_lists_in_the_order_a_worker_takes_them() -> None:
    # kombu's Redis transport names them (Channel._q_for_pri) and BRPOPs them in this order.
    from kombu.transport.redis import Channel

    assert tuple(Channel.priority_steps) == BROKER_PRIORITY_STEPS
    expected = tuple(
        f"server.gpu{Channel.sep}{step}" if step else "server.gpu" for step in Channel.priority_steps
    )
    assert queue_keys("server.gpu") == expected


@pytest.mark.parametrize("pool", ["", "-x", "a.b", "a b", "x" * 64, "gpu\n"])
def test_an_invalid_pool_name_is_refused(pool: str) -> None:
    with pytest.raises(ValueError, match="invalid pool name"):
        check_pool_name(pool)
    with pytest.raises(ValueError):
        key_pool_workers(pool)


def test_a_pool_name_of_63_characters_is_the_longest() -> None:
    assert check_pool_name("p" * 63) == "p" * 63


@pytest.mark.parametrize(
    ("request_id", "ok"),
    [("0" * 32, True), ("a1" * 16, True), ("A" * 32, False), ("0" * 31, False), ("g" * 32, False)],
)
def test_gateway_reply_keys_take_32_hex_only(request_id: str, ok: bool) -> None:
    if ok:
        assert key_gateway_reply(request_id) == f"gateway.reply.{request_id}"
    else:
        with pytest.raises(ValueError, match="invalid gateway request id"):
            key_gateway_reply(request_id)


CALL: dict[str, Any] = {
    "run_id": "t.a.1.abc", "tree_id": "t", "task_id": "a", "tool": "echo", "tool_type": "built_in",
    "timeout_s": 30, "max_result_bytes": 1024,
}  # fmt: skip


@pytest.mark.parametrize(
    ("change", "ok"),
    [
        ({}, True),
        ({"run_id": "r" * MAX_WIRE_ID_CHARS}, True),
        ({"run_id": "r" * (MAX_WIRE_ID_CHARS + 1)}, False),
        ({"task_id": ""}, False),
        ({"tool": "t" * 201}, False),
        ({"timeout_s": 0}, False),
        ({"timeout_s": MAX_CALL_TIMEOUT_S}, True),
        ({"timeout_s": MAX_CALL_TIMEOUT_S + 1}, False),
        ({"max_result_bytes": 0}, False),
        ({"max_deliveries": 0}, False),
        ({"tool_type": "shell"}, False),
        ({"secret": "x"}, False),  # nothing beyond the contract travels
    ],
)
def test_tool_call_limits(change: dict[str, Any], ok: bool) -> None:
    data = {**CALL, **change}
    if ok:
        assert ToolCall.model_validate(data).run_id == data["run_id"]
    else:
        with pytest.raises(ValidationError):
            ToolCall.model_validate(data)


def test_interactive_travels_only_when_true_so_an_older_agent_still_parses_ordinary_calls() -> None:
    class OlderToolCall(ToolCall):  # the contract before the field: extra="forbid" refuses it
        @classmethod
        def fields(cls) -> set[str]:
            return set(ToolCall.model_fields) - {"interactive"}

    ordinary = ToolCall.model_validate(CALL).model_dump(mode="json")
    assert "interactive" not in ordinary and set(ordinary) <= OlderToolCall.fields()
    gateway_call = ToolCall.model_validate({**CALL, "interactive": True})
    assert gateway_call.model_dump(mode="json")["interactive"] is True
    assert ToolCall.model_validate(gateway_call.model_dump(mode="json")).interactive


@pytest.mark.parametrize(
    ("fields", "ok"),
    [
        ({"token": "abcdef"}, True),
        ({"token": "abcde"}, False),  # too short to be unique
        ({"token": "ABCDEF"}, False),  # lower-case hex only
        ({"token": "abcdef", "schedule": ""}, False),
        ({"token": "abcdef", "schedule": "s" * 65}, False),
    ],
)
def test_schedule_fire_limits(fields: dict[str, Any], ok: bool) -> None:
    data = {"schedule": "nightly", "fired_at": 1.0, **fields}
    if ok:
        assert ScheduleFire.model_validate(data).catch_up is False
    else:
        with pytest.raises(ValidationError):
            ScheduleFire.model_validate(data)


@pytest.mark.parametrize(("tree_id", "ok"), [(None, True), ("run-1", True), ("run:1", False), ("", False)])
def test_submit_tree_run_ids(tree_id: str | None, ok: bool) -> None:
    if ok:
        assert SubmitTree(tree={}, tree_id=tree_id).tree_id == tree_id
    else:
        with pytest.raises(ValidationError):
            SubmitTree(tree={}, tree_id=tree_id)


def test_an_announcement_carries_at_most_max_announced_tools() -> None:
    tools = [ToolDescriptor(name=f"t{i}", type=ToolType.NATIVE) for i in range(MAX_ANNOUNCED_TOOLS + 1)]
    ClientConnected(client_id="laptop", session_id="s", available_tools=tools[:-1], sent_at=0)
    with pytest.raises(ValidationError):
        ClientConnected(client_id="laptop", session_id="s", available_tools=tools, sent_at=0)
    with pytest.raises(ValidationError):
        ClientConnected(client_id="laptop", session_id="", sent_at=0)


def test_a_client_message_is_read_by_its_type_and_an_unknown_type_is_refused() -> None:
    result = {
        "run_id": "r", "tree_id": "t", "task_id": "a", "tool": "echo", "ok": True, "started_at": 0, "finished_at": 1,
    }  # fmt: skip
    msg = CLIENT_MESSAGE.validate_json(
        ClientToolResult(client_id="laptop", result=result).model_dump_json()  # type: ignore[arg-type]
    )
    assert isinstance(msg, ClientToolResult) and msg.result.run_id == "r"
    with pytest.raises(ValidationError):
        CLIENT_MESSAGE.validate_python({"type": "run_this", "client_id": "laptop"})
    with pytest.raises(ValidationError):  # a negative redaction count is no count
        CLIENT_MESSAGE.validate_python(
            {"type": "tool_result", "client_id": "laptop", "result": {**result, "redactions": -1}}
        )


# --- a tool's metadata (issue 24): optional, so older announcements and snapshots still validate ---


def test_an_older_agents_tool_without_metadata_validates_with_every_field_none() -> None:
    old = '{"name": "git_status", "type": "mcp", "mcp_server": "git", "description": "", "input_schema": {}}'
    tool = ToolDescriptor.model_validate_json(old)
    assert (tool.title, tool.output_schema, tool.annotations, tool.icons, tool.execution, tool.meta) == (
        None,
    ) * 6


def test_a_tools_metadata_is_kept_as_on_the_wire_and_checked_against_the_sdks_models() -> None:
    tool = ToolDescriptor(
        name="git_reset",
        type=ToolType.MCP,
        mcp_server="git",
        annotations={"destructive_hint": True, "readOnlyHint": None, "notAHint": 1},
        icons=[{"src": "data:image/png;base64,AAAA", "mime_type": "image/png"}],
    )
    assert tool.annotations == {"destructiveHint": True}  # wire names; absent and unknown hints left out
    assert tool.icons == [{"src": "data:image/png;base64,AAAA", "mimeType": "image/png"}]
    assert ToolDescriptor.model_validate_json(tool.model_dump_json()) == tool
    with pytest.raises(ValidationError, match="annotations.destructiveHint"):
        ToolDescriptor(name="x", type=ToolType.MCP, mcp_server="s", annotations={"destructiveHint": "maybe"})
    with pytest.raises(ValidationError, match="icons"):
        ToolDescriptor(name="x", type=ToolType.MCP, mcp_server="s", icons=[{"mimeType": "image/png"}])
