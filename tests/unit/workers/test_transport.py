"""workers.transport: what the guarded channel lets through, and that it keeps consuming.

The decision (``check_payload``) is tested as a table; the channel against a real Redis,
with garbage pushed where anyone with a push right could put it.
"""

from __future__ import annotations

import base64
import json
import logging
from typing import Any

import pytest
import redis
from kombu import Consumer, Queue
from kombu.message import Message

from workers.app import make_app
from workers.contracts import MAX_JSON_DEPTH, RUN_TOOL_TASK
from workers.transport import GuardedTransport, UnsafeMessage, check_payload, depth_over, json_depth


def envelope(body: Any = None, *, headers: dict[str, Any] | None = None, **props: Any) -> dict[str, Any]:
    raw_body = json.dumps([[body], {}, {}]).encode()
    return {
        "body": base64.b64encode(raw_body).decode(),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": {"task": RUN_TOOL_TASK, "id": "run-1"} if headers is None else headers,
        "properties": {"delivery_tag": "tag-1", "body_encoding": "base64", "delivery_info": {}, **props},
    }


def encoded(data: Any) -> bytes:
    return json.dumps(data).encode()


def deep(n: int) -> bytes:
    return b"[" * n + b"]" * n


@pytest.mark.parametrize(
    ("raw", "depth"),
    [
        (b"1", 0),
        (b"[]", 1),
        (b'{"a": [1, {"b": []}]}', 4),
        (b'{"a": "[[[[{{{{"}', 1),  # brackets inside a string do not count
        (b'["\\"[[[", [2]]', 2),  # nor do they after an escaped quote
        (deep(10_000), 10_000),
    ],
)
def test_json_depth_counts_nesting_without_parsing(raw: bytes, depth: int) -> None:
    assert json_depth(raw) == depth


@pytest.mark.parametrize(
    ("raw", "limit", "over"),
    [
        (deep(10_000), 128, 10_000),
        (deep(129), 128, 129),
        (deep(128), 128, None),
        (b'{"a": "' + b"[" * 500 + b'"}', 128, None),  # many openings, all inside a string
        (b'{"a": [1, {"b": []}]}', 3, 4),
        (b'{"a": [1, {"b": []}]}', 4, None),
    ],
)
def test_depth_over_reports_only_what_is_over_the_limit(raw: bytes, limit: int, over: int | None) -> None:
    assert depth_over(raw, limit) == over


def test_a_message_celery_wrote_passes_unchanged(redis_client: redis.Redis, redis_server: Any) -> None:
    app = make_app(redis_server.url)
    try:
        app.send_task(RUN_TOOL_TASK, args=[{"x": [1, {"y": "z"}]}], task_id="run-1", queue="server")
    finally:
        app.close()
    (raw,) = redis_client.lrange("server", 0, -1)
    assert check_payload(raw) == json.loads(raw)


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b"not json at all", "not JSON"),
        (b"\xff\xfe\x00garbage", "not JSON"),
        (b"{}", "not a kombu message envelope"),
        (b"[1, 2, 3]", "not a kombu message envelope"),
        (b'"just a string"', "not a kombu message envelope"),
        (encoded({**envelope(), "body": 5}), "not a kombu message envelope"),
        (encoded(envelope(delivery_tag=7)), "not a kombu message envelope"),
        (encoded(envelope(body_encoding="rot13")), "not a kombu message envelope"),
        (encoded({**envelope(), "body": "abc"}), "body is not base64"),
        (encoded(envelope(headers={"task": ["a", "list"], "id": "x"})), "not a Celery task message"),
        (encoded(envelope(headers={"task": RUN_TOOL_TASK})), "not a Celery task message"),
        (b'{"__type__": "datetime", "__value__": "never"}', "not JSON"),
        (deep(10_000), "message nested 10000 deep"),
        (encoded(envelope(json.loads(deep(MAX_JSON_DEPTH)))), "body nested"),
        (b'"' + b"x" * 40_000 + b'"', "40002 bytes, over the 30000-byte limit"),
    ],
)
def test_payloads_that_would_stop_a_consumer_are_refused_with_the_reason(raw: bytes, why: str) -> None:
    with pytest.raises(UnsafeMessage) as info:
        check_payload(raw, max_bytes=30_000)
    assert why in info.value.reason


