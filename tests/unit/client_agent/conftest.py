"""Fixtures for the client agent's unit tests: one real redis-server per module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from brain.stack.redis_server import RedisServer


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    # Tests may import brain to start redis-server; the agent code never does.
    server = RedisServer(tmp_path_factory.mktemp("redis"), appendonly=False).start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def r(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    yield client
    client.close()
