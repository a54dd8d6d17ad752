"""brain.runtime.dispatch: a call lands on the queue its route names, as a Celery job whose id
is the run id; a client's call under that client's key prefix. Read back from a real
redis-server (the conftest's) as kombu left it."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from brain.runtime.dispatch import Publisher, args_summary, sent_event
from brain.stack.redis_server import RedisServer
from workers.app import make_app
from workers.contracts import RUN_TOOL_TASK, ToolCall, ToolType


def call(task_id: str = "a", client_id: str | None = None, **fields: Any) -> ToolCall:
    return ToolCall(
        run_id=f"t.{task_id}.1.abc", tree_id="t", task_id=task_id, tool="echo", tool_type=ToolType.BUILT_IN,
        args={"value": "a secret value", "b": 1}, timeout_s=30, max_result_bytes=1024, client_id=client_id,
        **fields,
    )  # fmt: skip


@pytest.fixture(params=[True, False], ids=["brain app", "app per client"])
def publisher(request: pytest.FixtureRequest, redis_server: RedisServer) -> Iterator[Publisher]:
    # The brain's app sends every client's calls on its own connection (client_queues); a
    # Publisher on any other app keeps an app per client prefix. Both land the same message.
    app = make_app(redis_server.url, client_queues=request.param)
    publisher = Publisher(app, task_events=False)
    yield publisher
    publisher.close()
    app.close()


def jobs(r: redis.Redis, key: str) -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in reversed(r.lrange(key, 0, -1))]  # oldest first


@pytest.mark.parametrize(
    ("pool", "queue"),
    [(None, "server"), ("default", "server"), ("gpu", "server.gpu")],
)
def test_a_server_call_lands_on_its_pools_queue_named_by_its_run_id(
    publisher: Publisher, redis_client: redis.Redis, pool: str | None, queue: str
) -> None:
    publisher.send(call(), pool)
    (job,) = jobs(redis_client, queue)
    headers = job["headers"]
    assert headers["id"] == "t.a.1.abc" and headers["task"] == RUN_TOOL_TASK
    # Flower is shown the argument names, never their values.
    assert headers["argsrepr"] == "echo(b, value)" and "a secret value" not in json.dumps(headers)
    assert headers["timelimit"] == [60.0, 40.0]  # hard and soft: the tool's timeout plus margins


def test_a_client_call_lands_only_under_that_clients_prefix(
    publisher: Publisher, redis_client: redis.Redis
) -> None:
    publisher.send(call(client_id="laptop"), pool="gpu")  # a client's call ignores any pool
    assert [j["headers"]["id"] for j in jobs(redis_client, "c:laptop:client.laptop")] == ["t.a.1.abc"]
    assert redis_client.exists("server", "server.gpu", "client.laptop") == 0


def test_the_brains_app_sends_every_clients_calls_on_its_own_connections(
    redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    app = make_app(redis_server.url, client_queues=True)
    publisher = Publisher(app, task_events=False)
    try:
        before = int(redis_client.info("clients")["connected_clients"])
        with publisher.batch():  # one pipeline for all of them
            for i in range(50):
                publisher.send(call(f"t{i}", client_id=f"ws-{i}"))
        for i in range(50):
            (job,) = jobs(redis_client, f"c:ws-{i}:client.ws-{i}")
            # What the agent's own prefixed channel reads and restores: the unprefixed queue name.
            assert job["properties"]["delivery_info"]["routing_key"] == f"client.ws-{i}"
        assert publisher.app_for("ws-7") is app and not publisher._client_apps
        assert int(redis_client.info("clients")["connected_clients"]) - before <= 2
        assert not [k for k in redis_client.keys("client.*")], "nothing lands unprefixed"
    finally:
        publisher.close()
        app.close()


def test_a_client_id_that_is_no_client_id_is_refused_by_the_brains_app(redis_server: RedisServer) -> None:
    app = make_app(redis_server.url, client_queues=True)
    try:
        with pytest.raises(ValueError, match="invalid client id"), app.producer_or_acquire() as producer:
            app.send_task(RUN_TOOL_TASK, args=[{}], queue="client.a:b", producer=producer, declare=[])
    finally:
        app.close()


def test_a_batch_sends_its_calls_in_order_when_it_ends(
    publisher: Publisher, redis_client: redis.Redis
) -> None:
    with publisher.batch():
        for task_id in ("a", "b", "c"):
            publisher.send(call(task_id))
        with publisher.batch():  # a nested batch joins the outer one
            publisher.send(call("d"))
        assert redis_client.llen("server") == 0  # nothing out before the batch is written
    assert [j["headers"]["id"] for j in jobs(redis_client, "server")] == [f"t.{t}.1.abc" for t in "abcd"]


def test_a_batchs_task_sent_events_are_one_message_for_its_server_calls_only(
    redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    app = make_app(redis_server.url)
    publisher = Publisher(app, task_events=True)
    events = redis_client.pubsub()
    events.subscribe("/0.celeryev/task.multi")  # where kombu publishes Celery's event fan-out
    try:
        confirmed = events.get_message(timeout=10)  # subscribed before anything is sent
        assert confirmed is not None and confirmed["type"] == "subscribe"
        with publisher.batch():
            publisher.send(call("a"))
            publisher.send(call("b", client_id="laptop"))
            publisher.send(call("c"))
        message = events.get_message(timeout=10)
        assert message is not None
        body = json.loads(base64.b64decode(json.loads(message["data"])["body"]))
        assert [(e["type"], e["uuid"], e["args"]) for e in body] == [
            ("task-sent", "t.a.1.abc", "echo(b, value)"),
            ("task-sent", "t.c.1.abc", "echo(b, value)"),
        ]
        assert events.get_message(timeout=0.2) is None  # one message for the batch
    finally:
        events.close()
        publisher.close()
        app.close()


def test_sent_event_and_args_summary_name_arguments_never_their_values() -> None:
    event = sent_event(call(), "server")
    assert event["uuid"] == event["root_id"] == "t.a.1.abc"
    assert (event["name"], event["queue"], event["routing_key"]) == (RUN_TOOL_TASK, "server", "server")
    assert event["args"] == args_summary(call()) == "echo(b, value)"
    assert "a secret value" not in json.dumps({k: v for k, v in event.items() if k != "timestamp"})


def test_gated_calls_of_many_trees_share_one_connection_and_reach_their_lanes(
    redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    # With fair share on, every tree is a lane of its own. A key prefix per lane was a Celery app
    # and a Redis connection per tree, kept open: 2 more clients per gateway call, for good.
    from brain.core.fairshare import lane_id
    from brain.hot.gate import Gate, Lane

    app = make_app(redis_server.url)
    publisher = Publisher(app, task_events=False, gate=Gate(redis_client))
    try:
        publisher.send(
            call("warm"), None, Lane(lane_id(None, "ada", (), tree="warm"), None, "ada", (), window=8)
        )
        before = redis_client.info("clients")["connected_clients"]
        for i in range(20):
            tree = f"t{i}"
            lane = Lane(lane_id(None, "ada", (), tree=tree), None, "ada", (), priority=5, window=8)
            publisher.send(call(f"a{i}").model_copy(update={"run_id": f"{tree}.a.1.x"}), None, lane)
        assert redis_client.info("clients")["connected_clients"] - before <= 1
        # The window (8) let 8 of the 21 into the pool queue; the rest wait in their own lanes.
        assert redis_client.llen("server") == 8
        assert sum(1 for key in Gate(redis_client).wait_keys() if redis_client.llen(key)) == 13
    finally:
        publisher.close()
        app.close()
