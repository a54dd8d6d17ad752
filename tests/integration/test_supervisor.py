"""`vancetope up` heals crashes (issue 8): real `up`, real services, real SIGKILLs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from brain.core.transitions import QUEUED
from brain.stack.redis_server import free_port
from tests.conftest import EXAMPLES, ROOT, wait_until
from tests.integration.test_cli import vancetope

pytestmark = pytest.mark.integration


def stack_state(data: Path) -> dict[str, Any]:
    try:
        return dict(json.loads((data / "stack.json").read_text()))
    except (OSError, ValueError):
        return {}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@contextmanager
def running_up(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """`vancetope up` from the checkout (its vancetope.toml: registry, MCP servers, agent)."""
    data = tmp_path / "data"
    with open(tmp_path / "up.log", "w") as up_log:
        up = subprocess.Popen(
            [sys.executable, "-m", "brain", "up", *args],
            cwd=ROOT,
            env={**os.environ, "VANCETOPE_DATA_DIR": str(data), "COLUMNS": "250", **(env or {})},
            stdout=up_log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield up
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGINT)
            up.wait(120)


def wait_for_the_pool_to_take(tmp_path: Path, task_id: str, what: str) -> None:
    """Until the newest tree's ``task_id`` is queued with a run id the server pool's log names
    (the stack runs with task_log on): the pool has taken it."""
    from brain.store import open_store
    from tests.conftest import make_settings

    data = tmp_path / "data"
    store = open_store(make_settings(tmp_path, data_dir=data).store)
    try:

        def taken() -> bool:
            trees = store.list_trees(limit=1)
            task = store.get_task(trees[0].tree_id, task_id) if trees else None
            pool_log = (data / "logs" / "server-pool.log").read_text(errors="replace")
            return (
                task is not None
                and task.state in QUEUED
                and task.run_id is not None
                and task.run_id in pool_log
            )

        wait_until(taken, timeout=120, what=what)
    finally:
        store.close()


def up_log(tmp_path: Path) -> str:
    return " ".join((tmp_path / "up.log").read_text().split())


def test_up_restarts_every_service_killed_with_sigkill_and_a_tree_still_runs(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with running_up(tmp_path, "--flower-port", str(free_port()), "--gateway-port", str(free_port())) as up:
        names = {"brain", "server-pool", "client-agent", "flower", "gateway", "web"}
        wait_until(
            lambda: set(stack_state(data).get("services", {})) == names,
            timeout=120,
            what="`vancetope up` to write stack.json with every service",
        )
        before = stack_state(data)["services"]
        for pid in before.values():
            os.kill(pid, signal.SIGKILL)

        def all_restarted() -> bool:
            now = stack_state(data).get("services", {})
            return all(now.get(name) not in (None, pid) and alive(now[name]) for name, pid in before.items())

        wait_until(all_restarted, timeout=120, what="every killed service to be running again with a new pid")
        run = vancetope(
            "run", str(EXAMPLES / "offline-client.yaml"), "--client", "laptop", "--timeout", "90", data=data
        )
        assert run.returncode == 0, run.stdout + run.stderr + up_log(tmp_path)
        assert up.poll() is None, up_log(tmp_path)
    log = up_log(tmp_path)
    for name in before:
        assert f"{name} exited with code -9; restarting it in 1s" in log, log
        assert f"{name} restarted (pid" in log
    assert up.returncode == 0, log


def test_a_run_under_way_finishes_when_up_restarts_a_killed_redis_server(tmp_path: Path) -> None:

    data = tmp_path / "data"
    tree = tmp_path / "slow.yaml"
    tree.write_text(
        "id: slow\ntasks:\n  - {id: nap, tool: sleep, args: {seconds: 3}}\n"
        "  - {id: after, tool: echo, args: {value: 1}, depends_on: [nap]}\n"
    )
    # task_log: the pool logs the run id it takes, which says when to kill redis-server.
    with running_up(tmp_path, "--no-agent", env={"VANCETOPE_TASK_LOG": "true"}) as up:
        wait_until(lambda: stack_state(data), timeout=120, what="`vancetope up` to write stack.json")
        redis_pid = stack_state(data)["redis_pid"]
        run = subprocess.Popen(
            [sys.executable, "-m", "brain", "run", str(tree), "--timeout", "120"],
            cwd=ROOT,
            env={**os.environ, "VANCETOPE_DATA_DIR": str(data), "COLUMNS": "250"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            wait_for_the_pool_to_take(tmp_path, "nap", "the server pool to take the first task")
            os.kill(redis_pid, signal.SIGKILL)
            out, err = run.communicate(timeout=150)
        finally:
            if run.poll() is None:
                run.kill()
                run.wait(10)
        assert run.returncode == 0, out + err + up_log(tmp_path)
        assert "Traceback" not in out + err
        assert stack_state(data)["redis_pid"] != redis_pid
        assert up.poll() is None
    log = up_log(tmp_path)
    assert "redis-server exited with code -9; restarting it in 1s" in log, log
    assert "redis-server restarted (pid" in log


# A file that is not an mcpServers object at all (one broken entry is only skipped).
BAD_SERVER = '{"mcpServers": ["broken"]}'
REASON = '"mcpServers" must be an object mapping server names to settings'


def test_a_bad_mcp_config_is_refused_by_up_and_run_before_anything_starts_with_exit_2(tmp_path: Path) -> None:
    """A file the stack's brain could not start with is the caller's input: one line naming it,
    exit 2, and no stack started (it was a brain dying at start, exit 3 and its log: issue 24).
    A file broken while the stack runs is the next test's."""
    bad = tmp_path / "bad-mcp.json"
    bad.write_text(BAD_SERVER)
    env = {"VANCETOPE_MCP_CONFIG": str(bad)}
    up = vancetope("up", "--no-agent", data=tmp_path / "data", env=env, timeout=120)
    run = vancetope(
        "run", str(EXAMPLES / "night-batch.yaml"), "--no-agent", data=tmp_path / "data2", env=env, timeout=120
    )
    for proc, data in ((up, tmp_path / "data"), (run, tmp_path / "data2")):
        assert proc.returncode == 2, proc.stdout + proc.stderr
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        assert errors == [f"error: {bad}: {REASON}"], proc.stderr
        assert not (data / "redis").exists() and not (data / "stack.json").exists()


