"""Start each retry when it is due (layer: brain/runtime; a thread of the brain).

A failed attempt that its policy covers is recorded ``retrying`` with a time
(``brain.runtime.intake``) and a timer in Redis (``brain.hot.retries``). This thread polls
the timers, a few times a second, and hands each due one to ``Scheduler.retry_due``: no
sleeping worker, no Celery countdown (which would hold the message in a worker's memory,
and lose the wait with that worker). Several brains may run it; each due attempt starts once.
"""

from __future__ import annotations

import logging
import threading

from brain.runtime.scheduler import Scheduler

log = logging.getLogger("vancetope.brain")

# How often the timers are asked when none is due sooner: a retry starts at most this late.
POLL_S = 0.25
_BATCH = 100


def start_due(scheduler: Scheduler) -> int:
    """Start every attempt due now; how many started."""
    started = 0
    while True:
        due = scheduler.retries.take_due(scheduler.clock(), _BATCH)
        for tree_id, task_id in due:
            try:
                started += scheduler.retry_due(tree_id, task_id)
            except Exception:
                # Its store record still says retrying: the reconciler sets its timer again.
                log.exception("could not start the next attempt of task %s of tree %s", task_id, tree_id)
        if len(due) < _BATCH:
            return started


def run_retry_timer(scheduler: Scheduler, stop: threading.Event) -> threading.Thread:
    """Start due retries until ``stop`` is set."""

    def loop() -> None:
        while not stop.wait(POLL_S):
            try:
                start_due(scheduler)
            except Exception:
                log.exception("the retry timer failed; trying again")

    thread = threading.Thread(target=loop, name="vancetope-retries", daemon=True)
    thread.start()
    return thread
