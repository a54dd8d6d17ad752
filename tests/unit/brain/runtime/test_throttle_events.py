"""Calls waiting at the gate reported to Flower once each, by one brain (brain.runtime.throttle_events),
on a real redis-server; the events are caught where they would be published (the integration
test tests/integration/test_flower.py sees them in a real Flower)."""

from __future__ import annotations

from typing import Any

import redis
from celery import Celery

from brain.core.fairshare import AppliedLimit, lane_id
from brain.hot.gate import Gate, Lane
from brain.runtime import throttle_events
from brain.runtime.throttle_events import CHUNK, ThrottleReporter, next_pass_in
from tests.conftest import wait_until
from tests.unit.brain.hot.test_gate import put

RATE1 = AppliedLimit("tool", "slow", "1/s", None)


class Caught(ThrottleReporter):
    def __init__(self, r: redis.Redis, holder: str) -> None:
        super().__init__(r, Celery(set_as_current=False))
        self.holder = holder
        self.messages: list[list[dict[str, Any]]] = []

    def _send(self, events: list[dict[str, Any]]) -> None:
        self.messages.append(events)

    def reported(self) -> dict[str, str]:
        return {e["uuid"]: e["throttled_by"] for m in self.messages for e in m}


def slow_lane() -> Lane:
    return Lane(lane_id(None, "ada", (RATE1,)), None, "ada", (RATE1,))


def test_a_call_left_waiting_is_reported_once_with_the_limit_that_holds_it(redis_client: redis.Redis) -> None:
    gate = Gate(redis_client)
    put(redis_client, gate, slow_lane(), "r1", "r2", "r3")
    assert gate.admit().count == 1  # r1 goes at once: never reported
    reporter = Caught(redis_client, "brain-a")
    assert reporter.report_once(lease_s=5) == 0  # seen once: it may have been about to go
    assert reporter.report_once(lease_s=5) == 2
    assert reporter.reported() == {"r2": "rate_limit 1/s of tool slow", "r3": "rate_limit 1/s of tool slow"}
    assert reporter.report_once(lease_s=5) == 0
    assert len(reporter.messages) == 1  # both in one message


def test_one_brain_of_two_reports_and_the_other_takes_over_when_it_stops(redis_client: redis.Redis) -> None:
    gate = Gate(redis_client)
    put(redis_client, gate, slow_lane(), "r1", "r2")
    gate.admit()
    first, second = Caught(redis_client, "brain-a"), Caught(redis_client, "brain-b")
    for _ in range(3):
        first.report_once(lease_s=5)
        second.report_once(lease_s=5)
    assert first.reported() == {"r2": "rate_limit 1/s of tool slow"}
    assert second.messages == []
    # The first stops looking (its brain died): once its turn lapses the second reports.
    first.report_once(lease_s=0.2)
    wait_until(lambda: second.report_once(lease_s=5), 60, "the second brain to take the turn over")
    assert second.reported() == {"r2": "rate_limit 1/s of tool slow"}


def test_thousands_waiting_are_read_and_reported_in_chunks(
    redis_client: redis.Redis, monkeypatch: Any
) -> None:
    gate = Gate(redis_client)
    runs = [f"r{i}" for i in range(2 * CHUNK + 500)]
    put(redis_client, gate, slow_lane(), *runs)
    gate.admit()
    scans: list[int] = []
    real = Gate.waiting_runs

    def counted(self: Gate, chunk: int) -> Any:
        for found in real(self, chunk):
            scans.append(len(found))
            yield found

    monkeypatch.setattr(Gate, "waiting_runs", counted)
    reporter = Caught(redis_client, "brain-a")
    reporter.report_once(lease_s=5)
    assert reporter.report_once(lease_s=5) == len(runs) - 1
    assert sorted(len(m) for m in reporter.messages) == [500 - 1, CHUNK, CHUNK]
    assert len(scans) >= 2 * 2 and max(scans) < 2 * CHUNK  # several HSCANs a pass, none reads all


def test_a_long_pass_spaces_the_next_one_to_keep_a_small_share_of_a_core() -> None:
    assert next_pass_in(0.001) == throttle_events.PASS_S
    assert next_pass_in(0.1) == 0.1 / throttle_events.CPU_SHARE
