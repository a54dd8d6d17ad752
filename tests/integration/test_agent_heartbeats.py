"""The client agents' heartbeats the brain sends for Flower (brain.runtime.events): one round
for every connected agent goes out as a few messages, not a publish per agent, and Celery's own
event receiver (Flower's) reads each as a ``worker-heartbeat`` of that agent. They are not
published under ``worker.#``, where every Celery worker's gossip would read (and choke on) them.
A real Redis and Celery's receiver; no workers."""

from __future__ import annotations

import math
import threading

import pytest
import redis

from brain.runtime.events import BEATS_PER_MESSAGE, HEARTBEAT_S, ClientEvents, agent_hostname
from brain.runtime.service import Brain
from tests.conftest import wait_until
from tests.integration.test_task_events import Captured

pytestmark = pytest.mark.integration

FENCE = "vancetope-test-fence.celeryev"


def test_one_round_of_agent_heartbeats_is_a_few_messages_each_agent_heard_as_itself(
    brain_on_redis: Brain, redis_client: redis.Redis
) -> None:
    brain = brain_on_redis
    ids = [f"laptop-{i:03d}" for i in range(450)]
    channels: list[str] = []
    stop = threading.Event()
    pubsub = redis_client.pubsub()
    pubsub.psubscribe("*celeryev*")

    def listen() -> None:
        while not stop.is_set():
            message = pubsub.get_message(timeout=0.1)
            if message is not None and message["type"] == "pmessage":
                channels.append(message["channel"].decode())

    captured = Captured(brain, kinds="worker-heartbeat".__eq__)
    events = ClientEvents(brain.scheduler.publisher.app)
    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    try:
        captured.wait_subscribed()
        channels.clear()  # the probes
        events.heartbeats(ids)
        wait_until(lambda: len(captured.events) >= len(ids), timeout=60, what="every agent's heartbeat")
        events.close()  # sends what is queued first
        # Redis hands a subscriber its messages in order: once the listener has this one, it
        # has every beat (a channel Celery's receiver does not subscribe to).
        redis_client.publish(FENCE, b"")
        wait_until(lambda: FENCE in channels, timeout=60, what="the listener to catch up")
    finally:
        events.close()
        captured.close()
        stop.set()
        thread.join(10)
        pubsub.close()
    assert sorted(e["hostname"] for e in captured.events) == sorted(agent_hostname(c) for c in ids)
    assert all(e["freq"] == HEARTBEAT_S and e["active"] == 0 for e in captured.events)
    beats = [c for c in channels[: channels.index(FENCE)] if not c.endswith("probe")]
    assert len(beats) == math.ceil(len(ids) / BEATS_PER_MESSAGE)  # not one per agent
    assert not any("/worker." in c for c in beats)  # gossip's binding: worker.#
