"""Trees and tasks as JSON for scripts (layer: brain/core; presentation; pure).

The shape is a contract (docs/output.md): add fields, never rename or
remove one. Task records are the store's records whole: results are never cut.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from brain.core.client_health import Mark
from brain.core.models import Enrollment, TaskRecord, TreeRecord
from brain.core.sessions import ClientSession
from brain.core.snapshot import RegistrySnapshot
from brain.core.toolnames import clash_lines


def tree_summary(tree: TreeRecord, counts: Mapping[str, int]) -> dict[str, Any]:
    return {
        "tree_id": tree.tree_id,
        "name": tree.tree.id,
        "status": tree.status.value,
        "session": tree.session.value,
        "user": tree.user,
        "client_id": tree.client_id,
        "submitted_at": tree.submitted_at,
        "finished_at": tree.finished_at,
        "counts": dict(sorted(counts.items())),
        "schedule": tree.schedule,
    }


def tree_report(tree: TreeRecord, tasks: Sequence[TaskRecord]) -> dict[str, Any]:
    """One tree with every task record, in the tree's order."""
    counts = Counter(t.state.value for t in tasks)
    return {**tree_summary(tree, counts), "tasks": [t.model_dump(mode="json") for t in tasks]}


def trees_report(
    trees: Sequence[TreeRecord], counts: Mapping[str, Mapping[str, int]]
) -> list[dict[str, Any]]:
    """Recent trees, newest first, with how many tasks are in each state."""
    return [tree_summary(t, counts.get(t.tree_id, {})) for t in trees]


def clients_report(
    enrolled: Mapping[str, Enrollment],
    sessions: Mapping[str, ClientSession],
    waiting: Mapping[str, int],
    registry: RegistrySnapshot | None = None,
    misbehaving: Mapping[str, Mark] | None = None,
    round_trips: Mapping[str, float | None] | None = None,
    last_seen: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """`vancetope clients --json`: every enrolled client (never its secret's hash), its session,
    its round trip to Redis, when its last session ended, the parked work it could take and why
    it is suspended, if it is; and the registry's last (re)load."""
    marks = misbehaving or {}
    rtts = round_trips or {}
    seen = last_seen or {}
    clients = []
    for cid, enrollment in sorted(enrolled.items()):
        session = sessions.get(cid)
        clients.append(
            {
                "client_id": cid,
                "user": enrollment.user,
                "enrolled_at": enrollment.enrolled_at,
                "connected": session is not None,
                "client_type": session.client_type.value if session else None,
                "connected_at": session.connected_at if session else None,
                # As its agent measured it (median of its last heartbeats); null if not said.
                "round_trip_ms": rtts.get(cid) if session else None,
                # When its last session ended (a disconnect or a missed heartbeat); null if none
                # was recorded. While connected, that of the session before.
                "last_seen": seen.get(cid),
                "tools": sorted(t.name for t in session.tools) if session else [],
                # Definitions changed since pinned: not routed to until `clients approve-tools`.
                "held_tools": sorted(t.name for t in session.held_tools) if session else [],
                # Its MCP tools whose bare name the registry gives to another tool: reachable as
                # <server>.<tool> only (brain.core.toolnames.clash_lines).
                "clashes": clash_lines(session.clashes(registry.tools)) if session and registry else [],
                # Suspended for what it wrote (brain.hot.misbehaving): the causes, else null.
                "misbehaving": marks[cid].shown() if cid in marks else None,
                # Parked for this client by name, and for any client of its user.
                "waiting": {
                    "client": waiting.get(f"client:{cid}", 0),
                    "user": waiting.get(f"user:{enrollment.user}", 0),
                },
            }
        )
    report: dict[str, Any] = {"clients": clients}
    if registry is not None and registry.loaded_at:
        report["registry"] = {
            "tools": len(registry.tools),
            "loaded_at": registry.loaded_at,
            "changes": list(registry.changes),
            "clashes": clash_lines(registry.clashes),
        }
    return report
