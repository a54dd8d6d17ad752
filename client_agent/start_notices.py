"""Tell the brain a call began, once it has run long enough to be seen (layer: client_agent).

The brain records a client call ``running`` when the agent says it began (``ClientToolStarted``).
Each such notice costs the brain's relay a message: a parse, a store compare-and-set, a wake-up
of the tree's watchers and a Flower event. Most client calls (a file read, a git status) end in
a few milliseconds, and their notice then reached the relay just ahead of their result, holding
the result up while the relay handled it: on loopback ~8 % of every call's round trip.

So a notice is sent only for a call still running ``DELAY_S`` after it began, on a thread of its
own, never on the call's path. A quicker call goes from ``queued_client`` straight to its result,
as an older agent's calls always did (the brain accepts a result from either state); a live view
redraws every 0.2 s (``brain.cli.watch.REDRAW_EVERY_S``), so it could hardly have shown it
running anyway. A notice that crosses its call's result is harmless: the brain moves only a call
still ``queued_client`` of that very run, and sends Flower no start after an end.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from workers.contracts import ToolStarted

log = logging.getLogger("vancetope.agent")

# A call shorter than this is never said to be running: one live-view redraw.
DELAY_S = 0.2


class StartNotices:
    """``begun`` a run, ``ended`` it; ``send`` is called for each run not ended within ``delay_s``."""

    def __init__(self, send: Callable[[ToolStarted], None], delay_s: float = DELAY_S) -> None:
        self._send = send
        self.delay_s = delay_s
        self._due: dict[str, tuple[float, ToolStarted]] = {}
        self._wake = threading.Condition()
        self._stopped = False
        self._thread: threading.Thread | None = None

    def begun(self, started: ToolStarted) -> None:
        with self._wake:
            if self._stopped:
                return
            self._due[started.run_id] = (time.monotonic() + self.delay_s, started)
            if self._thread is None:
                # Started at the first call, not at construction: an agent that never runs one has no thread.
                self._thread = threading.Thread(target=self._loop, name="vancetope-started", daemon=True)
                self._thread.start()
            self._wake.notify()

    def ended(self, run_id: str) -> None:
        with self._wake:
            self._due.pop(run_id, None)

    def close(self) -> None:
        with self._wake:
            self._stopped = True
            self._due.clear()
            self._wake.notify()

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._stopped:
                    now = time.monotonic()
                    due = [run for run, (at, _) in self._due.items() if at <= now]
                    if due:
                        break
                    nearest = min((at for at, _ in self._due.values()), default=None)
                    self._wake.wait(None if nearest is None else nearest - now)
                if self._stopped:
                    return
                notices = [self._due.pop(run)[1] for run in due]
            for started in notices:
                try:
                    self._send(started)
                except Exception as exc:  # noqa: BLE001 - a lost notice leaves the call queued until its result
                    log.warning(
                        "could not say run %s began (%s); it shows queued until its result",
                        started.run_id,
                        exc,
                    )
