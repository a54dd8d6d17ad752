"""brain.core.second_look: a client run nothing holds is called lost on a second look only."""

from __future__ import annotations

import pytest

from brain.core.second_look import SecondLook, second_look_after_s


@pytest.mark.parametrize(
    ("round_trip_ms", "floor_s", "after_s"),
    [
        (None, 10.0, 0.0),  # a server run, or an agent that says no round trip: one look
        (0.3, 10.0, 10.0),  # loopback: the floor (the reconciler's grace)
        (0.3, 0.2, 1.0),  # never under a second
        (250.0, 1.0, 1.0),
        (400.0, 1.0, 1.6),  # 4 round trips
        (2000.0, 1.0, 8.0),
    ],
)
def test_the_second_look_waits_four_round_trips_and_at_least_the_grace(
    round_trip_ms: float | None, floor_s: float, after_s: float
) -> None:
    assert second_look_after_s(round_trip_ms, floor_s) == pytest.approx(after_s)


def test_a_run_is_lost_only_when_two_looks_far_enough_apart_both_missed_it() -> None:
    look = SecondLook()
    assert look.lost("r1", 200.0, now=100.0) is False  # first look: remembered
    assert look.lost("r1", 200.0, now=100.9) is False  # too soon
    assert look.lost("r1", 200.0, now=101.0) is True
    assert len(look) == 0  # called lost: forgotten


def test_one_look_suffices_without_a_round_trip() -> None:
    look = SecondLook()
    assert look.lost("r1", None, now=0.0) is True
    assert len(look) == 0


def test_a_run_found_held_between_two_looks_starts_over() -> None:
    look = SecondLook()
    assert look.lost("r1", 100.0, now=0.0) is False
    assert look.lost("r2", 100.0, now=0.0) is False
    look.keep_only(["r2"])  # r1 was in the unacked hash at the next sweep
    assert look.lost("r1", 100.0, now=5.0) is False  # a new first look, not a second
    assert look.lost("r2", 100.0, now=5.0) is True
