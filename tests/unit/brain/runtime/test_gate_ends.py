"""Running the gate when a server worker's runs end (brain.runtime.gate_ends): a slot under a
cap goes back at once, a place in a queue window with the worker's other ends of the moment.
The gate here only counts its runs; the clock is the test's. The timer's own wait is real: the
tests wait for its run, and an interval of a second keeps "not yet" true on a busy box; none
asserts how soon anything came."""

from __future__ import annotations

import json
import os
import select
import signal
import threading
from typing import Any

import pytest
import redis

from brain.core.fairshare import AppliedLimit, lane_id, user_limit
from brain.hot.gate import INBOX_PREFIX, Admitted, Gate, Lane, Waiting
from brain.runtime import gate_ends
from brain.runtime.gate_ends import GateEnds
from workers.contracts import ToolCall, ToolType, key_gate_waiting, pool_queue

EVERY_S = 1.0


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

    def next_run(self) -> None:
        """Wait for the gate's next run (the timer's)."""
        assert self.ran.wait(30), "the refill timer never ran the gate"
        self.ran.clear()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def call(run: str, *, slot: bool = False, window: bool = False) -> ToolCall:
    """A call as the pool worker sees it: a window place is a holds_slot call whose message's
    header said it refills a window only (workers.tasks.run_tool)."""
    return ToolCall(
        run_id=run, tree_id="t", task_id=run, tool="echo", tool_type=ToolType.BUILT_IN, timeout_s=5,
        max_result_bytes=1000, holds_slot=slot or window, refills_window=window and not slot,
    )  # fmt: skip


def ends(gate: CountingGate, clock: Clock) -> GateEnds:
    return GateEnds(lambda: gate, every_s=EVERY_S, clock=clock)  # type: ignore[arg-type,return-value]


def test_a_run_under_a_cap_gives_its_slot_back_at_once_every_time() -> None:
    gate, clock = CountingGate(), Clock()
    e = ends(gate, clock)
    for run in ("r1", "r2", "r3"):
        e.ended(call(run, slot=True))
    assert gate.runs == [["r1"], ["r2"], ["r3"]]


def test_ends_refilling_a_window_within_the_interval_share_one_gate_run_burst_after_burst() -> None:
    gate, clock = CountingGate(), Clock()
    e = ends(gate, clock)
    e.ended(call("r1", window=True))  # the first: at once
    assert gate.runs == [[]]
    gate.ran.clear()
    for burst in range(2):  # a timer that ran must be armed again for the next burst
        for run in ("a", "b", "c"):
            clock.now += EVERY_S / 100
            e.ended(call(f"{run}{burst}", window=True))
        assert len(gate.runs) == 1 + burst  # not yet: a timer runs it for the three
        gate.next_run()
        assert gate.runs == [[]] * (2 + burst)
    clock.now += EVERY_S * 2
    e.ended(call("r5", window=True))  # the interval is over: at once again
    assert gate.runs == [[]] * 4


def test_a_slot_given_back_serves_a_waiting_refill_and_the_timer_runs_once_more_at_most() -> None:
    gate, clock = CountingGate(), Clock()
    e = ends(gate, clock)
    e.ended(call("r1", window=True))
    clock.now += EVERY_S / 100
    gate.ran.clear()
    e.ended(call("r2", window=True))  # waits for the timer
    e.ended(call("r3", slot=True))  # at once
    assert gate.runs == [[], ["r3"]]
    gate.ran.clear()
    gate.next_run()
    assert gate.runs == [[], ["r3"], []]


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


