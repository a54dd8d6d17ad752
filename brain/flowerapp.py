"""The Celery app module Flower is started with (layer: brain, Flower glue):
``celery -A brain.flowerapp flower``. It is the server pool's app, plus two changes to Flower.

Flower's ``/api/workers`` answers from ``inspect`` broadcasts only, and client agents run
with remote control off (DESIGN.md decision 7), so it omitted them while the dashboard,
built from events, listed them (the brain sends their worker events, ``brain.events``).
Here ``/api/workers`` also lists each worker the dashboard shows that did not answer
``inspect``, with the fields the dashboard has for it and ``"source": "events"``. Workers
that answered ``inspect`` are listed exactly as Flower lists them.

The change replaces one entry of Flower's URL table before Flower builds its application
(the ``celery -A`` module is imported first). If a Flower release moves that entry, the
change is skipped with an error in Flower's log and Flower runs as released;
``tests/unit/brain/test_flowerapp.py`` fails on such a release.

Flower stops on SIGTERM by raising SystemExit in its main thread and letting the interpreter
exit. With Redis gone (stopped first, or gone with a stack that was killed) it never did:
exiting joins Flower's executor threads, and one of them retries its ``enable_events``
broadcast for ever (seen every time: still running 30 s after SIGTERM). Nor did it when the
SystemExit landed in a weakref callback, which swallows it (seen in CI). So SIGTERM still
takes Flower's clean way out, and ``EXIT_GRACE_S`` later ends the process if that way hangs.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from types import FrameType
from typing import Any

from flower import command as flower_command
from flower import urls
from flower.api import workers as flower_workers
from tornado import web

from workers.server_worker import app

log = logging.getLogger("vancetope.flower")

WORKERS_API = r"/api/workers"
# Flower has no work to finish on its way out (it keeps no state on disk here).
EXIT_GRACE_S = 5.0
_flower_sigterm = flower_command.sigterm_handler


def event_workers(state: Any) -> dict[str, dict[str, Any]]:
    """The workers the dashboard lists, as it lists them: Flower's per-worker task counters,
    the event state's worker fields, ``status`` (alive)."""
    listed = {}
    for name, counts in state.counter.items():
        worker = state.workers.get(name)
        if worker is None:
            continue
        fields = {key: getattr(worker, key) for key in worker._fields}
        listed[name] = {**counts, **fields, "status": worker.alive, "source": "events"}
    return listed


class ListWorkers(flower_workers.ListWorkers):
    """Flower's ``/api/workers`` with the workers known from events only."""

    _from_events: dict[str, dict[str, Any]] | None = None  # set per request by get()

    @web.authenticated
    async def get(self) -> None:
        if self.get_argument("status", default=False, type=bool):
            await super().get()  # already built from events: every worker is there
            return
        name = self.get_argument("workername", default=None)
        known = event_workers(self.application.events.state)
        if name is not None:
            if name in known and name not in self.application.workers:
                self.write({name: known[name]})  # Flower itself would answer 404
                return
            known = {}
        self._from_events = known
        await super().get()

    def write(self, chunk: Any) -> None:
        # Flower's get() ends by writing its {name: info} dict: add the missing workers to it.
        if isinstance(chunk, dict) and self._from_events:
            chunk = {**{k: v for k, v in self._from_events.items() if k not in chunk}, **chunk}
            self._from_events = {}
        super().write(chunk)


def install() -> bool:
    """Serve ``/api/workers`` with ``ListWorkers``; False (and logged) if Flower's table changed."""
    for i, handler in enumerate(urls.handlers):
        if isinstance(handler, tuple) and handler[0] == WORKERS_API:
            if handler[1] not in (flower_workers.ListWorkers, ListWorkers):
                break
            urls.handlers[i] = (WORKERS_API, ListWorkers)
            return True
    log.error(
        "this Flower release serves %s differently; client agents are missing from it "
        "(the dashboard still shows them). Install the Flower version pyproject.toml names.",
        WORKERS_API,
    )
    return False


def exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    """Flower's SIGTERM handler, with a timer that ends the process if its exit hangs."""
    timer = threading.Timer(EXIT_GRACE_S, os._exit, args=(0,))
    timer.daemon = True
    timer.start()
    _flower_sigterm(signum, frame)


def install_exit() -> None:
    """Flower's command installs ``flower.command.sigterm_handler`` when it starts, after the
    ``-A`` module is imported: it installs this one instead."""
    flower_command.sigterm_handler = exit_on_sigterm
    if signal.getsignal(signal.SIGTERM) is _flower_sigterm:  # already installed
        signal.signal(signal.SIGTERM, exit_on_sigterm)


install()
install_exit()

__all__ = ["EXIT_GRACE_S", "ListWorkers", "app", "exit_on_sigterm", "install", "install_exit"]
