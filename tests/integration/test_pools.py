"""Named server pools on a real stack: a tool that names pool `gpu` waits on `server.gpu` while no
gpu worker runs (status says so, loudly), and runs there, only there, once `vancetope worker
--pool gpu` starts as its own process with the pool's Redis user."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from brain.core.models import TaskState, TreeStatus
from brain.runtime.service import Brain
from brain.stack.embedded import EmbeddedStack
from tests.conftest import tree, wait_for_tree, wait_until, waiting_on
from workers.contracts import pool_queue, queue_keys
from workers.pool_presence import live_pool_workers

pytestmark = pytest.mark.integration

GPU = [{"name": "gpu", "concurrency": 1}]


def gpu_registry(tmp_path: Path, *tools: str) -> Path:
    path = tmp_path / "registry.yaml"
    path.write_text(
        "tools:\n" + "".join(f"  - name: {t}\n    location: server\n    pool: gpu\n" for t in tools)
    )
    return path


def vancetope(*args: str, stack: EmbeddedStack, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The CLI as an operator runs it beside the stack (admin URL), from a directory without a
    vancetope.toml: it knows the pools only from the brain."""
    return subprocess.run(  # noqa: PLW1510 - callers assert on returncode
        [sys.executable, "-m", "brain", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={
            **os.environ,
            "VANCETOPE_DATA_DIR": str(stack.settings.data_dir),
            "VANCETOPE_REDIS_URL": stack.redis_url,
            "COLUMNS": "250",
        },
    )


@pytest.fixture
def gpu_worker(
    pool_processes: Callable[[EmbeddedStack, list[str], str], subprocess.Popen[bytes]],
) -> Callable[[EmbeddedStack], subprocess.Popen[bytes]]:
    """`vancetope worker --pool gpu` as its own process, connected as the pool's ACL user."""
    return lambda stack: pool_processes(
        stack, [sys.executable, "-m", "brain", "worker", "--pool", "gpu"], "gpu-worker"
    )


def test_a_gpu_tool_waits_with_status_saying_nobody_consumes_then_runs_only_on_the_gpu_worker(
    tmp_path: Path,
    stack_factory: Callable[..., EmbeddedStack],
    brain_factory: Callable[[EmbeddedStack], Brain],
    gpu_worker: Callable[[EmbeddedStack], subprocess.Popen[bytes]],
) -> None:
    stack = stack_factory(
        services=("brain", "server-pool"), registry=gpu_registry(tmp_path, "echo"), pools=GPU
    )
    brain = brain_factory(stack)
    rec = brain.scheduler.submit(
        tree(
            {
                "id": "pools",
                "tasks": [
                    {"id": "on_gpu", "tool": "echo", "args": {"value": "hi"}},
                    {
                        "id": "after",
                        "tool": "echo",
                        "args": {"value": "${tasks.on_gpu.result}"},
                        "depends_on": ["on_gpu"],
                    },
                    {"id": "plain", "tool": "sleep", "args": {"seconds": 0}},
                ],
            }
        )
    )

    # The default pool runs its work; the gpu call waits on its own queue.
    def plain_done() -> bool:
        plain = brain.store.get_task(rec.tree_id, "plain")
        return plain is not None and plain.state is TaskState.DONE

    wait_until(plain_done, 120, "plain done")
    gpu = brain.store.get_task(rec.tree_id, "on_gpu")
    assert gpu is not None
    assert (gpu.state, gpu.route, gpu.pool) == (TaskState.QUEUED_SERVER, "server:gpu", "gpu")
    assert waiting_on(brain.hot.r, pool_queue("gpu")) == 1
    # Waiting on a queue is not lost: the reconciler leaves it alone.
    wait_until(
        lambda: time.time() - gpu.updated_at > stack.settings.reconcile_grace_s, 120, "the grace to pass"
    )
    assert brain.sweeps.resend_lost() == []

    status = vancetope("status", "--queues", "--json", stack=stack, cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    pools = {p["pool"]: p for p in json.loads(status.stdout)["pools"]}
    assert pools["gpu"] == {
        "pool": "gpu",
        "queue": "server.gpu",
        "waiting": 1,
        "workers": [],
        "throttled": 0,
        "nobody_consuming": True,
    }
    assert pools["default"]["workers"] and not pools["default"]["nobody_consuming"]
    table = vancetope("status", stack=stack, cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    assert (
        "work waiting, nobody consuming: pool 'gpu': 1 call(s) waiting on queue 'server.gpu', no live worker; "
        "start one: vancetope worker --pool gpu"
    ) in table.stdout
    assert rec.tree_id in table.stdout  # the trees are still listed above
    legacy = vancetope("status", "--json", stack=stack, cwd=tmp_path)
    assert isinstance(json.loads(legacy.stdout), list)  # scripts reading the tree list are unaffected

    worker = gpu_worker(stack)
    done = wait_for_tree(brain, rec.tree_id, timeout=120)
    tasks = {t.task_id: t for t in brain.store.get_tasks(rec.tree_id)}
    assert done.status is TreeStatus.DONE, {t: (r.state.value, r.reason) for t, r in tasks.items()}
    # The gpu worker ran the gpu call, and the dependent it dispatched went to its own pool again.
    assert tasks["on_gpu"].worker.startswith("server-gpu@") and tasks["on_gpu"].result == "hi"
    assert tasks["after"].worker.startswith("server-gpu@") and tasks["after"].route == "server:gpu"
    assert tasks["plain"].worker.startswith("server@") and tasks["plain"].route == "server"

    r = redis.Redis.from_url(stack.redis_url)
    try:
        node = wait_until(lambda: live_pool_workers(r, "gpu"), 120, "the gpu worker's presence")
        assert node[0].startswith("server-gpu@")
        status = vancetope("status", "--queues", "--json", stack=stack, cwd=tmp_path)
        gpu_row = next(p for p in json.loads(status.stdout)["pools"] if p["pool"] == "gpu")
        assert (gpu_row["waiting"], gpu_row["nobody_consuming"]) == (0, False)
        # A worker that stops cleanly withdraws at once.
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(120)
        assert live_pool_workers(r, "gpu") == []
    finally:
        r.close()


def test_worker_refuses_an_unconfigured_pool_naming_the_configured_ones(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "brain", "worker", "--pool", "tpu"],
        check=False,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={
            **os.environ,
            "VANCETOPE_REDIS_URL": "redis://127.0.0.1:1/0",
            "VANCETOPE_POOLS": json.dumps(GPU),
            "COLUMNS": "250",
        },
    )
    assert proc.returncode == 2
    assert "--pool: pool 'tpu' is not configured (pools: default, gpu)" in proc.stderr


def test_explain_shows_the_pool_route_and_refuses_an_unknown_pool(tmp_path: Path) -> None:
    (tmp_path / "vancetope.toml").write_text(
        f'[vancetope]\nregistry = "{gpu_registry(tmp_path, "echo")}"\n\n[[pools]]\nname = "gpu"\n'
    )
    good = tmp_path / "good.yaml"
    good.write_text("id: t\ntasks:\n  - id: a\n    tool: echo\n    args: {value: 1}\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text("id: t\npool: batch\ntasks:\n  - id: a\n    tool: echo\n    args: {value: 1}\n")
    env = {**os.environ, "VANCETOPE_DATA_DIR": str(tmp_path / "data"), "COLUMNS": "250"}
    env.pop("VANCETOPE_REDIS_URL", None)

    def explain(path: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "brain", "explain", str(path)],
            check=False,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )

    shown = explain(good)
    assert shown.returncode == 0, shown.stderr
    assert "server:gpu" in shown.stdout and "on pool 'gpu' (named by tool 'echo')" in shown.stdout
    refused = explain(bad)
    assert refused.returncode == 2
    assert "pool: pool 'batch' is not configured (pools: default, gpu)" in " ".join(refused.stderr.split())


def test_a_message_lost_from_a_pools_queue_is_resent_to_that_pool(
    tmp_path: Path,
    stack_factory: Callable[..., EmbeddedStack],
    brain_factory: Callable[[EmbeddedStack], Brain],
) -> None:
    stack = stack_factory(services=("brain",), registry=gpu_registry(tmp_path, "echo"), pools=GPU)
    brain = brain_factory(stack)
    rec = brain.scheduler.submit(
        tree({"id": "lost", "tasks": [{"id": "a", "tool": "echo", "args": {"value": 1}}]})
    )
    first = brain.store.get_task(rec.tree_id, "a")
    assert first is not None and first.pool == "gpu"
    assert (
        brain.hot.r.delete(*queue_keys(pool_queue("gpu"))) == 1
    )  # the message is gone; the store still says queued
    stack.start_service("server-pool-gpu")
    assert wait_for_tree(brain, rec.tree_id).status is TreeStatus.DONE
    a = brain.store.get_task(rec.tree_id, "a")
    assert a is not None and a.attempt == 2 and a.run_id != first.run_id
    assert a.worker.startswith("server-gpu@") and a.route == "server:gpu"
