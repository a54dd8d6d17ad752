"""What `explain` says bounds each server task: its priority, its limits, its user's share.

Pure: from the tree, its routes, the registry and the fair-share settings, the lines under
explain's table (docs/fair-share.md). Only server runs are bounded: a client's call runs on
its workstation, so a task routed there gets no line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from brain.core.fairshare import (
    Fairness,
    applied_limits,
    call_origin,
    priority_named,
    priority_source,
    user_limit,
)
from brain.core.models import SessionKind, TaskSpec, TaskTree, ToolSpec
from brain.core.routing import Route, RouteKind
from brain.core.snapshot import RegistrySnapshot
from workers.contracts import DEFAULT_POOL


def server_tasks(
    routes: Sequence[tuple[TaskSpec, Route]], registry: RegistrySnapshot
) -> list[tuple[TaskSpec, Route, ToolSpec]]:
    """The tasks routed to a server pool, with their tool."""
    found = []
    for spec, route in routes:
        tool = registry.tools.get(route.tool) if route.kind is RouteKind.SERVER else None
        if tool is not None:
            found.append((spec, route, tool))
    return found


def limit_lines(
    tree: TaskTree,
    routes: Sequence[tuple[TaskSpec, Route]],
    registry: RegistrySnapshot,
    pauses: Mapping[str, str],
    *,
    session: SessionKind = SessionKind.AUTONOMOUS,
    fairness: Fairness | None = None,
    user: str | None = None,
) -> list[str]:
    """Per server task: its priority and where it comes from, and with fair share on, its
    user's share of the pool (``weight``, ``queue_window``); then the limits that bound it
    (``rate_limit 5/s of tool http_get``, ``max_in_flight_per_user 200 of user ada on pool
    default``): its call waits at the gate, shown as throttled, while one of them holds it;
    and a budget a 429 paused now (``pauses``: limit key -> why and until when)."""
    fair = fairness or Fairness()
    lines = []
    for spec, route, tool in server_tasks(routes, registry):
        priority, source = priority_source(spec.priority, tree.priority, session, gateway_call=False)
        line = f"task {spec.id}: priority {priority_named(priority)}, {source}"
        if fair.on:
            line += (
                f"; fair share of pool {route.pool or DEFAULT_POOL} as user {user or '-'}: "
                f"weight {fair.weight(user)}, queue_window {fair.queue_window}"
            )
        lines.append(line)
        origin = call_origin(spec.args)  # a url written as it is; one with ${...} is known at run time
        limits = applied_limits(
            tool, route.pool, registry.server_limits, registry.pool_limits, pauses, origin
        )
        if fair.on and fair.max_in_flight_per_user is not None:
            limits = (*limits, user_limit(route.pool, user, fair.max_in_flight_per_user))
        if limits:
            words = [w for limit in limits for w in limit.described()]
            words += [pauses[limit.key] for limit in limits if limit.key in pauses]
            lines.append(f"task {spec.id}: limits: {', '.join(words)}")
    if lines and not fair.on:
        lines.append(
            "Fair share is off (queue_window 0): priorities order nothing, and no user weight "
            "or max_in_flight_per_user applies (docs/fair-share.md#fair-share-across-users)."
        )
    return lines
