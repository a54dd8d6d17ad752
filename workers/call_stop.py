"""Stopping a running call whose task was cancelled or expired (layer: workers).

A cancel ends a tree's tasks in the store and adds their runs to the cancelled set that
workers check before they begin a run (``workers.tasks.begin_run``). A call already running
then would hold its worker slot until its tool answered or timed out: minutes for a long MCP
tool, behind which other users' calls wait. So a cancel, and the sweep that expires a task,
also add ``stop_member(run)`` for each run that may be running, and a worker waiting on a call
asks for it every ``STOP_POLL_S`` (one ``SISMEMBER``; a call that ends sooner never asks). It
gives the call up when it is there: a cooperative built-in (``sleep``) is told to stop, a
command is killed, an MCP server is sent ``notifications/cancelled`` (the SDK does it when the
request's task is cancelled), and a built-in that cannot be interrupted is left to end on its
own deadline in its thread, as after a timeout. The slot frees either way.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from enum import Enum

from workers.errors import Cancelled

log = logging.getLogger("vancetope.worker.stop")

# Why a stopped call ended: in its error and in the worker's log line.
WHY_STOPPED = "its task was cancelled or expired while it ran"

# Seconds between two asks of a running call's cancelled set: a cancel stops a call within
# about this long, and a call running for an hour costs 3,600 SISMEMBERs.
STOP_POLL_S = 1.0

# Asked while a call runs: True when its task was cancelled and the call must stop.
Stopped = Callable[[], bool]


class Waited(Enum):
    DONE = "done"
    TIMED_OUT = "timed out"
    STOPPED = "stopped"


def wait_unless_stopped(
    done: Callable[[float], bool],
    timeout: float,
    stopped: Stopped | None,
    poll_s: float = STOP_POLL_S,
    clock: Callable[[], float] = time.monotonic,
) -> Waited:
    """Wait up to ``timeout`` seconds with ``done(seconds)`` (which returns True as soon as the
    call finished), asking ``stopped`` between waits of at most ``poll_s``. A ``stopped`` that
    raises (Redis unreachable) counts as "not stopped": the call runs on, bounded by its timeout."""
    if stopped is None:
        return Waited.DONE if done(max(timeout, 0.0)) else Waited.TIMED_OUT
    deadline = clock() + timeout
    while True:
        left = deadline - clock()
        if done(max(min(left, poll_s), 0.0)):
            return Waited.DONE
        if deadline - clock() <= 0:
            return Waited.TIMED_OUT
        if _asked(stopped):
            return Waited.STOPPED


def _asked(stopped: Stopped) -> bool:
    try:
        return bool(stopped())
    except Exception as exc:  # noqa: BLE001 - an unanswered ask must not fail the call
        log.debug("could not ask whether a running call was cancelled: %s", exc)
        return False


class StopCheck:
    """``stopped`` for one run, remembering whether it ever said stop (``fired``): the pool
    worker then shows the call REVOKED in Flower, as Celery shows a task it terminated, rather
    than FAILURE (a cancel is no failure an operator is paged for)."""

    __slots__ = ("ask", "fired", "run_id")

    def __init__(self, ask: Callable[[str], bool], run_id: str) -> None:
        self.ask = ask
        self.run_id = run_id
        self.fired = False

    def __call__(self) -> bool:
        if self.ask(self.run_id):
            self.fired = True
        return self.fired


def stopped_error(what: str, **data: str) -> Cancelled:
    """The error of a call given up because ``stop_member`` said so; ``what`` names the call."""
    return Cancelled(f"{what} was stopped: {WHY_STOPPED}", **data)
