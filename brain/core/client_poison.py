"""The poison bound on the client route: a call whose agent keeps going away while it runs
(layer: brain/core; pure).

A server run that kills its worker is counted by its deliveries (``Store.begin_run``; kombu
restores the same run). A client call is not: when its agent dies, restarts or loses its
link, the brain takes the call back (``brain.runtime.clientwork``) and re-routes it as a
new run whose deliveries start afresh, so a tool that kills its agent every time would be
sent again for ever. The task's ``taken_back`` counts those take-backs across the runs of
one attempt (only of calls that were running there: a queued call never started, so it says
nothing of its tool). ``attempt`` cannot be the bound: retries and the reconciler's re-sends
count there too. The attempt given up fails with the server route's ``PoisonTask``, which a
retry policy covering ``unavailable`` retries on either route (``Scheduler.retry_later``):
the next attempt counts its own take-backs from 0, as a new server run counts its own
deliveries.
"""

from __future__ import annotations

from typing import NamedTuple

from workers.contracts import ErrorInfo
from workers.errors import PoisonTask


class TakeBack(NamedTuple):
    """What to do with a running client call its agent left behind: ``taken_back`` is the task's
    ``taken_back`` with this one; ``poison``: fail it instead of re-routing it."""

    taken_back: int
    poison: bool


def running_take_back(taken_back: int, max_deliveries: int) -> TakeBack:
    """The n-th take-back of a running call (n: its ``taken_back`` with this one) is its last
    once its tool has run ``max_deliveries`` times, each time losing its agent: as on the
    server route, where the run delivered ``max_deliveries`` + 1 times fails without running,
    a tool runs (and kills what runs it) at most ``max_deliveries`` times."""
    count = taken_back + 1
    return TakeBack(taken_back=count, poison=count >= max_deliveries)


def poison_error(task_id: str, tool: str, client_id: str, count: int, max_deliveries: int) -> ErrorInfo:
    """The failure of a call given up on the client route: the server route's type
    (``PoisonTask``, ``workers.tasks``), so readers and summaries tell both apart from other
    failures the same way."""
    return PoisonTask(
        f"task {task_id!r} (tool {tool!r}) on client {client_id!r}: its agent went away while running "
        f"it {count} times: gave up after max_deliveries ({max_deliveries}); check the tool for crashes "
        "or memory use on that workstation.",
        taken_back=count,
        client=client_id,
    ).to_info()
