"""What a tree does next, given its tasks' states (layer: brain, pure).

No store, no Redis, no clock: the scheduler reads states, asks here, and applies
the answer with compare-and-set writes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from brain.models import TaskSpec, TaskState, TaskTree, TreeStatus


@dataclass(frozen=True)
class Plan:
    ready: list[str] = field(default_factory=list)  # pending, every dependency done
    skip: list[tuple[str, str]] = field(default_factory=list)  # (task id, why)


def plan(tree: TaskTree, states: Mapping[str, TaskState]) -> Plan:
    """Pending tasks whose dependencies are all done are ready; pending tasks with a
    dependency that ended any other way are skipped, naming that dependency."""
    result = Plan()
    for spec in tree.tasks:
        if states.get(spec.id) is not TaskState.PENDING:
            continue
        blocker = _first_unsuccessful_dependency(spec, states)
        if blocker is not None:
            dep, state = blocker
            result.skip.append((spec.id, f"upstream task {dep!r} {state.value}"))
        elif all(states[d] is TaskState.DONE for d in spec.depends_on):
            result.ready.append(spec.id)
    return result


def _first_unsuccessful_dependency(
    spec: TaskSpec, states: Mapping[str, TaskState]
) -> tuple[str, TaskState] | None:
    for dep in spec.depends_on:
        state = states[dep]
        if state.is_final and state is not TaskState.DONE:
            return dep, state
    return None


def tree_status(states: Mapping[str, TaskState]) -> TreeStatus | None:
    """The tree's final status once every task is final, else None."""
    if not all(s.is_final for s in states.values()):
        return None
    if all(s is TaskState.DONE for s in states.values()):
        return TreeStatus.DONE
    return TreeStatus.FAILED
