"""brain.hot.client_quota.UsageMeter on a real redis-server: idle clients' keys are not all
measured at every check (a MEMORY USAGE of every key every 2 s was ~2,500 commands a second with
1,000 idle clients), yet a new key, a client near its quota, and a key grown in place are each
found in time."""

from __future__ import annotations

import redis

from brain.hot.client_quota import QUOTA_ALL_EVERY_S, QUOTA_EVERY_S, UsageMeter, _phase, measure_client_usage
from tests.redis_commands import command_counts, reset_counts
from workers.contracts import client_key

CLIENTS = 30
KEYS = 4
QUOTA = 1024 * 1024


def fill(r: redis.Redis) -> None:
    for i in range(CLIENTS):
        for k in range(KEYS):
            r.set(client_key(f"c{i:03d}", f"k{k}"), b"x" * 100)


def checks(start: float, seconds: float) -> list[float]:
    return [start + n * QUOTA_EVERY_S for n in range(int(seconds / QUOTA_EVERY_S))]


def test_unchanged_clients_are_measured_once_per_period_not_at_every_check(redis_client: redis.Redis) -> None:
    fill(redis_client)
    meter = UsageMeter()
    first = meter.measure(redis_client, 1_000.0, QUOTA)
    assert first == measure_client_usage(redis_client)
    reset_counts(redis_client)
    for now in checks(1_000.0 + QUOTA_EVERY_S, 2 * QUOTA_ALL_EVERY_S):
        assert meter.measure(redis_client, now, QUOTA) == first
    measured = command_counts(redis_client).get("memory|usage", 0) + command_counts(redis_client).get(
        "memory", 0
    )
    # Ten checks over two periods: each client's keys measured at most twice (at every check it
    # was 10 x 120 = 1,200).
    assert 0 < measured <= 2 * CLIENTS * KEYS


def test_a_new_key_is_measured_at_the_next_check_and_a_grown_one_within_a_period(
    redis_client: redis.Redis,
) -> None:
    fill(redis_client)
    meter = UsageMeter()
    start = 1_000.0
    before = meter.measure(redis_client, start, QUOTA)["c005"]

    redis_client.set(client_key("c005", "new"), b"y" * 200_000)
    assert meter.measure(redis_client, start + QUOTA_EVERY_S, QUOTA)["c005"] > before + 200_000

    redis_client.set(client_key("c009", "k0"), b"z" * (2 * QUOTA))  # grown in place: no new name
    found = [
        now
        for now in checks(start + QUOTA_EVERY_S, QUOTA_ALL_EVERY_S + QUOTA_EVERY_S)
        if meter.measure(redis_client, now, QUOTA)["c009"] > QUOTA
    ]
    assert found and found[0] - start <= QUOTA_ALL_EVERY_S + QUOTA_EVERY_S


def test_a_client_near_its_quota_is_measured_at_every_check(redis_client: redis.Redis) -> None:
    fill(redis_client)
    redis_client.set(client_key("c001", "big"), b"b" * (QUOTA * 6 // 10))
    meter = UsageMeter()
    meter.measure(redis_client, 1_000.0, QUOTA)
    redis_client.append(client_key("c001", "big"), b"b" * (QUOTA // 2))
    assert meter.measure(redis_client, 1_000.0 + QUOTA_EVERY_S, QUOTA)["c001"] > QUOTA


def test_keys_gone_count_nothing(redis_client: redis.Redis) -> None:
    fill(redis_client)
    meter = UsageMeter()
    meter.measure(redis_client, 1_000.0, QUOTA)
    for k in range(KEYS):
        redis_client.delete(client_key("c002", f"k{k}"))
    redis_client.delete(client_key("c003", "k0"))
    used = meter.measure(redis_client, 1_000.0 + QUOTA_EVERY_S, QUOTA)
    assert "c002" not in used
    assert used["c003"] < used["c004"]


def test_a_busy_clients_new_keys_are_measured_not_all_its_keys_again(redis_client: redis.Redis) -> None:
    # A client running calls makes a key per run (its delivery counter): every check finds new
    # names. Measuring all its keys then was ~5 MEMORY USAGE per call in a 2,000-call tree.
    for k in range(500):
        redis_client.set(client_key("busy", f"run{k}"), b"1")
    meter = UsageMeter()
    start = 100 * QUOTA_ALL_EVERY_S - _phase("busy") + 0.1  # the start of one of its periods
    meter.measure(redis_client, start, QUOTA)
    reset_counts(redis_client)
    for n, now in enumerate(checks(start + QUOTA_EVERY_S, 3 * QUOTA_EVERY_S)):  # same period
        for k in range(10):
            redis_client.set(client_key("busy", f"new{n}-{k}"), b"1")
        used = meter.measure(redis_client, now, QUOTA)
    counts = command_counts(redis_client)
    assert counts.get("memory|usage", 0) + counts.get("memory", 0) == 30  # its new keys only
    assert used == measure_client_usage(redis_client)  # and the sum is every key's
