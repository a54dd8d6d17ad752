"""Which ended calls Flower is told were revoked, and what it is told (layer: brain/core; pure).

A call the brain ends before a worker or agent began it (its tree cancelled, its ``max_total_s``
past while it waited at the gate or in its queue) has no worker left to tell Flower, which
kept showing it THROTTLED or sent. The brain sends Celery's own ``task-revoked`` for it, with
the fields a Celery worker sends (``celery.worker.request``): ``brain.runtime.revoked``.
A run begun whose worker or agent went away, sent again as a new run, was left STARTED: it is
told failed, as Celery tells of a task whose worker process died (``lost_fields``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def revoked_fields(*, expired: bool) -> dict[str, Any]:
    """A ``task-revoked`` event's fields but its run id and time, as a Celery worker sends them:
    not terminated (it never ran), no signal, ``expired`` when its time limit ended it."""
    return {"terminated": False, "signum": None, "expired": expired}


# Marks the brain's ``task-failed`` for a lost run: Flower (brain.flowerapp) then keeps its
# sender, the brain, off the worker list and the task's worker as it was, as for ``task-revoked``.
LOST_MARK = "worker_lost"


def lost_fields(why: str) -> dict[str, Any]:
    """A ``task-failed`` event's fields but its run id and time, for a run whose worker or
    agent went away mid-call and that the brain sends again as a new run: what a Celery worker
    sends for a task whose process died under it and that is not delivered again under its own
    id (``Request.on_failure``, ``WorkerLostError``). ``why`` names who went away, never the
    call's arguments."""
    return {"exception": f"WorkerLostError({why!r})", "traceback": "", LOST_MARK: True}


def by_destination(runs: Iterable[tuple[str | None, str | None]]) -> tuple[list[str], dict[str, list[str]]]:
    """``(run id, client id)`` pairs split into the server's run ids (client None) and each
    client's, in order; a pair without a run id (never sent) is left out."""
    server: list[str] = []
    clients: dict[str, list[str]] = {}
    for run_id, client_id in runs:
        if not run_id:
            continue
        if client_id is None:
            server.append(run_id)
        else:
            clients.setdefault(client_id, []).append(run_id)
    return server, clients
