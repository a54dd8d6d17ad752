"""workers.call_stop: how a worker waits on a running call and gives it up when its task is
cancelled. Pure: a fake clock, a call that "finishes" when told."""

from __future__ import annotations

import pytest

from workers.call_stop import Waited, wait_unless_stopped


class FakeCall:
    """``done(seconds)`` advances a fake clock by the seconds waited, or to ``ends_at``."""

    def __init__(self, ends_at: float) -> None:
        self.now = 0.0
        self.ends_at = ends_at
        self.waits: list[float] = []

    def clock(self) -> float:
        return self.now

    def done(self, seconds: float) -> bool:
        self.waits.append(seconds)
        if self.now + seconds >= self.ends_at:
            self.now = max(self.now, self.ends_at)
            return True
        self.now += seconds
        return False


def test_a_call_that_ends_within_its_first_wait_never_asks() -> None:
    call, asks = FakeCall(ends_at=0.3), []
    assert wait_unless_stopped(call.done, 60, lambda: asks.append(1) or True, clock=call.clock) is Waited.DONE
    assert asks == [] and call.waits == [1.0]


def test_a_cancelled_call_is_given_up_at_the_first_ask_that_finds_it() -> None:
    call, answers = FakeCall(ends_at=3600), iter([False, False, True])
    waited = wait_unless_stopped(call.done, 3600, lambda: next(answers), clock=call.clock)
    assert waited is Waited.STOPPED
    assert call.now == 3.0  # three waits of a second, an ask after each


def test_the_timeout_still_bounds_a_call_nobody_cancelled() -> None:
    call = FakeCall(ends_at=3600)
    assert wait_unless_stopped(call.done, 2.5, lambda: False, clock=call.clock) is Waited.TIMED_OUT
    assert call.waits == [1.0, 1.0, 0.5]


def test_an_ask_that_fails_is_not_a_cancel_the_call_runs_on() -> None:
    def unreachable() -> bool:
        raise ConnectionError("Redis is away")

    call = FakeCall(ends_at=2.2)
    assert wait_unless_stopped(call.done, 60, unreachable, clock=call.clock) is Waited.DONE


@pytest.mark.parametrize("ends_at, expected", [(5.0, Waited.DONE), (500.0, Waited.TIMED_OUT)])
def test_without_an_ask_it_is_one_wait_of_the_whole_timeout(ends_at: float, expected: Waited) -> None:
    call = FakeCall(ends_at=ends_at)
    assert wait_unless_stopped(call.done, 60, None, clock=call.clock) is expected
    assert call.waits == [60]
