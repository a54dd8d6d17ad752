"""brain.gateway.call_events: a gateway call's tree events relayed to its MCP session. Only
its own run's (the task, the current run id, the client it was sent to) are; progress once
each and in order, logs by the session's level, an ask put to the MCP client and its answer (or
why none) written where the asking worker waits. A fake session and a fake Redis."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import anyio
from mcp import types
from mcp.shared.exceptions import MCPError

from brain.core.models import Progress, TaskRecord, TaskState
from brain.gateway.call_events import CallEvents, SessionLevels, answer_key
from workers.contracts import (
    AskAnswer,
    AskEvent,
    LogEvent,
    ProgressEvent,
    ToolAsk,
    ToolLog,
    ToolProgress,
    client_key,
    key_answer,
)

ASK_ID = "a" * 32
REC = TaskRecord(
    tree_id="g", task_id="call", tool="x", state=TaskState.RUNNING, run_id="r1", client_id="laptop"
)


class Session:
    def __init__(self, sampling: bool = True, refuse: bool = False) -> None:
        self.sampling, self.refuse = sampling, refuse
        self.progress: list[tuple[float, float | None, str | None]] = []
        self.logs: list[tuple[str, Any]] = []
        self.requests: list[Any] = []

    async def report_progress(
        self, progress: float, total: float | None = None, message: str | None = None
    ) -> None:
        self.progress.append((progress, total, message))

    async def send_log_message(self, level: str, data: Any, logger: str | None = None, **kw: Any) -> None:
        self.logs.append((level, data))

    def check_client_capability(self, capability: types.ClientCapabilities) -> bool:
        return self.sampling

    async def send_request(self, request: Any, result_type: Any, **kw: Any) -> Any:
        self.requests.append((request, kw["metadata"].related_request_id))
        if self.refuse:
            raise MCPError(types.INVALID_REQUEST, "the user said no")
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text="4"), model="m"
        )


class Redis:
    def __init__(self) -> None:
        self.store: dict[str, list[str]] = {}

    async def lpush(self, key: str, value: str) -> None:
        self.store.setdefault(key, []).append(value)


def events(session: Session, level: Any = None) -> tuple[CallEvents, Redis]:
    redis = Redis()
    found = CallEvents(SimpleNamespace(session=session, request_id=7), redis, "call", level)  # type: ignore[arg-type]
    found.current = REC
    return found, redis


def progress(step: float, at: float, run_id: str = "r1") -> bytes:
    update = ToolProgress(
        run_id=run_id, tree_id="g", task_id="call", progress=step, total=100, at=at, client_id="laptop"
    )
    return ProgressEvent(progress=update).model_dump_json().encode()


def log(level: Any, data: str, run_id: str = "r1", client_id: str | None = "laptop") -> bytes:
    update = ToolLog(
        run_id=run_id, tree_id="g", task_id="call", level=level, data=data, at=1.0, client_id=client_id
    )
    return LogEvent(log=update).model_dump_json().encode()


def ask(run_id: str = "r1", client_id: str | None = "laptop", answer_by: float | None = None) -> bytes:
    found = ToolAsk(
        run_id=run_id,
        tree_id="g",
        task_id="call",
        ask_id=ASK_ID,
        kind="sampling",
        params={"messages": [{"role": "user", "content": {"type": "text", "text": "2+2?"}}], "maxTokens": 5},
        answer_by=time.time() + 30 if answer_by is None else answer_by,
        client_id=client_id,
    )
    return AskEvent(ask=found).model_dump_json().encode()


def handle(relay: CallEvents, *raw: bytes) -> None:
    async def run() -> None:
        for message in raw:
            await relay.handle(message)

    anyio.run(run)


def test_progress_events_are_relayed_each_in_order_and_the_record_adds_only_what_was_missed() -> None:
    session = Session()
    relay, _ = events(session)
    handle(relay, b"1", progress(0, 1.0), progress(50, 1.1), progress(100, 1.2), progress(7, 1.3, "r0"))
    anyio.run(
        relay.progress_from_record,
        REC.model_copy(update={"progress": Progress(progress=100, total=100, at=1.2)}),
    )
    assert session.progress == [(0, 100, None), (50, 100, None), (100, 100, None)]
    later = REC.model_copy(update={"progress": Progress(progress=100, total=100, message="done", at=2.0)})
    anyio.run(relay.progress_from_record, later)
    assert session.progress[-1] == (100, 100, "done")


def test_logs_are_filtered_by_the_sessions_level_and_only_this_runs_pass() -> None:
    session = Session()
    relay, _ = events(session, "info")
    handle(relay, log("debug", "d"), log("info", "i"), log("error", "e"), log("info", "x", run_id="r0"))
    handle(relay, log("info", "y", client_id=None))  # not where the run was sent
    assert session.logs == [("info", "i"), ("error", "e")]


def test_an_ask_of_this_run_is_put_to_the_mcp_client_and_answered_into_the_workers_key() -> None:
    session = Session()
    relay, redis = events(session)
    handle(relay, ask())
    ((request, related),) = session.requests
    assert isinstance(request, types.CreateMessageRequest) and related == 7
    key = client_key("laptop", f"answer:{ASK_ID}")
    answer = AskAnswer.model_validate_json(redis.store[key][0])
    assert answer.ok and answer.result is not None and answer.result["model"] == "m"


def test_a_refusal_or_a_missing_capability_is_answered_as_an_error() -> None:
    for session, said in (
        (Session(refuse=True), "the user said no"),
        (Session(sampling=False), "does not offer sampling"),
    ):
        relay, redis = events(session)
        handle(relay, ask())
        answer = AskAnswer.model_validate_json(next(iter(redis.store.values()))[0])
        assert not answer.ok and said in answer.error


def test_an_ask_for_another_run_or_client_is_not_put_to_anyone() -> None:
    session = Session()
    relay, redis = events(session)
    handle(relay, ask(run_id="r0"), ask(client_id="evil"), ask(client_id=None), b"{not json", b"garbage")
    assert session.requests == [] and redis.store == {}


def test_no_answer_is_written_once_the_worker_stopped_waiting() -> None:
    session = Session()
    relay, redis = events(session)
    handle(relay, ask(answer_by=time.time() - 1))
    assert redis.store == {}


def test_the_answer_goes_to_the_pools_key_or_the_clients_own() -> None:
    pool = ToolAsk(
        run_id="r", tree_id="g", task_id="call", ask_id=ASK_ID, kind="elicitation", params={}, answer_by=0
    )
    assert answer_key(pool) == key_answer(ASK_ID)
    assert answer_key(pool.model_copy(update={"client_id": "laptop"})) == f"c:laptop:answer:{ASK_ID}"


def test_session_levels_are_kept_per_session_and_bounded() -> None:
    levels = SessionLevels(cap=2)
    levels.set(None, "error")
    levels.set("s1", "info")
    levels.set("s2", "error")
    levels.set("s3", "debug")
    assert levels.get(None) is None and levels.get("s1") is None
    assert (levels.get("s2"), levels.get("s3")) == ("error", "debug")


def test_an_event_of_a_run_newer_than_the_record_read_has_the_record_read_again() -> None:
    # The gateway read the call's record while it was still queued (no run, no client); the
    # agent's first progress and log came in the same drain as the wake-up of its sending.
    session = Session()
    reads: list[TaskRecord] = []

    async def reread() -> TaskRecord:
        reads.append(REC)
        return REC

    relay = CallEvents(SimpleNamespace(session=session, request_id=7), Redis(), "call", None, reread)  # type: ignore[arg-type]
    relay.current = REC.model_copy(update={"state": TaskState.PENDING, "run_id": None, "client_id": None})
    handle(relay, progress(0, 1.0), log("info", "i"), progress(50, 1.1))
    assert session.progress == [(0, 100, None), (50, 100, None)]
    assert session.logs == [("info", "i")]
    assert len(reads) == 1  # once: the record read again matched every later event


def test_an_event_of_an_older_run_or_another_task_is_still_dropped() -> None:
    session = Session()
    reads: list[TaskRecord] = []

    async def reread() -> TaskRecord:
        reads.append(REC)
        return REC

    relay = CallEvents(SimpleNamespace(session=session, request_id=7), Redis(), "call", None, reread)  # type: ignore[arg-type]
    relay.current = REC
    other = ToolProgress(
        run_id="r1", tree_id="g", task_id="other", progress=1, total=100, at=1.0, client_id="laptop"
    )
    handle(relay, progress(7, 1.0, "r0"), ProgressEvent(progress=other).model_dump_json().encode())
    assert session.progress == []
    assert len(reads) == 1  # the older run's event read it once; another task's, never
