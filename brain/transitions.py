"""What a tree does next, given its tasks' records (layer: brain, pure).

No store, no Redis, no clock: the scheduler reads records, asks here, and applies
the answer with compare-and-set writes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from brain.models import TaskRecord, TaskSpec, TaskState, TaskTree, TreeStatus


@dataclass(frozen=True)
class Plan:
    ready: list[str] = field(default_factory=list)  # pending, every dependency done
    skip: list[tuple[str, str]] = field(default_factory=list)  # (task id, why)


def plan(tree: TaskTree, records: Mapping[str, TaskRecord]) -> Plan:
    """Pending tasks whose dependencies are all done are ready; pending tasks with a
    dependency that ended any other way are skipped, naming that dependency."""
    result = Plan()
    for spec in tree.tasks:
        rec = records.get(spec.id)
        if rec is None or rec.state is not TaskState.PENDING:
            continue
        blocker = _first_unsuccessful_dependency(spec, records)
        if blocker is not None:
            dep, state = blocker
            result.skip.append((spec.id, f"upstream task {dep!r} {state.value}"))
        elif all(records[d].state is TaskState.DONE for d in spec.depends_on):
            result.ready.append(spec.id)
    return result


def _first_unsuccessful_dependency(
    spec: TaskSpec, records: Mapping[str, TaskRecord]
) -> tuple[str, TaskState] | None:
    for dep in spec.depends_on:
        state = records[dep].state
        if state.is_final and state is not TaskState.DONE:
            return dep, state
    return None


def tree_status(records: Mapping[str, TaskRecord]) -> TreeStatus | None:
    """The tree's final status once every task is final, else None."""
    if not all(r.state.is_final for r in records.values()):
        return None
    if all(r.state is TaskState.DONE for r in records.values()):
        return TreeStatus.DONE
    return TreeStatus.FAILED


def upstream_results(spec: TaskSpec, records: Mapping[str, TaskRecord]) -> dict[str, Any]:
    return {dep: records[dep].result for dep in spec.depends_on}
