"""Brain.connect against a Redis where no brain has published its registry (the CLI's and
``vancetope.connect``'s case): StackNotRunning, and the Redis client it opened to find that out
closed, not left to the garbage collector with its socket open."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from brain.errors import StackNotRunning
from brain.hot.state import HotState
from brain.runtime.service import Brain
from brain.stack.redis_server import RedisServer
from tests.conftest import make_settings


def test_connect_without_a_published_registry_closes_the_client_it_opened(
    tmp_path: Path, redis_server: RedisServer, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    closed: list[HotState] = []
    close = HotState.close

    def recorded(self: HotState) -> None:
        closed.append(self)
        close(self)

    monkeypatch.setattr(HotState, "close", recorded)
    with pytest.raises(StackNotRunning, match="no brain has published its registry"):
        Brain.connect(make_settings(tmp_path), redis_server.url)  # redis_client emptied Redis
    assert len(closed) == 1
