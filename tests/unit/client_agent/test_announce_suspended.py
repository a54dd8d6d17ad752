"""client_agent.announce: an agent the brain suspends (its ack replaced by a refusal saying
why, brain.hot.misbehaving) logs the reason and announces again, against a real redis-server."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import pytest
import redis

from client_agent.announce import Heartbeat
from client_agent.channel import AgentChannel
from tests.conftest import wait_until
from tests.unit.client_agent.test_announce import CID, ack, pop, start_announcer
from workers.contracts import ClientConnected

REASON = "suspended by the brain: over quota: 9 bytes > 8"


@pytest.fixture
def stopping() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()


def test_an_agent_told_it_is_suspended_says_why_and_announces_again(
    redis_url: str, r: redis.Redis, stopping: threading.Event, caplog: pytest.LogCaptureFixture
) -> None:
    announcer = start_announcer(redis_url, stopping, ack_timeout_s=5)
    assert isinstance(pop(r), ClientConnected)
    ack(r, "s1", accepted=True)
    assert announcer.accepted.wait(60)
    channel = AgentChannel(redis.Redis.from_url(redis_url), CID)
    with caplog.at_level(logging.WARNING, logger="vancetope"):
        Heartbeat(channel, "s1", interval_s=0.05, ttl_s=0.6, stop=stopping, announcer=announcer).start()
        ack(r, "s1", accepted=False, reason=REASON)
        assert isinstance(pop(r), ClientConnected)  # announced again
        wait_until(
            lambda: any(f"the brain suspended this agent: {REASON}" in m for m in caplog.messages),
            timeout=60,
            what="the reason in the agent's log",
        )
