"""Which calls at the gate to show as throttled in Flower (layer: brain/core; pure logic).

Flower hears of a server call when it is sent; a call that then waits at the gate
(``brain.hot.gate``) gets one ``task-throttled`` event more (``brain.runtime.throttle_events``).
A call the gate admits at once (the process that wrote it runs the gate right after) is not
throttled: only a run seen waiting on two passes in a row is reported, and each run once.
"""

from __future__ import annotations

from collections.abc import Collection


class ThrottleWatch:
    """Remembers the runs seen waiting on the last pass and those already reported."""

    def __init__(self) -> None:
        self._seen: frozenset[str] = frozenset()
        self._reported: set[str] = set()

    def due(self, waiting: Collection[str]) -> list[str]:
        """The runs waiting now (``waiting``: every run at the gate) to report now: waiting on
        the last pass too, not reported yet. A run no longer waiting is forgotten."""
        now = frozenset(waiting)
        due = sorted(run for run in now & self._seen if run not in self._reported)
        self._reported.intersection_update(now)
        self._reported.update(due)
        self._seen = now
        return due

    def reset(self) -> None:
        """Forget everything (another brain reports now; on taking the turn back, a run still
        waiting is reported again: Flower shows the same state twice, never a wrong one)."""
        self._seen = frozenset()
        self._reported = set()
