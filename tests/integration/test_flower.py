"""Operators watching Flower see each client agent and its tasks, though agents send no events."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from brain.models import SessionKind
from brain.redis_server import RedisServer, free_port
from brain.service import Brain
from brain.stack import flower_argv
from tests.conftest import tree, wait_until
from tests.integration.test_parking import connect
from workers.contracts import ToolProgress, ToolResult

pytestmark = pytest.mark.integration


def get_json(url: str) -> object:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return json.loads(response.read())
    except OSError:
        return None


def test_flower_lists_the_client_agent_and_the_tasks_routed_to_it(
    tmp_path: Path, redis_server: RedisServer, brain_on_redis: Brain
) -> None:
    port = free_port()
    # Flower runs as its own Redis user, as in the stack (brain.acl.COMPONENT_RULES).
    flower_url = redis_server.url_for("vt-flower")
    env = {**os.environ, "VANCETOPE_REDIS_URL": flower_url, "FLOWER_UNAUTHENTICATED_API": "true"}
    with open(tmp_path / "flower.log", "w") as log:
        flower = subprocess.Popen(
            flower_argv(port),  # the stack's own command line
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        base = f"http://127.0.0.1:{port}/api"
        brain = brain_on_redis
        brain.scheduler.presence.enroll("laptop", "ada")
        connect(brain, "laptop")

        def agent_listed() -> bool:
            # Flower subscribes to events a moment after it starts: keep the heartbeats coming.
            brain.clients.sweep_heartbeats()
            page = get_json(f"http://127.0.0.1:{port}/workers?json=1") or {}
            return any(
                w.get("hostname") == "client-agent@laptop" and w.get("status") for w in page.get("data", [])
            )

        wait_until(agent_listed, timeout=60, what="Flower's worker list to show client-agent@laptop")
        rec = brain.scheduler.submit(
            tree({"id": "fl", "tasks": [{"id": "read", "tool": "read_local_file", "args": {"path": "a"}}]}),
            session=SessionKind.INTERACTIVE,
            client_id="laptop",
        )
        task = brain.store.get_task(rec.tree_id, "read")
        # Progress from the client's MCP server, as the relay hands it on: PROGRESS in Flower.
        update = ToolProgress(
            run_id=task.run_id, tree_id=rec.tree_id, task_id="read", progress=1, total=2, at=time.time(),
            client_id="laptop",
        )  # fmt: skip
        assert brain.scheduler.on_progress(update, from_client="laptop")
        brain.scheduler.events.task_progress(update)
        wait_until(
            lambda: (get_json(f"{base}/tasks") or {}).get(task.run_id, {}).get("state") == "PROGRESS",
            timeout=30,
            what="Flower to show the client's task in progress",
        )
        assert brain.store.get_task(rec.tree_id, "read").progress.total == 2
        brain.scheduler.on_result(
            ToolResult(
                run_id=task.run_id,
                tree_id=rec.tree_id,
                task_id="read",
                tool="read_local_file",
                ok=True,
                value="x",
                client_id="laptop",
                started_at=time.time() - 0.1,
                finished_at=time.time(),
            ),
            from_client="laptop",
        )
        wait_until(
            lambda: (get_json(f"{base}/tasks") or {}).get(task.run_id, {}).get("state") == "SUCCESS",
            timeout=30,
            what="Flower to show the client's task as succeeded",
        )
        tasks = get_json(f"{base}/tasks") or {}
        assert tasks[task.run_id]["state"] == "SUCCESS"
        assert tasks[task.run_id]["worker"] == "client-agent@laptop"
    finally:
        flower.terminate()
        flower.wait(20)
