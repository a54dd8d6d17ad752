"""Retries (issue 23): a failed attempt its policy covers waits in ``retrying`` with a timer in
Redis, and starts again as a new run when due. A real scheduler and intake on SQLite and a real
redis-server; Celery is a recorder of the calls sent; the clock is injected (no sleeps)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from brain.core.models import TaskState, TreeStatus
from brain.hot.retries import RETRY_AT_KEY, RetryTimers
from brain.runtime.intake import Intake
from brain.runtime.retries import start_due
from tests.unit.brain.runtime.rig import Rig, echo, local_read, tree
from workers.contracts import ErrorInfo, ToolCall, ToolResult

THREE = {"max_attempts": 3, "backoff_s": 10, "backoff_factor": 2, "jitter": False}


def failed(call: ToolCall, kind: str = "ToolTimeout", client_id: str | None = None) -> ToolResult:
    return ToolResult(
        run_id=call.run_id, tree_id=call.tree_id, task_id=call.task_id, tool=call.tool, ok=False,
        error=ErrorInfo(type=kind, message=f"{kind} on purpose"), started_at=1.0, finished_at=2.0,
        client_id=client_id,
    )  # fmt: skip


def succeeded(call: ToolCall, value: Any = "ok", client_id: str | None = None) -> ToolResult:
    return ToolResult(
        run_id=call.run_id, tree_id=call.tree_id, task_id=call.task_id, tool=call.tool, ok=True,
        value=value, started_at=1.0, finished_at=2.0, client_id=client_id,
    )  # fmt: skip


def test_a_covered_failure_waits_then_runs_again_as_a_new_run_and_a_late_result_is_refused(rig: Rig) -> None:
    intake = Intake(rig.scheduler)
    rec = rig.scheduler.submit(tree(echo("a", retry=THREE), echo("b", depends_on=["a"])))
    first = rig.sent.of("a")[-1]
    assert intake.take(failed(first)) is TaskState.RETRYING
    waiting = rig.task(rec.tree_id, "a")
    assert waiting.retry_at == rig.clock() + 10  # backoff_s, no jitter
    assert waiting.reason.startswith("attempt 1 of 3 failed (ToolTimeout); next attempt at ")
    assert [a.number for a in waiting.attempts] == [1] and waiting.attempts[0].error.type == "ToolTimeout"
    assert rig.r.zscore(RETRY_AT_KEY, f"{rec.tree_id}\x1fa") == waiting.retry_at
    assert rig.task(rec.tree_id, "b").state is TaskState.PENDING  # not skipped: a may still succeed

    rig.clock.advance(9)
    assert start_due(rig.scheduler) == 0 and len(rig.sent.of("a")) == 1  # not due yet
    rig.clock.advance(1)
    assert start_due(rig.scheduler) == 1
    second = rig.sent.of("a")[-1]
    assert second.run_id != first.run_id and ".2." in second.run_id
    again = rig.task(rec.tree_id, "a")
    assert again.state is TaskState.QUEUED_SERVER and again.error is None and again.retry_at is None

    assert not intake.on_result(succeeded(first, "late"))  # attempt 1's late result: refused
    assert intake.take(succeeded(second, "fine")) is TaskState.DONE
    done = rig.task(rec.tree_id, "a")
    assert done.result == "fine" and len(done.attempts) == 1
    assert intake.on_result(succeeded(rig.sent.of("b")[-1]))
    assert rig.store.get_tree(rec.tree_id).status is TreeStatus.DONE


def test_the_waits_follow_the_backoff_and_the_last_attempt_fails_the_task(rig: Rig) -> None:
    intake = Intake(rig.scheduler)
    rec = rig.scheduler.submit(tree(echo("a", retry=THREE), echo("b", depends_on=["a"])))
    waits = []
    for _ in range(2):
        failed_at = rig.clock()
        assert intake.take(failed(rig.sent.of("a")[-1])) is TaskState.RETRYING
        waits.append(rig.task(rec.tree_id, "a").retry_at - failed_at)
        rig.clock.advance(waits[-1])
        assert start_due(rig.scheduler) == 1
    assert waits == [10, 20]
    assert intake.take(failed(rig.sent.of("a")[-1])) is TaskState.FAILED
    last = rig.task(rec.tree_id, "a")
    assert [a.number for a in last.attempts] == [1, 2] and last.error.type == "ToolTimeout"
    assert rig.task(rec.tree_id, "b").state is TaskState.SKIPPED
    assert rig.store.get_tree(rec.tree_id).status is TreeStatus.FAILED


def test_a_failure_the_policy_does_not_cover_fails_at_once(rig: Rig) -> None:
    intake = Intake(rig.scheduler)
    only_unavailable = {**THREE, "on": ["unavailable"]}
    rec = rig.scheduler.submit(tree(echo("a", retry=only_unavailable), echo("c", retry=THREE)))
    assert intake.take(failed(rig.sent.of("a")[-1], "ToolFailed")) is TaskState.FAILED
    assert rig.task(rec.tree_id, "a").attempts == []
    # Arguments that do not fit, consent refused: never retried, whatever `on` says.
    assert intake.take(failed(rig.sent.of("c")[-1], "InvalidArguments")) is TaskState.FAILED


def test_the_policy_comes_from_the_task_else_the_tool_else_the_tree_else_the_setting(
    rigs: Callable[..., Rig],
) -> None:
    rig = rigs(retry={"max_attempts": 2, "backoff_s": 1, "jitter": False})
    intake = Intake(rig.scheduler)
    rec = rig.scheduler.submit(
        tree(echo("task", retry={"max_attempts": 1}), echo("tree"), retry={**THREE, "backoff_s": 7})
    )
    assert intake.take(failed(rig.sent.of("task")[-1])) is TaskState.FAILED  # the task's: no retries
    assert intake.take(failed(rig.sent.of("tree")[-1])) is TaskState.RETRYING
    assert rig.task(rec.tree_id, "tree").retry_at == rig.clock() + 7  # the tree's, over the setting's
    other = rig.scheduler.submit(tree(echo("setting")))
    assert intake.take(failed(rig.sent.of("setting")[-1])) is TaskState.RETRYING
    assert rig.task(other.tree_id, "setting").retry_at == rig.clock() + 1


def test_max_total_s_still_bounds_the_whole_task(rig: Rig) -> None:
    intake = Intake(rig.scheduler)
    rec = rig.scheduler.submit(tree(echo("a", retry=THREE, max_total_s=15)))
    assert intake.take(failed(rig.sent.of("a")[-1])) is TaskState.RETRYING  # next at +10 < 15
    rig.clock.advance(10)
    start_due(rig.scheduler)
    # The next wait (20 s) would start past max_total_s: failed now, not parked in vain.
    assert intake.take(failed(rig.sent.of("a")[-1])) is TaskState.FAILED
    assert rig.store.get_tree(rec.tree_id).status is TreeStatus.FAILED


def test_a_client_task_due_while_its_client_is_offline_follows_its_offline_strategy(rig: Rig) -> None:
    rig.presence.enroll("laptop", "demo")
    rig.connect("laptop")
    intake = Intake(rig.scheduler)
    rec = rig.scheduler.submit(tree(local_read("r", retry=THREE)), client_id="laptop")
    call = rig.sent.of("r")[-1]
    assert call.client_id == "laptop"
    assert (
        intake.take(failed(call, "MCPServerUnavailable", "laptop"), from_client="laptop")
        is TaskState.RETRYING
    )
    rig.clients.on_disconnected("laptop", "s1", "closed its lid")
    rig.clock.advance(10)
    assert start_due(rig.scheduler) == 1
    parked = rig.task(rec.tree_id, "r")
    assert parked.state in (TaskState.PENDING_CLIENT, TaskState.BLOCKED), parked
    assert len(parked.attempts) == 1


def test_a_cancelled_task_waiting_to_retry_never_starts_again(rig: Rig) -> None:
    intake = Intake(rig.scheduler)
    rec = rig.scheduler.submit(tree(echo("a", retry=THREE)))
    assert intake.take(failed(rig.sent.of("a")[-1])) is TaskState.RETRYING
    rig.sweeps.cancel(rec.tree_id)
    rig.clock.advance(10)
    assert start_due(rig.scheduler) == 0
    assert len(rig.sent.of("a")) == 1 and rig.task(rec.tree_id, "a").state is TaskState.SKIPPED


def test_a_timer_redis_lost_is_set_again_from_the_store(rig: Rig) -> None:
    intake = Intake(rig.scheduler)
    rec = rig.scheduler.submit(tree(echo("a", retry=THREE)))
    assert intake.take(failed(rig.sent.of("a")[-1])) is TaskState.RETRYING
    rig.r.delete(RETRY_AT_KEY)  # Redis restarted without its data
    rig.sweeps.run_once()
    assert RetryTimers(rig.r).next_due() == rig.task(rec.tree_id, "a").retry_at
    rig.clock.advance(10)
    assert start_due(rig.scheduler) == 1


def test_two_brains_polling_the_timers_start_a_due_attempt_once(rig: Rig) -> None:
    intake = Intake(rig.scheduler)
    rig.scheduler.submit(tree(echo("a", retry=THREE)))
    assert intake.take(failed(rig.sent.of("a")[-1])) is TaskState.RETRYING
    timers = RetryTimers(rig.r)
    rig.clock.advance(10)
    assert len(timers.take_due(rig.clock())) == 1
    assert timers.take_due(rig.clock()) == []  # the other brain finds it taken


def test_a_forged_timer_starts_nothing_the_store_does_not_say_is_retrying(rig: Rig) -> None:
    """The pool's credential may write the timers (it records failed attempts): what it could
    forge is a timer for a task that is queued, done or another tree's. None of them starts."""
    intake = Intake(rig.scheduler)
    rec = rig.scheduler.submit(tree(echo("queued"), echo("done")))
    assert intake.on_result(succeeded(rig.sent.of("done")[-1]))
    timers = RetryTimers(rig.r)
    for task_id in ("queued", "done", "nope"):
        timers.set(rec.tree_id, task_id, rig.clock() - 1)
    timers.set("no-such-tree", "a", rig.clock() - 1)
    sent = len(rig.sent.calls)
    assert start_due(rig.scheduler) == 0
    assert len(rig.sent.calls) == sent and timers.next_due() is None
    assert rig.task(rec.tree_id, "queued").state is TaskState.QUEUED_SERVER
