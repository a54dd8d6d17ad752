"""Retries end to end (issue 23, item 1): a real stack (redis-server, brain, prefork server
pool) calls a real stdio MCP server that fails its first calls on purpose
(tests/fixtures/mcp_flaky_server.py). The waits are checked against the times the record
keeps, never against a wall clock."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from brain.core.models import TaskState, TreeStatus
from brain.runtime.service import Brain
from brain.stack.embedded import EmbeddedStack
from tests.conftest import FIXTURES, tree, wait_for_tree, wait_until, write_mcp_config
from tests.integration.test_crash_recovery import kill

pytestmark = pytest.mark.integration


def flaky_stack(
    tmp_path: Path, stack_factory: Callable[..., EmbeddedStack], fails: int, mode: str
) -> EmbeddedStack:
    server = {
        "command": sys.executable,
        "args": [str(FIXTURES / "mcp_flaky_server.py"), str(tmp_path / "calls"), str(fails), mode],
    }
    return stack_factory(mcp_config=write_mcp_config(tmp_path / "server-mcp.json", {"flaky": server}))


def flaky_tree(retry: dict[str, Any], tree_id: str = "night") -> Any:
    return tree(
        {
            "id": tree_id,
            "tasks": [
                {"id": "fetch", "tool": "flaky", "args": {"label": "fetched"}, "retry": retry},
                {
                    "id": "after",
                    "tool": "echo",
                    "args": {"value": "${tasks.fetch.result}"},
                    "depends_on": ["fetch"],
                },
            ],
        }
    )


def test_a_flaky_server_tool_ends_done_at_its_third_attempt_after_the_backoff_waits(
    tmp_path: Path,
    stack_factory: Callable[..., EmbeddedStack],
    brain_factory: Callable[[EmbeddedStack], Brain],
) -> None:
    brain = brain_factory(flaky_stack(tmp_path, stack_factory, fails=2, mode="error"))
    retry = {"max_attempts": 3, "backoff_s": 1, "backoff_factor": 2, "jitter": False, "on": ["tool_error"]}
    rec = brain.scheduler.submit(flaky_tree(retry))
    assert wait_for_tree(brain, rec.tree_id, timeout=120).status is TreeStatus.DONE
    fetch = brain.store.get_task(rec.tree_id, "fetch")
    assert fetch.result == "fetched at call 3" and fetch.attempt == 3
    assert [a.number for a in fetch.attempts] == [1, 2]
    assert all(a.error and a.error.type == "ToolFailed" for a in fetch.attempts)
    # Each wait: at least the backoff after the attempt failed, and the next attempt began
    # no sooner than it was due (1 s, then 2 s).
    starts = [a.started_at for a in fetch.attempts[1:]] + [fetch.started_at]
    for attempt, wait, next_start in zip(fetch.attempts, (1, 2), starts, strict=True):
        assert attempt.next_at is not None and attempt.finished_at is not None
        assert attempt.next_at - attempt.finished_at >= wait
        assert next_start is not None and next_start >= attempt.next_at
    assert brain.store.get_task(rec.tree_id, "after").result == "fetched at call 3"


def test_a_tool_error_under_on_unavailable_fails_at_the_first_attempt(
    tmp_path: Path,
    stack_factory: Callable[..., EmbeddedStack],
    brain_factory: Callable[[EmbeddedStack], Brain],
) -> None:
    brain = brain_factory(flaky_stack(tmp_path, stack_factory, fails=1, mode="error"))
    rec = brain.scheduler.submit(flaky_tree({"max_attempts": 3, "backoff_s": 0, "on": ["unavailable"]}))
    assert wait_for_tree(brain, rec.tree_id, timeout=120).status is TreeStatus.FAILED
    fetch = brain.store.get_task(rec.tree_id, "fetch")
    assert fetch.state is TaskState.FAILED and fetch.attempts == [] and fetch.attempt == 1
    assert "call 1 fails on purpose" in fetch.error.message
    assert brain.store.get_task(rec.tree_id, "after").state is TaskState.SKIPPED


def test_a_server_that_dies_mid_call_is_unavailable_and_retried_by_default_kinds(
    tmp_path: Path,
    stack_factory: Callable[..., EmbeddedStack],
    brain_factory: Callable[[EmbeddedStack], Brain],
) -> None:
    brain = brain_factory(flaky_stack(tmp_path, stack_factory, fails=1, mode="exit"))
    rec = brain.scheduler.submit(
        flaky_tree({"max_attempts": 2, "backoff_s": 0.5})
    )  # on: unavailable, timeout
    assert wait_for_tree(brain, rec.tree_id, timeout=120).status is TreeStatus.DONE
    fetch = brain.store.get_task(rec.tree_id, "fetch")
    assert [a.error.type for a in fetch.attempts if a.error] == ["MCPServerUnavailable"]
    assert fetch.result == "fetched at call 2"


def test_a_pool_and_a_brain_killed_during_the_wait_do_not_lose_the_retry(
    tmp_path: Path,
    stack_factory: Callable[..., EmbeddedStack],
    brain_factory: Callable[[EmbeddedStack], Brain],
) -> None:
    stack = flaky_stack(tmp_path, stack_factory, fails=1, mode="error")
    brain = brain_factory(stack)
    retry = {"max_attempts": 2, "backoff_s": 8, "jitter": False, "on": ["tool_error"]}
    rec = brain.scheduler.submit(flaky_tree(retry))

    def state() -> TaskState:
        return brain.store.get_task(rec.tree_id, "fetch").state

    wait_until(lambda: state() is TaskState.RETRYING, 120, "the first attempt to fail")
    # The wait holds no worker: both die and come back while it runs, and the timer (in
    # Redis, the record in the store) is still there for the brain that starts afterwards.
    kill(stack, "server-pool")
    kill(stack, "brain")
    assert state() is TaskState.RETRYING
    stack.start_service("brain")
    stack.start_service("server-pool")
    assert wait_for_tree(brain, rec.tree_id, timeout=120).status is TreeStatus.DONE
    fetch = brain.store.get_task(rec.tree_id, "fetch")
    assert fetch.result == "fetched at call 2" and len(fetch.attempts) == 1


def test_the_bad_night_example_fans_out_notifies_cleans_up_and_ends_failed_through_vancetope_run(
    tmp_path: Path,
) -> None:
    """examples/bad-night.yaml as a user runs it: `vancetope run --json` on the embedded stack."""
    import json
    import os
    import subprocess

    from tests.conftest import EXAMPLES, ROOT

    proc = subprocess.run(  # noqa: PLW1510 - asserted below, with the output
        [sys.executable, "-m", "brain", "run", str(EXAMPLES / "bad-night.yaml"), "--json"],
        cwd=ROOT,
        env={**os.environ, "VANCETOPE_DATA_DIR": str(tmp_path / "data")},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr  # a failed task is a failed night
    report = json.loads(proc.stdout)
    tasks = {t["task_id"]: t for t in report["tasks"]}
    assert report["status"] == "failed"
    assert {k: t["state"] for k, t in tasks.items()} == {
        "utc_now": "done",
        "offices": "done",
        "local_times": "done",
        **{f"local_times[{i}]": "done" for i in range(3)},
        "missing_notes": "failed",
        "headline": "skipped",
        "notify": "done",
        "cleanup": "done",
    }
    assert tasks["notify"]["result"].startswith("night failed: notes failed (read_local_file: ")
    assert tasks["cleanup"]["result"].startswith("cleaned up after a headline that ended skipped; 09:00 UTC")
    zones = [t["target"]["timezone"] for t in tasks["local_times"]["result"]]
    assert zones == ["Asia/Tokyo", "America/New_York", "Europe/Paris"]  # in the list's order
    assert report["summary"]["fan_outs"] == [
        {
            "task_id": "local_times",
            "tool": "convert_time",
            "state": "done",
            "items": 3,
            "done": 3,
            "failed": 0,
        }
    ]
    assert tasks["missing_notes"]["attempts"] == []  # a tool error: not covered by the policy
