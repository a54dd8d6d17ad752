"""Running the gate when a server worker's runs end (brain.runtime.gate_ends): a slot under a
cap goes back at once, a place in a queue window with the worker's other ends of the moment.
The gate here only counts its runs; the clock is the test's (the timer's own wait is real and
short, and the tests wait for its run, never assert how soon it came)."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
import redis

from brain.core.fairshare import AppliedLimit, lane_id
from brain.hot.gate import INBOX_PREFIX, Admitted, Gate, Lane, Waiting
from brain.runtime.gate_ends import GateEnds
from workers.contracts import ToolCall, key_gate_waiting, pool_queue

EVERY_S = 0.05


class CountingGate:
    def __init__(self, fail: bool = False) -> None:
        self.runs: list[list[str]] = []
        self.fail = fail
        self.ran = threading.Event()

    def admit(self, release: Any = (), *, wake: bool = True) -> Admitted:
        self.runs.append(list(release))
        self.ran.set()
        if self.fail:
            raise ConnectionError("redis went away")
        return Admitted(0, None)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def call(run: str, *, slot: bool = False, window: bool = False) -> ToolCall:
    return ToolCall(
        run_id=run, tree_id="t", task_id=run, tool="echo", tool_type="built_in",
        timeout_s=5, max_result_bytes=1000, holds_slot=slot, refills_window=window,
    )  # fmt: skip


def ends(gate: CountingGate, clock: Clock) -> GateEnds:
    return GateEnds(lambda: gate, every_s=EVERY_S, clock=clock)  # type: ignore[arg-type,return-value]


def test_a_run_under_a_cap_gives_its_slot_back_at_once_every_time() -> None:
    gate, clock = CountingGate(), Clock()
    e = ends(gate, clock)
    for run in ("r1", "r2", "r3"):
        e.ended(call(run, slot=True))
    assert gate.runs == [["r1"], ["r2"], ["r3"]]


def test_ends_refilling_a_window_within_the_interval_share_one_gate_run() -> None:
    gate, clock = CountingGate(), Clock()
    e = ends(gate, clock)
    e.ended(call("r1", window=True))  # the first: at once
    assert gate.runs == [[]]
    gate.ran.clear()
    for run in ("r2", "r3", "r4"):
        clock.now += EVERY_S / 10
        e.ended(call(run, window=True))
    assert gate.runs == [[]]  # not yet: a timer runs it for the three
    assert gate.ran.wait(10)
    assert gate.runs == [[], []]
    clock.now += EVERY_S * 2
    e.ended(call("r5", window=True))  # the interval is over: at once again
    assert gate.runs == [[], [], []]


def test_a_slot_given_back_serves_a_waiting_refill_and_the_timer_runs_once_more_at_most() -> None:
    gate, clock = CountingGate(), Clock()
    e = ends(gate, clock)
    e.ended(call("r1", window=True))
    clock.now += EVERY_S / 10
    gate.ran.clear()
    e.ended(call("r2", window=True))  # waits for the timer
    e.ended(call("r3", slot=True, window=True))  # at once
    assert gate.runs[:2] == [[], ["r3"]]
    assert gate.ran.wait(10)
    threading.Event().wait(EVERY_S * 3)
    assert len(gate.runs) <= 3


def test_a_run_the_gate_did_not_admit_runs_nothing() -> None:
    gate, clock = CountingGate(), Clock()
    ends(gate, clock).ended(call("r1"))
    assert gate.runs == []


def test_a_gate_that_cannot_be_reached_is_logged_and_the_run_still_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gate, clock = CountingGate(fail=True), Clock()
    e = ends(gate, clock)
    e.ended(call("r1", slot=True))
    clock.now += EVERY_S * 2
    e.ended(call("r2", window=True))
    assert "could not give back the gate slot of run r1" in caplog.text
    assert "the brain's gate timer does" in caplog.text


@pytest.mark.parametrize(
    ("limits", "window", "slot", "refills"),
    [
        ((), 32, False, True),  # fair share on, no cap: a window place
        (("cap",), 0, True, False),  # a cap: a slot
        (("cap",), 32, True, True),  # both
        (("rate",), 0, False, False),  # a rate limit only: the gate timer admits
    ],
)
def test_what_a_lane_tells_its_calls_to_give_back(
    limits: tuple[str, ...], window: int, slot: bool, refills: bool
) -> None:
    applied = tuple(
        AppliedLimit("tool", "x", None, 2) if kind == "cap" else AppliedLimit("tool", "x", "5/s", None)
        for kind in limits
    )
    lane = Lane("l1", None, "ada", applied, window=window)
    assert (lane.holds_slot, lane.refills_window) == (slot, refills)


def test_a_call_says_it_refills_a_window_only_when_it_does() -> None:
    # Sent only when true: an older pool (ToolCall forbids unknown fields) parses every other call.
    assert "refills_window" not in call("r1").model_dump(mode="json")
    assert call("r1", window=True).model_dump(mode="json")["refills_window"] is True
    assert ToolCall.model_validate(call("r1", window=True).model_dump(mode="json")).refills_window


def test_on_a_real_gate_a_window_emptied_by_ends_of_the_moment_is_refilled_once(
    redis_client: redis.Redis,
) -> None:
    gate = Gate(redis_client)
    at = Lane(lane_id(None, "ada", ()), None, "ada", (), window=2)
    gate.enqueue([Waiting(f"r{i}", at, 60_000) for i in range(6)])
    for i in range(6):
        redis_client.lpush(INBOX_PREFIX + at.queue, json.dumps({"headers": {"id": f"r{i}"}, "body": ""}))
    assert gate.admit().count == 2
    e = GateEnds(lambda: gate, every_s=EVERY_S)
    e.ended(call("warm", window=True))  # this process's first end runs the gate at once
    for _ in range(2):  # a worker takes both queued calls and ends them
        raw = redis_client.rpop(pool_queue(None))
        assert raw is not None
        e.ended(call(json.loads(raw)["headers"]["id"], window=True))
    assert redis_client.llen(pool_queue(None)) == 0  # the timer has not run yet
    deadline = threading.Event()
    for _ in range(200):
        if redis_client.llen(pool_queue(None)) == 2:
            break
        deadline.wait(0.05)
    assert redis_client.llen(pool_queue(None)) == 2  # one gate run refilled the window
    assert redis_client.hlen(key_gate_waiting()) == 2
