"""Calls waiting at the gate, shown in Flower as THROTTLED (layer: brain/runtime; a thread of the brain).

Flower hears of a server call when it is sent (``task-sent``, ``brain.runtime.dispatch``) and
when a pool worker takes it (``task-received``). A call that waits at the gate in between
(``brain.hot.gate``) gets one ``task-throttled`` event here, with ``throttled_by``: the limit
that holds its lane, worded as ``status --queues`` words it (``rate_limit 5/s of tool
http_get``, ``paused by HTTP 429 from server jira (Retry-After 2s)``, ``queue_window 32 of pool
default``). ``brain.flowerapp`` ranks THROTTLED as PENDING, so the worker's events replace it.

Nothing is added to sending a call: a pass reads the gate's waiting runs (HSCAN, in chunks)
and reports those seen waiting on two passes in a row and not reported yet
(``brain.core.throttle_watch``), their events in one ``task.multi`` message per chunk. One brain
of several does it (``keep_turn``). A pass over many waiting runs takes longer, and the next
waits longer in proportion (``CPU_SHARE``), so with 100,000 calls at the gate the thread
still costs the brain ~2 % of a core, and a call is shown throttled a few seconds later.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import redis
from celery import Celery

from brain.core.throttle_watch import ThrottleWatch
from brain.hot.gate import Gate
from brain.hot.turns import holder_name, keep_turn
from brain.runtime.dispatch import send_task_events
from workers.contracts import KEY_NS, TASK_THROTTLED_EVENT

log = logging.getLogger("vancetope.brain")

# The fastest a pass comes round: a call waiting ~1-2 s is shown THROTTLED.
PASS_S = 1.0
# Runs read per HSCAN and reported per message.
CHUNK = 1000
# The most of a core a pass may take: the next pass waits at least its length / CPU_SHARE.
CPU_SHARE = 0.02
TURN_KEY = f"{KEY_NS}flower:throttled"


class ThrottleReporter:
    """One pass at a time (``report_once``); ``run_throttle_events`` calls it in a thread."""

    def __init__(self, r: redis.Redis, app: Celery) -> None:
        self.gate = Gate(r)
        self.app = app
        self.watch = ThrottleWatch()
        self.holder = holder_name()

    def report_once(self, lease_s: float) -> int:
        """Report the calls newly seen waiting (if this brain holds the turn, for ``lease_s``);
        how many were reported."""
        if not keep_turn(self.gate.r, TURN_KEY, self.holder, lease_s):
            self.watch.reset()  # another brain reports; on taking over, start afresh
            return 0
        lanes: dict[str, str] = {}
        for chunk in self.gate.waiting_runs(CHUNK):
            lanes.update(chunk)
        due = self.watch.due(lanes.keys())
        for i in range(0, len(due), CHUNK):
            runs = due[i : i + CHUNK]
            why = self.gate.lanes_why(lanes[run] for run in runs)
            now = time.time()
            self._send([{"uuid": run, "throttled_by": why[lanes[run]], "timestamp": now} for run in runs])
        return len(due)

    def _send(self, events: list[dict[str, Any]]) -> None:
        send_task_events(self.app, TASK_THROTTLED_EVENT, events)  # best effort: the calls still wait


def next_pass_in(elapsed_s: float) -> float:
    """How long to wait after a pass that took ``elapsed_s``: ``PASS_S``, longer after a long pass."""
    return max(PASS_S, elapsed_s / CPU_SHARE)


def run_throttle_events(r: redis.Redis, app: Celery, stop: threading.Event) -> threading.Thread:
    """Report calls waiting at the gate to Flower until ``stop`` is set (``r``: the brain's hot
    state client, shared: this thread sends no blocking command)."""

    def loop() -> None:
        reporter = ThrottleReporter(r, app)
        wait = PASS_S
        while not stop.wait(wait):
            started = time.monotonic()
            try:
                # Held across the wait to the next pass, with room to spare.
                reporter.report_once(lease_s=3 * wait)
            except Exception:
                log.exception("reporting throttled calls to Flower failed; trying again")
            wait = next_pass_in(time.monotonic() - started)

    thread = threading.Thread(target=loop, name="vancetope-throttled", daemon=True)
    thread.start()
    return thread
