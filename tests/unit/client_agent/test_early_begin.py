"""client_agent.early_begin: a run's begin is sent as its message arrives; a first delivery's
tool starts without its answer, a restored message's waits for it. The messages are real: sent by a Celery app to a real redis-server, popped raw and
checked as the agent's transport checks them (workers.transport.check_payload)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest
import redis

from client_agent.early_begin import FIRST_DELIVERY, EarlyBegin, tool_call_of
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
    """A begin made now (``RunStart``) that records what it was asked and answers a number."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def __call__(self, c: ToolCall, worker: str, started_at: float) -> int | None:
        self.asked.append(c.run_id)
        return 100 + len(self.asked)


class Sends:
    """A begin sent ahead: each answer is a future the test completes (or never does)."""

    def __init__(self, fail: bool = False) -> None:
        self.answers: list[Future[int | None]] = []
        self.fail = fail

    def __call__(self, c: ToolCall, worker: str, started_at: float) -> Future[int | None]:
        if self.fail:
            raise redis.ConnectionError("connection refused")
        self.answers.append(Future())
        return self.answers[-1]


def restored(message: dict[str, Any]) -> dict[str, Any]:
    """The message as kombu puts it back on its queue (``_do_restore_message``)."""
    message["headers"]["redelivered"] = True
    message["properties"]["delivery_info"]["redelivered"] = True
    return message


def test_a_first_delivery_starts_without_waiting_for_the_begins_answer(popped: Any) -> None:
    begin_now, sends = Starts(), Sends()
    early = EarlyBegin(begin_now, sends, "laptop", "client-agent@laptop")
    early.on_delivery(popped(RUN_TOOL_TASK, [call().model_dump(mode="json")]))
    assert len(sends.answers) == 1  # sent as the message arrived
    with ThreadPoolExecutor(1) as task:
        started = task.submit(early.begin, call(), "client-agent@laptop", 1.0)
        try:
            # The answer is still pending: a begin that waited for it would time out here.
            assert started.result(timeout=30) == FIRST_DELIVERY
        finally:
            sends.answers[0].set_result(1)  # the answer, when it comes, is only logged
    assert begin_now.asked == []


def test_a_begin_answered_before_the_task_looks_is_taken_as_it_is(popped: Any) -> None:
    early = EarlyBegin(Starts(), sends := Sends(), "laptop", "client-agent@laptop")
    early.on_delivery(popped(RUN_TOOL_TASK, [call().model_dump(mode="json")]))
    sends.answers[0].set_result(None)  # found cancelled
    assert early.begin(call(), "w", 1.0) is None  # never starts


def test_a_restored_message_waits_for_its_count(popped: Any) -> None:
    early = EarlyBegin(Starts(), sends := Sends(), "laptop", "client-agent@laptop")
    early.on_delivery(restored(popped(RUN_TOOL_TASK, [call().model_dump(mode="json")])))
    answering = threading.Timer(0.2, lambda: sends.answers[0].set_result(4))
    answering.start()
    try:
        assert early.begin(call(), "w", 1.0) == 4  # past max_deliveries: the task fails it as poison
    finally:
        answering.join()


def test_a_restored_message_whose_begin_failed_is_begun_again_by_the_task(popped: Any) -> None:
    begin_now = Starts()
    early = EarlyBegin(begin_now, sends := Sends(), "laptop", "client-agent@laptop")
    early.on_delivery(restored(popped(RUN_TOOL_TASK, [call().model_dump(mode="json")])))
    sends.answers[0].set_exception(redis.TimeoutError("Timeout reading from socket"))
    assert early.begin(call(), "w", 1.0) == 101
    assert begin_now.asked == ["t-k-1"]


@pytest.mark.parametrize("sent", [False, True], ids=["no early begin", "sending failed"])
def test_without_a_begin_sent_the_task_begins_the_run_itself(popped: Any, sent: bool) -> None:
    begin_now = Starts()
    early = EarlyBegin(begin_now, Sends(fail=True), "laptop", "client-agent@laptop")
    if sent:
        early.on_delivery(popped(RUN_TOOL_TASK, [call().model_dump(mode="json")]))
    assert early.begin(call(), "w", 1.0) == 101
    assert begin_now.asked == ["t-k-1"]
