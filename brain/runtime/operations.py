"""What an operator does to a running stack, shared by the CLI and the web view (layer:
brain/runtime): cancel a tree or a task, approve a client's changed tool definitions, read the
clients view. Each checks what it is given and raises ``brain.errors.NotFound`` (its message
names the tree, task, client or tool and where to look) before it changes anything."""

from __future__ import annotations

from typing import Any

from brain.core.report import clients_report
from brain.errors import TaskNotFound, ToolNotHeld, TreeNotFound
from brain.hot.toolpins import ToolPins
from brain.runtime.service import Brain


def cancel(brain: Brain, tree_id: str, task_id: str | None = None) -> list[str]:
    """Cancel ``tree_id`` (or only its ``task_id``): its unfinished tasks end as skipped
    (cancelled by user). The ids of the tasks it cancelled."""
    if brain.store.get_tree(tree_id) is None:
        raise TreeNotFound(tree_id)
    if task_id is not None and brain.store.get_task(tree_id, task_id) is None:
        raise TaskNotFound(tree_id, task_id, list(brain.store.task_states(tree_id)))
    return list(brain.sweeps.cancel(tree_id, task_id))


def approve_tools(brain: Brain, client_id: str, tools: tuple[str, ...] | list[str] = ()) -> list[str]:
    """Pin ``client_id``'s changed tool definitions as now announced (all it holds back when
    ``tools`` is empty); routed to again once its agent announces again. The names approved
    (empty: it holds none back)."""
    session = brain.scheduler.presence.session(client_id)
    held = session.held_tools if session else []
    unknown = sorted(set(tools) - {t.name for t in held})
    if unknown:
        raise ToolNotHeld(client_id, unknown)
    return ToolPins(brain.hot.r).approve(client_id, held, tools)


def clients_view(brain: Brain) -> dict[str, Any]:
    """`vancetope clients --json`: every enrolled client, its session, round trip, last seen,
    what waits for it (brain.core.report.clients_report)."""
    book = brain.scheduler.presence
    sessions = book.sessions()
    return clients_report(
        book.enrolled(),
        sessions,
        brain.scheduler.parked.waiting(),
        brain.scheduler.registry,
        misbehaving=brain.clients.misbehaving.all(),
        round_trips=book.round_trips(sessions),
        last_seen=book.last_seen(),
    )