def test_tls_urls_keep_their_certificate_checks_on_the_guarded_transport() -> None:
    import ssl

    app = make_app("rediss://u:pw@broker.example:6380/2?ssl_cert_reqs=required")
    try:
        conn = app.connection_for_write()
        assert conn.transport_cls and isinstance(conn.transport, GuardedTransport)
        assert conn.ssl == {"ssl_cert_reqs": ssl.CERT_REQUIRED}
        assert (conn.hostname, conn.port, conn.virtual_host, conn.password) == (
            "broker.example",
            6380,
            "2",
            "pw",
        )
    finally:
        app.close()


def test_the_channel_drops_garbage_names_the_queue_and_delivers_the_next_message(
    redis_client: redis.Redis, redis_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    app = make_app(redis_server.url, keyprefix="c:box:")
    received: list[Any] = []

    def receive(body: Any, message: Message) -> None:
        received.append(body)
        # Acknowledged as a worker does. Left unacked, kombu restores it when the channel
        # closes, on a new connection from the pool it has just disconnected, which nobody
        # closes: its socket was left to the garbage collector ("unclosed <socket.socket>").
        message.ack()

    try:
        with app.connection_for_read() as conn:
            queue = Queue("client.box", routing_key="client.box")
            with Consumer(conn, [queue], callbacks=[receive], accept=["json"]):
                redis_client.lpush("c:box:client.box", b"not json", b"{}", deep(10_000))
                with app.producer_or_acquire() as producer:
                    producer.publish({"ok": True}, routing_key="client.box", serializer="json")
                with caplog.at_level(logging.ERROR, logger="vancetope.transport"):
                    for _ in range(10):  # bounded: three drops, then the real message
                        try:
                            conn.drain_events(timeout=2)
                        except TimeoutError:
                            break
                        if received:
                            break
    finally:
        app.close()
    assert received == [{"ok": True}]
    drops = [r.getMessage() for r in caplog.records if "dropped a message" in r.getMessage()]
    assert len(drops) == 3
    assert all("queue 'client.box' (key 'c:box:client.box')" in line for line in drops)


def test_with_unacked_ahead_a_held_message_is_recorded_requeued_redelivered_and_acked(
    redis_client: redis.Redis, redis_server: Any
) -> None:
    """``vt_unacked_ahead`` (a client agent's): kombu's unacked write is not waited for, yet
    the message is in the unacked hash while held, a requeue (which waits for the write)
    puts it back marked redelivered, and an ack leaves no record."""
    app = make_app(redis_server.url, keyprefix="c:box:")
    app.conf.broker_transport_options = {**app.conf.broker_transport_options, "vt_unacked_ahead": True}
    received: list[Message] = []
    try:
        with app.connection_for_read() as conn:
            queue = Queue("client.box", routing_key="client.box")
            with Consumer(conn, [queue], callbacks=[lambda _body, m: received.append(m)], accept=["json"]):
                with app.producer_or_acquire() as producer:
                    producer.publish({"n": 1}, routing_key="client.box", serializer="json")
                for _ in range(10):
                    if received:
                        break
                    conn.drain_events(timeout=2)
                first = received.pop()
                assert not first.delivery_info.get("redelivered")
                first.requeue()  # waits for the write, then kombu's restore finds the record
                assert redis_client.hlen("c:box:unacked") == 0 and redis_client.llen("c:box:client.box") == 1
                for _ in range(10):
                    if received:
                        break
                    conn.drain_events(timeout=2)
                again = received.pop()
                assert again.payload == {"n": 1} and again.delivery_info.get("redelivered")
                assert redis_client.hlen("c:box:unacked") == 1  # recorded while held
                again.ack()
    finally:
        app.close()
    assert redis_client.hlen("c:box:unacked") == 0 and redis_client.zcard("c:box:unacked_index") == 0
