"""``redis_maxmemory`` takes what Redis takes, and the limits follow ``max_result_bytes``."""

from __future__ import annotations

import pytest

from brain.config import load_settings
from brain.errors import ConfigError
from brain.stack.redis_server import QUERY_BUFFER_SLACK, redis_limits
from workers.app import message_limit


@pytest.mark.parametrize("value", ["1gb", "512MB", "64m", "1048576", "0"])
def test_a_redis_memory_size_is_accepted(value: str) -> None:
    assert load_settings(env={"VANCETOPE_REDIS_MAXMEMORY": value}).redis_maxmemory == value


@pytest.mark.parametrize("value", ["lots", "1 gb", "-1gb", "1tb", "1gb --appendonly no"])
def test_anything_else_is_refused_before_it_reaches_redis_servers_command_line(value: str) -> None:
    with pytest.raises(ConfigError, match="redis_maxmemory"):
        load_settings(env={"VANCETOPE_REDIS_MAXMEMORY": value})


def test_the_bulk_limit_is_the_largest_message_a_consumer_accepts() -> None:
    small, big = redis_limits("1gb", 1024), redis_limits("1gb", 10 * 1024 * 1024)
    assert small.max_bulk_bytes == message_limit(1024) == 8 * 1024 * 1024  # never below the floor
    assert big.max_bulk_bytes == 30 * 1024 * 1024
    assert big.query_buffer_bytes == big.max_bulk_bytes + QUERY_BUFFER_SLACK
    assert big.args()[:2] == ["--maxmemory", "1gb"]
