"""Calls the brain ended before a worker began them, shown in Flower as REVOKED (layer:
brain/runtime; Celery glue).

Flower hears of a server call when it is sent (``task-sent``, ``brain.runtime.dispatch``),
while it waits at the gate (``task-throttled``, ``brain.runtime.throttle_events``), and from
the worker that takes it. A call the brain ends before any worker began it (its tree
cancelled, its ``max_total_s`` past while it waited at the gate or in its queue) has no worker
to say so, and Flower kept it THROTTLED or sent for ever. The brain sends Celery's own
``task-revoked`` for it (``brain.core.revoked``): a server call's as one ``task.multi`` per
``CHUNK`` (as the brain sends ``task-sent``), a client's through ``ClientEvents`` under its
agent's name (as its other events). So is a failed attempt shown RETRY whose task was then
cancelled or expired while it waited for its next attempt (a new run): REVOKED, not RETRY for
ever. A run begun by a worker or agent that went away, sent again as a new run, is told
failed (``WorkerLostError``, as Celery tells of a worker process that died), not left
STARTED. Best effort, and none with ``task_events`` off.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from celery import Celery

from brain.core.revoked import by_destination, lost_fields, revoked_fields
from brain.runtime.dispatch import send_task_events
from brain.runtime.events import ClientEvents
from workers.contracts import TASK_FAILED_EVENT, TASK_REVOKED_EVENT

# Events per message: a 100,000-call tree cancelled is 100 messages of a few tens of KB.
CHUNK = 1000


class RevokedEvents:
    """Tells Flower of calls ended unrun; ``client_events`` carries a client's (None: not wired,
    a client's call is then not told)."""

    def __init__(self, app: Celery, client_events: ClientEvents | None, *, task_events: bool = True) -> None:
        self.app = app
        self.client_events = client_events
        self.task_events = task_events  # Settings.task_events: off, Flower lists no tasks

    def unrun(self, runs: Iterable[tuple[str | None, str | None]], *, expired: bool) -> None:
        """``task-revoked`` for each ``(run id, client id)`` the brain ended before a worker or
        agent began it, or while Flower showed its failed attempt RETRY; ``expired``: its time
        limit ended it, not a cancel."""
        self._tell(runs, TASK_REVOKED_EVENT, revoked_fields(expired=expired))

    def lost(self, runs: Iterable[tuple[str | None, str | None]], why: str) -> None:
        """``task-failed`` (``WorkerLostError``) for each ``(run id, client id)`` begun by a
        worker or agent that went away, which the brain sends again as a new run (or gives up):
        no one else will end it, and Flower showed it STARTED for ever."""
        self._tell(runs, TASK_FAILED_EVENT, lost_fields(why))

    def _tell(
        self, runs: Iterable[tuple[str | None, str | None]], event: str, fields: dict[str, Any]
    ) -> None:
        if not self.task_events:
            return
        server, clients = by_destination(runs)
        if self.client_events is not None:
            for client_id, run_ids in clients.items():
                for run_id in run_ids:
                    self.client_events.task_ended_by_brain(client_id, run_id, event, fields)
        now = time.time()
        for i in range(0, len(server), CHUNK):
            events = [{"uuid": run, **fields, "timestamp": now} for run in server[i : i + CHUNK]]
            send_task_events(self.app, event, events)
