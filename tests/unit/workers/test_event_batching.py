"""workers.event_batching: a pool's task events of one window go to Flower as one PUBLISH,
counted on a real redis-server (INFO commandstats), with Celery's own dispatcher."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis

from brain.stack.redis_server import RedisServer
from workers.app import make_app
from workers.event_batching import FLUSH_EVERY_S, BatchedTaskEvents


class Hub:
    """The event loop's timers, fired by the test."""

    def __init__(self) -> None:
        self.timers: list[tuple[float, Callable[[], None]]] = []

    def call_later(self, delay: float, fn: Callable[[], None]) -> None:
        self.timers.append((delay, fn))

    def fire(self) -> None:
        timers, self.timers = self.timers, []
        for _, fn in timers:
            fn()


class Consumer:
    """What the step reads of Celery's consumer: its dispatcher, its hub, its flush."""

    def __init__(self, dispatcher: Any, hub: Hub) -> None:
        self.event_dispatcher, self.hub = dispatcher, hub

    def _flush_events(self) -> None:
        self.event_dispatcher.flush()


def publishes(r: redis.Redis) -> int:
    return int(r.info("commandstats").get("cmdstat_publish", {}).get("calls", 0))


def test_a_windows_task_events_are_one_publish_however_many(
    redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    app = make_app(redis_server.url)
    conn = app.connection_for_write()
    hub = Hub()
    dispatcher = app.events.Dispatcher(conn, buffer_group=["task"], on_send_buffered=lambda: None)
    try:
        consumer = Consumer(dispatcher, hub)
        BatchedTaskEvents(consumer).start(consumer)
        before = publishes(redis_client)
        for i in range(100):  # 300 tasks a second for a tenth of a second: 100 events
            dispatcher.send("task-succeeded", uuid=f"run-{i}", result="{}", runtime=0.001)
        assert publishes(redis_client) == before  # none before the window ends
        assert [delay for delay, _ in hub.timers] == [FLUSH_EVERY_S]  # one timer for all
        hub.fire()
        assert publishes(redis_client) == before + 1
    finally:
        dispatcher.close()
        conn.release()
        app.close()
