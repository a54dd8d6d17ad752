"""The server path end to end: trees -> Celery jobs on a real Redis -> real workers -> brain.

Each test starts its own embedded stack (redis-server from the wheel, the brain
worker, a prefork server pool) and real MCP servers (mcp-server-time from PyPI and
a demo MCPServer over stdio).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from brain.core.models import TaskState, TreeStatus
from tests.conftest import (
    EXAMPLES,
    FIXTURES,
    ROOT,
    demo_server,
    server_runs_started,
    tree,
    wait_for_tree,
    wait_until,
    waiting_on,
    write_mcp_config,
)
from workers.contracts import KOMBU_UNACKED, SERVER_QUEUE, ToolCall, ToolType, queue_keys

pytestmark = pytest.mark.integration


def test_readme_first_command_runs_the_night_batch_on_the_embedded_stack(tmp_path: Path) -> None:
    env = {**os.environ, "VANCETOPE_DATA_DIR": str(tmp_path / "data"), "COLUMNS": "200"}
    proc = subprocess.run(  # noqa: PLW1510 - the exit code is asserted below, with the output
        [sys.executable, "-m", "brain", "run", str(EXAMPLES / "night-batch.yaml")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for task in ("utc_now", "tokyo", "new_york", "offices", "headline", "shout"):
        assert task in proc.stdout
    assert "BRIEF OF" in proc.stdout  # the last task's result, built from upstream results
    assert "failed" not in proc.stdout


@pytest.mark.parametrize("task_log", [False, True])
def test_the_pool_logs_a_line_per_task_only_when_task_log_is_on(
    stack_factory, brain_factory, task_log
) -> None:
    stack = stack_factory(task_log=task_log)
    brain = brain_factory(stack)
    rec = brain.scheduler.submit(
        tree({"id": "quiet", "tasks": [{"id": "say", "tool": "echo", "args": {"value": 1}}]})
    )
    assert wait_for_tree(brain, rec.tree_id).status is TreeStatus.DONE
    run_id = brain.store.get_task(rec.tree_id, "say").run_id
    # The result is recorded inside the task; Celery logs its line after the task returns and
    # before the main process acks the message: once nothing is unacked, the log is complete.
    wait_until(lambda: brain.hot.r.hlen(KOMBU_UNACKED) == 0, what="the pool acked the message")
    log = (stack.settings.data_dir / "logs" / "server-pool.log").read_text()
    assert "ready" in log  # the pool did log (it started)
    assert (f"run_tool[{run_id}] received" in log) is task_log
    assert (f"run_tool[{run_id}] succeeded in" in log) is task_log


def test_results_flow_between_tasks_through_a_real_third_party_mcp_server(
    stack_factory, brain_factory
) -> None:
    stack = stack_factory()
    brain = brain_factory(stack)
    rec = brain.scheduler.submit(
        tree(
            {
                "id": "flow",
                "tasks": [
                    {"id": "now", "tool": "get_current_time", "args": {"timezone": "Europe/Berlin"}},
                    {
                        "id": "tz",
                        "tool": "text_transform",
                        "depends_on": ["now"],
                        "args": {"op": "upper", "text": "${tasks.now.result.timezone}"},
                    },
                    {"id": "sum", "tool": "add", "args": {"a": 2, "b": 40}},
                ],
            }
        )
    )
    assert wait_for_tree(brain, rec.tree_id).status is TreeStatus.DONE
    tasks = {t.task_id: t for t in brain.store.get_tasks(rec.tree_id)}
    assert tasks["tz"].result == "EUROPE/BERLIN"
    assert tasks["sum"].result == 42
    assert all(t.attempt == 1 and t.route == "server" for t in tasks.values())


def test_bad_tools_fail_their_task_with_the_tool_message_and_the_rest_still_runs(
    tmp_path: Path, stack_factory, brain_factory
) -> None:
    mcp = write_mcp_config(
        tmp_path / "mcp.json",
        {
            "demo": demo_server(),
            "broken": {"command": sys.executable, "args": [str(FIXTURES / "mcp_crash_server.py")]},
        },
    )
    registry = tmp_path / "registry.yaml"
    registry.write_text(
        "tools:\n"
        "  - {name: jira_create_issue, location: server, mcp_server: broken}\n"
        "  - {name: slow, location: server, mcp_server: demo, timeout_s: 1}\n"
    )
    stack = stack_factory(mcp_config=mcp, registry=registry, max_result_bytes=10_000)
    brain = brain_factory(stack)
    rec = brain.scheduler.submit(
        tree(
            {
                "id": "bad",
                "tasks": [
                    {"id": "raises", "tool": "fail", "args": {"msg": "quota exceeded for project X"}},
                    {"id": "hangs", "tool": "slow", "args": {"seconds": 30}},
                    {"id": "huge", "tool": "big", "args": {"n": 50_000}},
                    {"id": "unknown", "tool": "no_such_tool"},
                    {"id": "server_down", "tool": "jira_create_issue", "args": {"summary": "x"}},
                    {"id": "fine", "tool": "add", "args": {"a": 1, "b": 1}},
                    {"id": "after_fail", "tool": "echo", "depends_on": ["raises"], "args": {"value": 1}},
                ],
            }
        )
    )
    assert wait_for_tree(brain, rec.tree_id).status is TreeStatus.FAILED
    t = {x.task_id: x for x in brain.store.get_tasks(rec.tree_id)}
    assert t["fine"].state is TaskState.DONE and t["fine"].result == 2
    assert t["raises"].state is TaskState.FAILED
    assert "quota exceeded for project X" in t["raises"].error.message
    assert t["hangs"].state is TaskState.FAILED
    assert t["hangs"].error.type == "ToolTimeout"
    assert "did not answer within 1s" in t["hangs"].error.message
    assert t["huge"].error.type == "ResultTooLarge"
    assert "over the cap of 10000 bytes" in t["huge"].error.message
    assert t["unknown"].error.message.startswith("task 'unknown': Tool unknown: no_such_tool")
    assert "'broken'" in t["unknown"].error.message  # names the MCP server that failed to start
    assert t["server_down"].error.type == "MCPServerUnavailable"
    assert "demo crash: missing API token" in t["server_down"].error.message
    assert t["after_fail"].state is TaskState.SKIPPED
    assert t["after_fail"].reason == "upstream task 'raises' failed"
    assert all(x.attempt <= 1 for x in t.values())


def test_a_job_delivered_twice_completes_its_task_and_advances_the_tree_once(
    stack_factory, brain_factory
) -> None:
    stack = stack_factory(services=("brain",))  # no pool yet: both copies wait in the queue
    brain = brain_factory(stack)
    rec = brain.scheduler.submit(
        tree(
            {
                "id": "twice",
                "tasks": [
                    {"id": "a", "tool": "echo", "args": {"value": "x"}},
                    {"id": "b", "tool": "echo", "depends_on": ["a"], "args": {"value": "${tasks.a.result}"}},
                ],
            }
        )
    )
    a = brain.store.get_task(rec.tree_id, "a")
    call = ToolCall(
        run_id=a.run_id,
        tree_id=rec.tree_id,
        task_id="a",
        tool="echo",
        tool_type=ToolType.BUILT_IN,
        args={"value": "x"},
        timeout_s=10,
        max_result_bytes=1000,
    )
    brain.scheduler.publisher.send(call)  # the duplicate
    assert waiting_on(brain.hot.r, SERVER_QUEUE) == 2
    stack.start_service("server-pool")
    assert wait_for_tree(brain, rec.tree_id).status is TreeStatus.DONE
    t = {x.task_id: x for x in brain.store.get_tasks(rec.tree_id)}
    assert (t["a"].attempt, t["b"].attempt) == (1, 1)  # b was dispatched once
    assert t["b"].result == "x"
    # The second copy was taken too: either it began while the first ran (its result then
    # ignored by the compare-and-set), or it found the run recorded and never started.
    wait_until(
        lambda: waiting_on(brain.hot.r, SERVER_QUEUE) == 0 and brain.hot.r.hlen(KOMBU_UNACKED) == 0,
        what="both copies taken and acked",
    )
    assert brain.store.get_task(rec.tree_id, "a").deliveries in (1, 2)
    from workers.contracts import ToolResult

    late = ToolResult(
        run_id=a.run_id,
        tree_id=rec.tree_id,
        task_id="a",
        tool="echo",
        ok=True,
        value="late",
        started_at=time.time(),
        finished_at=time.time(),
    )
    assert brain.intake.on_result(late) is False
    assert brain.store.get_task(rec.tree_id, "a").result == "x"


def test_reconciler_resends_a_task_deleted_from_redis_behind_the_brains_back(
    stack_factory, brain_factory
) -> None:
    stack = stack_factory(services=("brain",))
    brain = brain_factory(stack)
    rec = brain.scheduler.submit(
        tree(
            {
                "id": "lost",
                "tasks": [
                    {"id": "a", "tool": "echo", "args": {"value": 1}},
                    {"id": "b", "tool": "echo", "depends_on": ["a"], "args": {"value": 2}},
                ],
            }
        )
    )
    first_run = brain.store.get_task(rec.tree_id, "a").run_id
    assert (
        brain.hot.r.delete(*queue_keys(SERVER_QUEUE)) == 1
    )  # the message is gone; the store still says queued
    stack.start_service("server-pool")
    assert wait_for_tree(brain, rec.tree_id).status is TreeStatus.DONE
    a = brain.store.get_task(rec.tree_id, "a")
    assert a.attempt == 2 and a.run_id != first_run
    assert brain.store.get_task(rec.tree_id, "b").attempt == 1


def test_reconciler_resends_a_running_task_whose_message_nothing_holds_as_queued(
    stack_factory, brain_factory
) -> None:
    stack = stack_factory(services=("brain",))  # no pool yet: only the test begins the run
    brain = brain_factory(stack)
    rec = brain.scheduler.submit(
        tree({"id": "gone", "tasks": [{"id": "a", "tool": "echo", "args": {"value": 1}}]})
    )
    first = brain.store.get_task(rec.tree_id, "a")
    # A worker began the run a while ago, then vanished with its message (acked, lost): the
    # record says running, and no queue or unacked hash holds the run.
    assert brain.store.begin_run(rec.tree_id, "a", first.run_id, "server@gone", time.time() - 60) == 1
    assert brain.store.get_task(rec.tree_id, "a").state is TaskState.RUNNING
    assert brain.hot.r.delete(*queue_keys(SERVER_QUEUE)) == 1
    resent = wait_until(
        lambda: (t := brain.store.get_task(rec.tree_id, "a")).run_id != first.run_id and t,
        what="the reconciler to re-send the lost running run",
    )
    assert (resent.state, resent.attempt, resent.deliveries) == (TaskState.QUEUED_SERVER, 2, 0)
    assert brain.store.begin_run(rec.tree_id, "a", first.run_id, "server@late", time.time()) is None
    stack.start_service("server-pool")
    assert wait_for_tree(brain, rec.tree_id).status is TreeStatus.DONE
    a = brain.store.get_task(rec.tree_id, "a")
    assert (a.run_id, a.deliveries, a.result) == (resent.run_id, 1, 1) and a.worker != "server@gone"


def test_a_worker_killed_mid_task_has_its_task_redelivered_and_recorded_once(
    tmp_path: Path, stack_factory, brain_factory
) -> None:
    stack = stack_factory(server_concurrency=1)
    brain = brain_factory(stack)
    rec = brain.scheduler.submit(
        tree(
            {
                "id": "killed",
                "tasks": [{"id": "long", "tool": "sleep", "args": {"seconds": 3}}],
            }
        )
    )
    run_id = wait_until(lambda: server_runs_started(brain, rec.tree_id).get("long"), what="task start")
    pool = stack.service("server-pool").process
    children = subprocess.run(
        ["pgrep", "-P", str(pool.pid)], capture_output=True, text=True, check=True
    ).stdout.split()
    assert children, "the prefork pool has a child process"
    for pid in children:
        os.kill(int(pid), signal.SIGKILL)
    assert wait_for_tree(brain, rec.tree_id, timeout=120).status is TreeStatus.DONE
    task = brain.store.get_task(rec.tree_id, "long")
    assert task.run_id == run_id and task.attempt == 1  # same run, delivered again, recorded once
    assert task.deliveries == 2
