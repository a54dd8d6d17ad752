"""A call that holds only a place in its pool's queue window says so in its message's header,
never in its body (brain.runtime.dispatch, workers.tasks): an older pool, whose ToolCall forbids
unknown fields, still parses the body and runs the gate at each end, as it always did; a pool of
this version lets those ends share a run of the gate (brain.runtime.gate_ends). The brain here
dispatches to a real Redis with fair share on, and a real Celery worker consumes what it sent."""

from __future__ import annotations

import base64
import json
import threading
from pathlib import Path

import redis
from celery.contrib.testing.worker import start_worker

from brain.runtime.service import Brain
from brain.stack.redis_server import RedisServer
from tests.conftest import example_registry, make_settings, tree
from workers.app import make_app
from workers.contracts import DEFAULT_POOL, REFILLS_WINDOW_HEADER, ToolCall, pool_queue
from workers.tasks import register


def test_a_window_only_call_says_it_in_its_header_and_the_worker_ends_it_as_such(
    tmp_path: Path, redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    settings = make_settings(tmp_path, queue_window=3)
    brain = Brain.connect(settings, redis_server.url, example_registry())
    try:
        tasks = [{"id": f"e{i}", "tool": "echo", "args": {"value": i}} for i in range(5)]
        brain.scheduler.submit(tree({"id": "windowed", "tasks": tasks}), user="ada")
        queued = redis_client.lrange(pool_queue(None), 0, -1)
        assert len(queued) == 3  # the window; the rest wait at the gate
        for raw in queued:
            message = json.loads(raw)
            assert message["headers"][REFILLS_WINDOW_HEADER] is True
            body = json.loads(base64.b64decode(message["body"]))[0][0]
            assert body["holds_slot"] is True and "refills_window" not in body
            ToolCall.model_validate(body)  # what an older pool parses: nothing unknown in it
    finally:
        brain.close()

    ended: list[ToolCall] = []
    done = threading.Event()

    def end(call: ToolCall) -> None:
        ended.append(call)
        if len(ended) == 3:
            done.set()

    app = make_app(redis_server.url)
    run_tool = register(app, sink=lambda result: None, begin=lambda call, worker, started: 1, end=end)
    assert run_tool.name
    with start_worker(
        app, pool="solo", perform_ping_check=False, queues=[pool_queue(None)], shutdown_timeout=30
    ):
        assert done.wait(60), f"the worker ended {len(ended)} of the 3 queued calls"
    assert all(call.holds_slot and call.refills_window for call in ended)
    app.close()


def test_a_call_under_a_cap_carries_no_such_header(
    tmp_path: Path, redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    settings = make_settings(tmp_path, queue_window=3, server_max_concurrency=2)
    capped = example_registry().model_copy(
        update={"pool_limits": {DEFAULT_POOL: settings.default_pool_limits}}
    )
    brain = Brain.connect(settings, redis_server.url, capped)
    try:
        tasks = [{"id": f"e{i}", "tool": "echo", "args": {"value": i}} for i in range(4)]
        brain.scheduler.submit(tree({"id": "capped", "tasks": tasks}), user="ada")
        queued = redis_client.lrange(pool_queue(None), 0, -1)
        assert len(queued) == 2  # the cap
        assert all(REFILLS_WINDOW_HEADER not in json.loads(raw)["headers"] for raw in queued)
    finally:
        brain.close()
