"""brain.hot.turns on a real redis-server: how two brains share a job that must run once."""

from __future__ import annotations

import redis

from brain.hot.turns import keep_turn, my_turn
from tests.conftest import wait_until

KEY = "vt:test:turn"


def test_my_turn_goes_to_the_first_asker_of_each_interval(redis_client: redis.Redis) -> None:
    assert my_turn(redis_client, KEY, "brain-a", 60.0)
    assert not my_turn(redis_client, KEY, "brain-b", 60.0)
    assert not my_turn(redis_client, KEY, "brain-a", 60.0)  # not twice in one interval, either
    assert redis_client.get(KEY) == b"brain-a"


def test_keep_turn_stays_with_its_holder_and_passes_on_once_the_holder_stops_renewing(
    redis_client: redis.Redis,
) -> None:
    assert keep_turn(redis_client, KEY, "brain-a", 60.0)
    assert not keep_turn(redis_client, KEY, "brain-b", 60.0)
    assert keep_turn(redis_client, KEY, "brain-a", 0.2)  # renewed, now with a short lease
    assert 0 < redis_client.pttl(KEY) <= 200
    # brain-a stops asking (it died): brain-b gets the turn once the lease ran out, and keeps it
    wait_until(lambda: keep_turn(redis_client, KEY, "brain-b", 60.0), 60, "brain-b to get the turn")
    assert not keep_turn(redis_client, KEY, "brain-a", 60.0)
    assert redis_client.get(KEY) == b"brain-b"
