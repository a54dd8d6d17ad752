"""Run the gate when a server worker's runs end (layer: brain/runtime; the server pool).

A run the gate admitted gives something back when it ends (docs/fair-share.md,
``ToolCall.holds_slot``): a slot under a ``max_concurrency`` cap, or a place in its pool's
queue window (fair share on; ``ToolCall.refills_window`` when that is all it holds). Either way
the gate must run again for the next call to go. A slot goes back at once: the capped tool's
next call waits for it. A window place need not: the pool's queue still holds the rest of the
window, so the ends of one process within ``REFILL_EVERY_S`` share one run of the gate, at most
that long after the first of them. One gate run per task (a Redis round trip, ~60 us of a pool
child's CPU here, and the script) made fair share cost ~1.45x a pool's throughput; shared,
~1.2x (docs/fair-share.md, "What it costs").

A process that exits with a gate run pending (billiard's children leave by ``os._exit``: the
timer goes with them) loses no call, only time: the next end of any run, a new call put at the
gate or the brain's gate timer (``brain.runtime.gate_timer``, within 2 s) runs it instead.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Final

from brain.hot.gate import Gate
from workers.contracts import ToolCall

log = logging.getLogger("vancetope.worker")

# The longest a window place waits for its gate run: at 800 tasks/s a pool's queue gives out
# about 16 calls meanwhile, half a window of 32 (``queue_window = 32``, docs/fair-share.md).
REFILL_EVERY_S: Final = 0.02


class GateEnds:
    """``ended(call)`` for every run a server worker took (``workers.tasks.register(end=...)``)."""

    def __init__(
        self,
        gate: Callable[[], Gate],
        every_s: float = REFILL_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._gate = gate
        self._every_s = every_s
        self._clock = clock
        self._reset()

    def _reset(self) -> None:
        # Also in a forked child: the parent's timer thread is not there, its lock may be held.
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._last = float("-inf")  # this process's last gate run (clock)
        self._timer: threading.Timer | None = None

    def ended(self, call: ToolCall) -> None:
        if self._pid != os.getpid():
            self._reset()
        if not call.holds_slot:
            return
        if not call.refills_window:  # a slot under a cap (and maybe a window place)
            with self._lock:
                self._last = self._clock()
            self._run(release=[call.run_id])  # a timer armed meanwhile runs once more: harmless
            return
        with self._lock:
            wait = self._last + self._every_s - self._clock()
            if wait > 0 and self._timer is not None:
                return  # the armed timer's run serves this end too
            if wait > 0 and self._arm(wait):
                return
            self._last = self._clock()
        self._run()

    def _arm(self, wait: float) -> bool:
        timer = threading.Timer(wait, self._due)
        timer.daemon = True
        try:
            timer.start()
        except RuntimeError as exc:  # no thread to be had: the gate runs now instead
            log.warning("could not start the gate's refill timer (%s); running the gate now", exc)
            return False
        self._timer = timer
        return True

    def _due(self) -> None:
        with self._lock:
            self._timer = None
            self._last = self._clock()
        self._run()

    def _run(self, release: list[str] | None = None) -> None:
        try:
            self._gate().admit(release=release or ())
        except Exception as exc:  # noqa: BLE001 - the slot's lease, the brain's gate timer
            if release:
                log.warning(
                    "could not give back the gate slot of run %s (%s); its lease frees it", release[0], exc
                )
            else:
                log.warning("could not run the gate after runs ended (%s); the brain's gate timer does", exc)