def test_no_thread_for_the_timer_runs_the_gate_at_once_and_the_next_end_tries_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gate, clock = CountingGate(), Clock()
    e = ends(gate, clock)
    e.ended(call("r1", window=True))
    real_timer = threading.Timer

    class NoThread(real_timer):  # type: ignore[misc,valid-type]
        def start(self) -> None:
            raise RuntimeError("can't start new thread")

    monkeypatch.setattr(gate_ends.threading, "Timer", NoThread)
    clock.now += EVERY_S / 100
    e.ended(call("r2", window=True))
    assert gate.runs == [[], []]  # at once instead
    monkeypatch.setattr(gate_ends.threading, "Timer", real_timer)
    clock.now += EVERY_S / 100
    gate.ran.clear()
    e.ended(call("r3", window=True))
    assert gate.runs == [[], []]  # a timer again
    gate.next_run()
    assert len(gate.runs) == 3


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork: a prefork pool's children")
def test_a_forked_child_arms_a_timer_of_its_own() -> None:
    # The parent armed a timer and holds its lock at the fork: the child (a prefork pool's) has
    # neither the timer's thread nor a lock it could take, and must still refill.
    gate, clock = CountingGate(), Clock()
    e = ends(gate, clock)
    e.ended(call("r1", window=True))
    clock.now += EVERY_S / 100
    e.ended(call("r2", window=True))  # the parent's timer, armed
    read, write = os.pipe()
    with e._lock:  # held across the fork, as another thread of the parent might
        pid = os.fork()
    if pid == 0:  # the child: its gate runs are counted afresh
        try:
            gate.runs.clear()
            gate.ran.clear()
            e.ended(call("c1", window=True))  # a fresh process: the first end, at once
            clock.now += EVERY_S / 100
            e.ended(call("c2", window=True))  # its own timer
            ok = gate.ran.wait(30) and len(gate.runs) == 1
            gate.ran.clear()
            ok = ok and gate.ran.wait(30) and len(gate.runs) == 2
            os.write(write, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(write)
    try:
        answered, _, _ = select.select([read], [], [], 60)
        if not answered:  # the child hangs on the parent's lock
            os.kill(pid, signal.SIGKILL)
        assert answered and os.read(read, 1) == b"1"
    finally:
        os.waitpid(pid, 0)
        os.close(read)


@pytest.mark.parametrize(
    ("limits", "window", "runs_gate", "coalesced"),
    [
        ((), 32, True, True),  # fair share on, no cap: a window place only
        (("cap",), 0, True, False),  # a cap: a slot
        (("cap",), 32, True, False),  # both: the slot goes back at once
        (("user",), 32, True, False),  # max_in_flight_per_user is a cap too
        (("rate",), 0, False, False),  # a rate limit only: the gate timer admits
    ],
)
def test_what_a_lane_tells_its_calls_to_give_back(
    limits: tuple[str, ...], window: int, runs_gate: bool, coalesced: bool
) -> None:
    kinds = {
        "cap": AppliedLimit("tool", "x", None, 2),
        "rate": AppliedLimit("tool", "x", "5/s", None),
        "user": user_limit(None, "ada", 200),
    }
    lane = Lane("l1", None, "ada", tuple(kinds[k] for k in limits), window=window)
    assert (lane.holds_slot, lane.refills_window) == (runs_gate, coalesced)


def test_a_call_never_says_in_its_body_that_it_refills_a_window() -> None:
    # A header says it (workers.contracts.REFILLS_WINDOW_HEADER): an older pool, whose ToolCall
    # forbids unknown fields, would refuse the call; it ignores a header it does not know.
    body = call("r1", window=True).model_dump(mode="json")
    assert "refills_window" not in body
    assert body["holds_slot"] is True
    assert ToolCall.model_validate(body).refills_window is False


def test_on_a_real_gate_a_window_emptied_by_ends_of_the_moment_is_refilled_once(
    redis_client: redis.Redis,
) -> None:
    gate = Gate(redis_client)
    at = Lane(lane_id(None, "ada", ()), None, "ada", (), window=2)
    gate.enqueue([Waiting(f"r{i}", at, 60_000) for i in range(6)])
    for i in range(6):
        redis_client.lpush(INBOX_PREFIX + at.queue, json.dumps({"headers": {"id": f"r{i}"}, "body": ""}))
    assert gate.admit().count == 2
    ran = threading.Event()

    def counted() -> Gate:
        ran.set()
        return gate

    e = GateEnds(counted, every_s=EVERY_S)
    e.ended(call("warm", window=True))  # this process's first end runs the gate at once
    ran.clear()
    for _ in range(2):  # a worker takes both queued calls and ends them
        raw = redis_client.rpop(pool_queue(None))
        assert isinstance(raw, bytes)
        e.ended(call(json.loads(raw)["headers"]["id"], window=True))
    assert redis_client.llen(pool_queue(None)) == 0  # the timer has not run yet
    assert ran.wait(30)
    for _ in range(600):  # its gate run may still be on its way
        if redis_client.llen(pool_queue(None)) == 2:
            break
        threading.Event().wait(0.05)
    assert redis_client.llen(pool_queue(None)) == 2  # one gate run refilled the window
    assert redis_client.hlen(key_gate_waiting()) == 2
