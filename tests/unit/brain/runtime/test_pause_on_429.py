"""A 429 with Retry-After pauses its server's budget (brain.runtime.intake) only when the store
accepted the result that carried it: the task's current run, from where it was sent. A stale
or forged result must not stop a server's calls for every user. A real scheduler and intake on
SQLite and a real redis-server (the gate's pause is its Lua script); Celery is a recorder."""

from __future__ import annotations

from brain.core.models import TaskState
from brain.hot.gate import Gate
from brain.runtime.intake import Intake
from tests.unit.brain.runtime.rig import Rig, echo, tree
from workers.contracts import ErrorInfo, ToolCall, ToolResult

THREE = {"max_attempts": 3, "backoff_s": 1, "jitter": False}


def too_many(call: ToolCall, *, run_id: str | None = None, server: str = "jira") -> ToolResult:
    """A server run that its remote answered 429, Retry-After 30 s (as workers.mcp_clients says)."""
    data = {"status": 429, "retry_after_s": 30.0, "server": server}
    return ToolResult(
        run_id=run_id or call.run_id, tree_id=call.tree_id, task_id=call.task_id, tool=call.tool,
        ok=False, error=ErrorInfo(type="ToolFailed", message="HTTP 429", data=data),
        started_at=1.0, finished_at=2.0,
    )  # fmt: skip


def stale_run(call: ToolCall) -> str:
    return call.run_id[:-1] + ("0" if call.run_id[-1] != "0" else "1")


def test_a_stale_429_pauses_nothing_and_the_current_runs_429_pauses_its_server(rig: Rig) -> None:
    intake = Intake(rig.scheduler)
    rec = rig.scheduler.submit(tree(echo("a")))
    call = rig.sent.of("a")[-1]
    gate = Gate(rig.r)

    assert not intake.on_result(too_many(call, run_id=stale_run(call)))
    assert gate.pauses() == {}  # not this task's run: ignored, and pauses nothing
    assert rig.task(rec.tree_id, "a").state is TaskState.QUEUED_SERVER

    assert intake.on_result(too_many(call))
    assert rig.task(rec.tree_id, "a").state is TaskState.FAILED
    assert set(gate.pauses()) == {"server:jira"}


def test_a_429_of_a_run_recorded_already_pauses_nothing_more(rig: Rig) -> None:
    intake = Intake(rig.scheduler)
    rig.scheduler.submit(tree(echo("a")))
    call = rig.sent.of("a")[-1]
    assert intake.on_result(too_many(call, server="jira"))
    # Re-delivered (or forged with the right run id) after it was recorded: the store refuses it.
    assert not intake.on_result(too_many(call, server="gmail"))
    assert set(Gate(rig.r).pauses()) == {"server:jira"}


def test_a_429_routed_to_a_client_pauses_no_server_budget(rig: Rig) -> None:
    intake = Intake(rig.scheduler)
    rig.scheduler.submit(tree(echo("a")))
    call = rig.sent.of("a")[-1]
    forged = too_many(call).model_copy(update={"client_id": "mallory"})
    assert not intake.on_result(forged, from_client="mallory")  # a server run: not mallory's
    assert Gate(rig.r).pauses() == {}


def test_a_retried_429_pauses_only_for_its_current_run(rig: Rig) -> None:
    intake = Intake(rig.scheduler)
    rec = rig.scheduler.submit(tree(echo("a", retry=THREE)))
    call = rig.sent.of("a")[-1]
    gate = Gate(rig.r)

    assert intake.take(too_many(call, run_id=stale_run(call))) is None
    assert gate.pauses() == {}

    assert intake.take(too_many(call)) is TaskState.RETRYING
    assert rig.task(rec.tree_id, "a").state is TaskState.RETRYING
    assert set(gate.pauses()) == {"server:jira"}
