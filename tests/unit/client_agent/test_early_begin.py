"""client_agent.early_begin: a run starts while kombu reserves its message, and the task takes
that start. The messages are real: sent by a Celery app to a real redis-server, popped raw and
checked as the agent's transport checks them (workers.transport.check_payload)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from client_agent.early_begin import EarlyBegin, tool_call_of
from workers.app import make_app
from workers.contracts import RUN_TOOL_TASK, ToolCall, ToolType
from workers.transport import check_payload

QUEUE = "client.laptop"


def call(run: str = "t-k-1", client_id: str | None = "laptop") -> ToolCall:
    return ToolCall(
        run_id=run, tree_id="t", task_id="k", tool="read_local_file", tool_type=ToolType.BUILT_IN,
        timeout_s=5, max_result_bytes=1000, client_id=client_id,
    )  # fmt: skip


@pytest.fixture
def popped(redis_server: Any, redis_client: redis.Redis) -> Iterator[Any]:
    """Send a task as the brain does, then pop the raw message as kombu's BRPOP would."""
    app = make_app(redis_server.url)

    def send(task: str, args: list[Any]) -> dict[str, Any]:
        app.send_task(task, args=args, queue=QUEUE)
        raw = redis_client.rpop(QUEUE)
        assert raw is not None
        return check_payload(raw)

    yield send
    app.close()


def test_a_tool_call_for_this_client_is_read_from_its_message(popped: Any) -> None:
    message = popped(RUN_TOOL_TASK, [call().model_dump(mode="json")])
    assert tool_call_of(message, "laptop") == call()


@pytest.mark.parametrize(
    ("task", "args", "why"),
    [
        (RUN_TOOL_TASK, [call(client_id="desk").model_dump(mode="json")], "another client's call"),
        ("vancetope.record_result", [call().model_dump(mode="json")], "not a tool call task"),
        (RUN_TOOL_TASK, [{"run_id": "x"}], "not a valid tool call"),
        (RUN_TOOL_TASK, [], "no argument"),
    ],
)
def test_anything_else_is_left_to_the_task(popped: Any, task: str, args: list[Any], why: str) -> None:
    assert tool_call_of(popped(task, args), "laptop") is None, why


class Starts:
    """A RunStart that records what it was asked and answers a delivery number."""

    def __init__(self, fail_first: bool = False) -> None:
        self.asked: list[tuple[str, str]] = []
        self.fail_first = fail_first
        self.lock = threading.Lock()

    def __call__(self, c: ToolCall, worker: str, started_at: float) -> int | None:
        with self.lock:
            self.asked.append((c.run_id, threading.current_thread().name))
            if self.fail_first and len(self.asked) == 1:
                raise redis.ConnectionError("connection reset by peer")
            return len(self.asked)


def test_the_task_takes_the_start_made_when_its_message_arrived(popped: Any) -> None:
    starts = Starts()
    early = EarlyBegin(starts, "laptop", "client-agent@laptop")
    try:
        early.on_delivery(popped(RUN_TOOL_TASK, [call().model_dump(mode="json")]))
        assert early.begin(call(), "client-agent@laptop", 1.0) == 1
        assert [name.startswith("vancetope-begin") for _, name in starts.asked] == [
            True
        ]  # started once, early
    finally:
        early.close()


def test_without_an_early_start_the_task_starts_the_run_itself() -> None:
    starts = Starts()
    early = EarlyBegin(starts, "laptop", "client-agent@laptop")
    try:
        assert early.begin(call(), "w", 1.0) == 1
        assert [run for run, _ in starts.asked] == ["t-k-1"]
    finally:
        early.close()


def test_an_early_start_that_failed_is_made_again_by_the_task(popped: Any) -> None:
    starts = Starts(fail_first=True)
    early = EarlyBegin(starts, "laptop", "client-agent@laptop")
    try:
        early.on_delivery(popped(RUN_TOOL_TASK, [call().model_dump(mode="json")]))
        assert early.begin(call(), "w", 1.0) == 2
        assert len(starts.asked) == 2
    finally:
        early.close()
