"""Trees and tasks as JSON for scripts (layer: brain, presentation; pure).

The shape is a contract (README, "Output for scripts"): add fields, never rename or
remove one. Task records are the store's records whole: results are never cut.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from brain.models import TaskRecord, TreeRecord


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
