"""The plain-Celery baseline: a Celery app with two trivial tasks, nothing of Vancetope.

The worker runs as ``celery -A bench.celery_baseline worker -Q bench -P prefork -c 2``
(the same pool as Vancetope's server pool, ``server_concurrency = 2``) on the same
redis-server as the Vancetope run it is compared with.

Completion is counted with ``INCR`` on a Redis key the producer polls, not with the
result backend: docs/performance.md shows thousands of ``AsyncResult.get()`` on the Redis
backend stall the producer on its pub/sub backlog, which would measure that trap,
not Celery.

The reliability settings match Vancetope's (late ack, prefetch 1, JSON, no result
backend) so the comparison measures Vancetope's own work - the brain round trip and the
store - and not a different delivery guarantee. Task events stay off (Celery's default;
Vancetope's workers run with ``-E``, which is part of its cost).
"""

from __future__ import annotations

import os
from typing import Any

import redis
from celery import Celery, chord, group

QUEUE = "bench"
NOOP_TASK = "bench.noop"
HOP_TASK = "bench.hop"
# The chord (fan-in) and round-trip baselines need Celery's Redis result backend; their
# worker runs with BENCH_RESULT_BACKEND set and consumes its own queue.
MEMBER_TASK = "bench.member"
FAN_IN_TASK = "bench.fan_in"
ECHO_TASK = "bench.echo"
# The fan-out baseline: a task holding a list sends a group of one member per item and a
# chord callback (the fan-in task) that gets all their results; also on the backend worker.
FAN_OUT_TASK = "bench.fan_out"

_clients: dict[int, redis.Redis] = {}


def make_app(broker_url: str, result_backend: str | None = None) -> Celery:
    app = Celery("bench-baseline", set_as_current=False)
    app.conf.update(
        broker_url=broker_url,
        broker_connection_retry_on_startup=True,
        result_backend=result_backend,
        task_ignore_result=result_backend is None,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_serializer="json",
        accept_content=["json"],
        task_default_queue=QUEUE,
        worker_hijack_root_logger=False,
    )
    return app


def _redis() -> redis.Redis:
    # One client per process: a prefork child must not share the parent's socket.
    pid = os.getpid()
    client = _clients.get(pid)
    if client is None:
        client = _clients[pid] = redis.Redis.from_url(app.conf.broker_url)
    return client


app = make_app(
    os.environ.get("BENCH_REDIS_URL") or "redis://127.0.0.1:6379/0",
    os.environ.get("BENCH_RESULT_BACKEND") or None,
)


@app.task(name=NOOP_TASK)
def noop(counter_key: str, value: Any) -> Any:
    """The baseline of one ``echo`` task: return the value, count the completion."""
    _redis().incr(counter_key)
    return value


@app.task(name=HOP_TASK)
def hop(counter_key: str, index: int, length: int, value: Any) -> Any:
    """One link of a chain: its completion sends the next link, the last one counts."""
    if index + 1 < length:
        app.send_task(HOP_TASK, args=[counter_key, index + 1, length, value], queue=QUEUE)
    else:
        _redis().incr(counter_key)
    return value


@app.task(name=MEMBER_TASK)
def member(value: Any) -> Any:
    """One of a chord's header tasks: its result goes to the backend and counts the chord."""
    return value


@app.task(name=FAN_IN_TASK)
def fan_in(results: list[Any], counter_key: str) -> int:
    """A chord's body: gets every header result, counts the completion."""
    _redis().incr(counter_key)
    return len(results)


@app.task(name=FAN_OUT_TASK, ignore_result=True)
def fan_out(items: list[Any], counter_key: str, queue: str) -> None:
    """A fan-out over a task's list, the plain-Celery way: this task has the list (as
    Vancetope's first task returns it) and sends, from the worker, a ``group`` of one
    ``bench.member`` per item followed by a chord callback, ``bench.fan_in``, which gets the
    list of their results and counts the completion."""
    header = group(member.s(item).set(queue=queue) for item in items)
    chord(header)(fan_in.s(counter_key).set(queue=queue))


@app.task(name=ECHO_TASK)
def echo(value: Any) -> Any:
    """The round-trip baseline: return the value through the result backend."""
    return value