def test_up_gives_up_on_a_brain_that_keeps_failing_at_start_and_exits_3_with_the_reason(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    mcp = tmp_path / "server-mcp.json"
    mcp.write_text((EXAMPLES / "server-mcp.json").read_text())
    with running_up(tmp_path, "--no-agent", env={"VANCETOPE_MCP_CONFIG": str(mcp)}) as up:
        wait_until(lambda: stack_state(data), timeout=120, what="`vancetope up` to write stack.json")
        mcp.write_text(BAD_SERVER)  # broken while it runs: the next brain start fails
        os.kill(stack_state(data)["services"]["brain"], signal.SIGKILL)
        up.wait(180)  # three brain starts on a loaded CI box
    assert up.returncode == 3, up_log(tmp_path)
    log = up_log(tmp_path)
    assert "brain exited with code -9; restarting it in 1s" in log
    assert "brain exited with code 78; restarting it in 2s" in log
    assert "brain exited with code 78: failing at start 3 times in a row" in log, log
    assert REASON in log and "Stopping the stack" in log
    assert not (data / "stack.json").exists()


def running_program(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie may wait for a reaper that never comes)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def program_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "?"


def tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else "(no log)"


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")
def test_the_stacks_processes_do_not_outlive_an_up_that_is_killed_even_with_a_task_under_way(
    tmp_path: Path,
) -> None:
    """The kernel's SIGTERM starts each worker's warm shutdown, which would wait for the pool's
    ten-minute call (or, seen in CI, retry a Redis that died with the stack for ever): a worker
    whose stack is gone is killed after its grace (workers.orphans)."""

    data = tmp_path / "data"
    slow = tmp_path / "slow.yaml"
    slow.write_text("id: slow\ntasks:\n  - {id: nap, tool: sleep, args: {seconds: 600}}\n")
    flower = ("--flower-port", str(free_port()))  # every kind of service: Flower is no Celery worker
    with running_up(tmp_path, "--no-agent", *flower, env={"VANCETOPE_TASK_LOG": "true"}) as up:
        wait_until(
            lambda: {"brain", "server-pool", "flower"} <= set(stack_state(data).get("services", {})),
            timeout=120,
            what="the stack to be up, Flower too",
        )
        run = subprocess.Popen(
            [sys.executable, "-m", "brain", "run", str(slow), "--timeout", "900"],
            cwd=ROOT,
            env={**os.environ, "VANCETOPE_DATA_DIR": str(data), "COLUMNS": "250"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_for_the_pool_to_take(tmp_path, "nap", "the server pool to take the ten-minute task")
            state = stack_state(data)
            children = {"redis-server": state["redis_pid"], **state["services"]}
            assert all(running_program(pid) for pid in children.values())
            os.kill(up.pid, signal.SIGKILL)  # no handler runs: only the kernel can tell the children
            up.wait(10)
            deadline = time.monotonic() + 120
            while (
                alive := [n for n, pid in children.items() if running_program(pid)]
            ) and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            run.kill()
            run.wait(10)
    tails = "\n".join(
        f"--- {n} (pid {children[n]}): {program_of(children[n])}\n{tail(data / 'logs' / f'{n}.log')}"
        for n in alive
    )
    assert not alive, f"still running 60 s after their parent was killed: {alive}\n{tails}"
    pool_log = (data / "logs" / "server-pool.log").read_text(errors="replace")
    # Either the guard killed it after its grace, or (seen in CI) the warm shutdown ended the
    # call sooner and the worker died acking it on the Redis that went with the stack.
    assert "the stack that started this worker is gone" in pool_log or (
        "ConnectionError" in pool_log and "Connection refused" in pool_log
    ), tail(data / "logs" / "server-pool.log")
