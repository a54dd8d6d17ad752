"""Admit rate-limited calls when their budget frees up (layer: brain/runtime; a thread of the brain).

The process that puts calls at the gate runs it once (``Publisher.batch``), and a server worker
whose run gave back a slot or a place in a queue window runs it again (``InlineRecorder.end``,
``brain.runtime.gate_ends``); what neither can do is wait for a rate limit's next token. This
thread does: it runs the gate when the soonest blocked lane may go (the script says when, from
Redis's clock), and otherwise blocks on the gate's wake list, which every process that puts
calls at the gate pushes to. Nothing waiting: one BLPOP every
``IDLE_S``, no polling. Several brains may run it: the script is atomic, a call is admitted once.
"""

from __future__ import annotations

import logging
import threading

from brain.hot.gate import Gate
from workers.redis_connect import redis_client

log = logging.getLogger("vancetope.brain")

# The longest this thread blocks without looking: a backstop for a wake that was lost (a
# process that died between writing a call and waking it) and for a lease that expired.
IDLE_S = 2.0
# A wait shorter than this is slept here, not in BLPOP: Redis (6.2, hz 10) ends a blocked
# command's timeout only on its 100 ms cron tick, so a 50 ms wait took 100-300 ms and a
# 20/s limit admitted 7/s on a busy machine. A call put at the gate meanwhile loses nothing:
# the process that put it there ran the gate itself.
SHORT_S = 0.5


def run_gate_timer(redis_url: str, stop: threading.Event) -> threading.Thread:
    """Run the gate whenever something may be admitted, until ``stop`` is set."""

    def loop() -> None:
        # A connection of its own: BLPOP holds it while it waits.
        r = redis_client(redis_url, socket_timeout=IDLE_S + 10)
        gate = Gate(r)
        try:
            while not stop.is_set():
                try:
                    admitted = gate.admit(wake=False)
                    wait = IDLE_S if admitted.wait_s is None else min(admitted.wait_s, IDLE_S)
                    if 0 < wait < SHORT_S:
                        stop.wait(wait)
                    elif wait > 0:
                        gate.wait_for_wake(wait)
                except Exception:
                    log.exception("the gate timer failed; trying again")
                    stop.wait(1.0)
        finally:
            r.close()

    thread = threading.Thread(target=loop, name="vancetope-gate", daemon=True)
    thread.start()
    return thread
