"""Which ended calls Flower is told were revoked, and what it is told (layer: brain/core; pure).

A call the brain ends before a worker or agent began it (its tree cancelled, its ``max_total_s``
past while it waited at the gate or in its queue) has no worker left to tell Flower, which
kept showing it THROTTLED or sent. The brain sends Celery's own ``task-revoked`` for it, with
the fields a Celery worker sends (``celery.worker.request``): ``brain.runtime.revoked``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def revoked_fields(*, expired: bool) -> dict[str, Any]:
    """A ``task-revoked`` event's fields but its run id and time, as a Celery worker sends them:
    not terminated (it never ran), no signal, ``expired`` when its time limit ended it."""
    return {"terminated": False, "signum": None, "expired": expired}


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
