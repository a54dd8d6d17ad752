"""When a run nothing holds may be called lost (layer: brain/core; pure).

kombu's Redis consumer BRPOPs a message and writes it to its unacked hash one round trip
later. Between the two, a look at the queue and the hash finds the run nowhere. On loopback
that gap is a fraction of a millisecond; between a workstation 100 ms away and Redis it is
at least 200 ms, and a reconciler that re-sent on one look would re-send a call the agent
is already holding, over and over, until the task failed as lost too often.

So a client run whose agent reports its round trip is called lost only when two looks at
least ``max(floor, ROUND_TRIPS_APART × round trip)`` apart both found it nowhere (the floor
is the reconciler's grace, at least ``MIN_SECOND_LOOK_S``). A message moves from the queue
to the hash once, so it is in that gap at both looks only when the agent took longer than
that between the two (a busy event loop on a slow link has taken over a second). Then the
call is re-sent and the agent answers the new run from its memory of recent results
(workers/recent_calls.py): it still runs once. A server run, or a client run whose agent
says no round trip, keeps one look.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

MIN_SECOND_LOOK_S: Final = 1.0
ROUND_TRIPS_APART: Final = 4


def second_look_after_s(round_trip_ms: float | None, floor_s: float = MIN_SECOND_LOOK_S) -> float:
    """How long after the first look the second one must be; 0 when one look suffices."""
    if round_trip_ms is None:
        return 0.0
    return max(MIN_SECOND_LOOK_S, floor_s, ROUND_TRIPS_APART * round_trip_ms / 1000.0)


class SecondLook:
    """Remembers when each run was first found nowhere. Not thread-safe: one sweep at a time."""

    def __init__(self, floor_s: float = MIN_SECOND_LOOK_S) -> None:
        self.floor_s = floor_s
        self._first_missed: dict[str, float] = {}

    def lost(self, run_id: str, round_trip_ms: float | None, now: float) -> bool:
        """Called each time a look finds ``run_id`` nowhere: True once it may be called lost."""
        wait = second_look_after_s(round_trip_ms, self.floor_s)
        if wait == 0.0:
            self._first_missed.pop(run_id, None)
            return True
        first = self._first_missed.setdefault(run_id, now)
        if now - first < wait:
            return False
        del self._first_missed[run_id]
        return True

    def keep_only(self, run_ids: Iterable[str]) -> None:
        """Forget every run not in ``run_ids`` (it was found held, or ended, since)."""
        keep = set(run_ids)
        self._first_missed = {r: t for r, t in self._first_missed.items() if r in keep}

    def __len__(self) -> int:
        return len(self._first_missed)
