"""A client agent's memory of its calls: a task re-sent after its result was lost is answered
from the run that did it, never run twice; a failure is never reused (workers.recent_calls)."""

from __future__ import annotations

import threading
from typing import Any

from workers.contracts import ErrorInfo, ToolCall, ToolResult, ToolType
from workers.recent_calls import RecentCalls


def call(run: str, task: str = "t", tree: str = "tree", **args: Any) -> ToolCall:
    return ToolCall(
        run_id=run,
        tree_id=tree,
        task_id=task,
        tool="ledger.work",
        tool_type=ToolType.MCP,
        mcp_server="ledger",
        args=args or {"seconds": 5},
        timeout_s=30,
        max_result_bytes=1 << 20,
        client_id="laptop",
    )


def result(c: ToolCall, ok: bool = True, value: Any = "done") -> ToolResult:
    error = None if ok else ErrorInfo(type="ToolError", message="boom")
    return ToolResult(
        run_id=c.run_id,
        tree_id=c.tree_id,
        task_id=c.task_id,
        tool=c.tool,
        ok=ok,
        value=value if ok else None,
        error=error,
        started_at=1.0,
        finished_at=2.0,
        client_id="laptop",
    )


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_task_re_sent_as_a_new_run_is_answered_with_the_first_runs_result_relabelled() -> None:
    clock = Clock()
    recent = RecentCalls(clock=clock)
    first = call("run-1")
    assert recent.begin(first, wait_s=1) is None
    recent.end(first, result(first, value="42"))
    clock.now = 90.0
    reused = recent.begin(call("run-2"), wait_s=1)
    assert reused is not None
    assert (reused.first_run_id, reused.age_s) == ("run-1", 90.0)
    assert (reused.result.run_id, reused.result.value) == ("run-2", "42")
    # the same run delivered again is answered the same way
    again = recent.begin(call("run-1"), wait_s=1)
    assert again is not None and again.result.run_id == "run-1"


def test_a_failure_is_never_reused_the_retry_runs_the_tool() -> None:
    recent = RecentCalls()
    first = call("run-1")
    recent.begin(first, wait_s=1)
    recent.end(first, result(first, ok=False))
    second = call("run-2")
    assert recent.begin(second, wait_s=1) is None  # runs, and owns the key now
    recent.end(second, result(second))
    assert recent.begin(call("run-3"), wait_s=1) is not None


def test_a_call_that_raised_is_not_reused() -> None:
    recent = RecentCalls()
    first = call("run-1")
    recent.begin(first, wait_s=1)
    recent.end(first, None)
    assert recent.begin(call("run-2"), wait_s=1) is None


def test_other_arguments_another_task_or_another_tree_is_another_call() -> None:
    recent = RecentCalls()
    first = call("run-1")
    recent.begin(first, wait_s=1)
    recent.end(first, result(first))
    assert recent.begin(call("run-2", seconds=6), wait_s=1) is None
    assert recent.begin(call("run-3", task="u"), wait_s=1) is None
    assert recent.begin(call("run-4", tree="other"), wait_s=1) is None


def test_a_re_sent_run_waits_for_the_run_still_executing_it_and_shares_its_result() -> None:
    recent = RecentCalls()
    first = call("run-1")
    assert recent.begin(first, wait_s=1) is None
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(recent.begin(call("run-2"), wait_s=30)))
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive()  # waiting for run-1, not running the tool beside it
    recent.end(first, result(first, value="once"))
    waiter.join(60)
    assert got and got[0] is not None and got[0].result.value == "once"


def test_a_re_sent_run_goes_ahead_when_the_running_one_fails_or_outlasts_the_wait() -> None:
    recent = RecentCalls()
    first = call("run-1")
    recent.begin(first, wait_s=1)
    assert recent.begin(call("run-2"), wait_s=0.05) is None  # still running after the wait
    recent.end(first, result(first))  # the late first run no longer owns the key: not kept
    assert recent.begin(call("run-3"), wait_s=0.05) is None


def test_results_are_forgotten_after_keep_s_and_the_oldest_first_over_max_bytes() -> None:
    clock = Clock()
    recent = RecentCalls(keep_s=100, clock=clock)
    first = call("run-1")
    recent.begin(first, wait_s=1)
    recent.end(first, result(first))
    clock.now = 101.0
    assert recent.begin(call("run-2"), wait_s=1) is None
    assert len(recent) == 1  # only the new run's entry

    small = RecentCalls(max_bytes=1200)
    for i in range(3):
        c = call(f"r{i}", task=f"t{i}")
        small.begin(c, wait_s=1)
        small.end(c, result(c, value="x" * 300))
    assert small.begin(call("again-0", task="t0"), wait_s=1) is None  # the oldest went first
    assert small.begin(call("again-2", task="t2"), wait_s=1) is not None
