"""The task state machine whole, every grouping of its states, and what a tree does next
given its tasks' states (layer: brain/core; pure).

No store, no Redis, no clock: the scheduler reads states, asks here, and applies
the answer with compare-and-set writes. Every set of states that code tests a task against
is named here once, so a summary, a sweep and a compare-and-set cannot disagree on what "in
flight" or "waiting" means (tests/unit/brain/core/test_transitions.py checks they partition
the states).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Final

from brain.core.models import TaskSpec, TaskState, TaskTree, TreeStatus

_S = TaskState
_WAIT_OR_SEND: Final = frozenset({_S.QUEUED_SERVER, _S.QUEUED_CLIENT, _S.BLOCKED, _S.PENDING_CLIENT})
# result, a failed attempt to try again, cancel, expiry
_OUTCOMES: Final = frozenset({_S.DONE, _S.FAILED, _S.RETRYING, _S.SKIPPED, _S.EXPIRED})

# --- groupings: every state is pending, in flight, parked, waiting to retry or final (one) -
FINAL: Final = frozenset(s for s in TaskState if s.is_final)
NOT_FINAL: Final = frozenset(TaskState) - FINAL
NOT_DONE: Final = frozenset(TaskState) - {_S.DONE}
# Sent and not back yet: what a result, a progress report or a take-back may move from.
IN_FLIGHT: Final = frozenset({_S.QUEUED_SERVER, _S.QUEUED_CLIENT, _S.RUNNING, _S.AWAITING_APPROVAL})
# In flight and not held for a person: on its way to a worker or agent, or running there.
QUEUED: Final = IN_FLIGHT - {_S.AWAITING_APPROVAL}
# Waiting in Redis for a client to come online (blocked, or held as pending-client).
PARKED: Final = frozenset({_S.BLOCKED, _S.PENDING_CLIENT})
# What a run sent to a client may be in: what a disconnect takes back (a server run is never
# queued_client or awaiting_approval; a running one is told apart by its client id).
SENT_TO_CLIENT: Final = IN_FLIGHT - {_S.QUEUED_SERVER}
# Waiting for its next attempt after one failed (brain.core.retry): holds no worker, no slot,
# and no run in flight (a late result of the failed attempt is refused).
RETRY_WAIT: Final = frozenset({_S.RETRYING})
# What a server worker may begin its run from (``Store.begin_run``, a compare-and-set on the
# run id that moves it to running): queued, or already running when the same run is delivered
# again (its worker died: ``acks_late``) and must be able to begin again.
BEGINS_FROM: Final = frozenset({_S.QUEUED_SERVER, _S.RUNNING})


# The task state machine, whole: state -> the states it may move to. Every store write of a
# task's state is a compare-and-set naming the states its caller read; this table says which
# moves exist at all (``check_move``), so a new code path cannot invent one.
MOVES: Final[Mapping[TaskState, frozenset[TaskState]]] = {
    # ready: sent, parked, or ended by its route (skip / fail) or an upstream that did not finish
    _S.PENDING: _WAIT_OR_SEND | {_S.SKIPPED, _S.FAILED},
    # queued: begun by its worker or agent (running), its result, a re-send (same state, new
    # run), taken back from a client that left (sent elsewhere or parked), lost too often,
    # cancelled, past its max_total_s
    _S.QUEUED_SERVER: _WAIT_OR_SEND | _OUTCOMES | {_S.RUNNING},
    # a client's call may also wait for its user's approval (an agent that never says it began)
    _S.QUEUED_CLIENT: _WAIT_OR_SEND | _OUTCOMES | {_S.RUNNING, _S.AWAITING_APPROVAL},
    # running: begun again (the same run redelivered after its worker died), its result, a
    # re-send as a new run (queued again: nothing held it), taken back from a client that
    # left, a client's call held for approval, cancelled, expired
    _S.RUNNING: _WAIT_OR_SEND | _OUTCOMES | {_S.RUNNING, _S.AWAITING_APPROVAL},
    # approved, it runs again (running, where the reconciler and a disconnect still find it);
    # denied or timed out, it fails; or it is taken back, cancelled, expired like any call in flight
    _S.AWAITING_APPROVAL: _WAIT_OR_SEND | _OUTCOMES | {_S.RUNNING},
    # parked: requeued (sent, or parked again), cancelled, expired, or failed by its new route;
    # waiting to retry: its next attempt sent, or parked (its client is offline), or the same
    _S.BLOCKED: _WAIT_OR_SEND | {_S.FAILED, _S.SKIPPED, _S.EXPIRED},
    _S.PENDING_CLIENT: _WAIT_OR_SEND | {_S.FAILED, _S.SKIPPED, _S.EXPIRED},
    _S.RETRYING: _WAIT_OR_SEND | {_S.FAILED, _S.SKIPPED, _S.EXPIRED},
    # final states are final
    **{s: frozenset() for s in TaskState if s.is_final},
}


class InvalidMove(Exception):
    """A code path asked for a move ``MOVES`` does not have: a bug, never a race."""


def check_move(from_states: Collection[TaskState], to: TaskState) -> None:
    """Raise InvalidMove unless ``to`` may follow every state in ``from_states``."""
    bad = sorted(s.value for s in from_states if to not in MOVES[s])
    if bad:
        raise InvalidMove(
            f"a task cannot move from {', '.join(bad)} to {to.value} (brain.core.transitions.MOVES)"
        )


def queued_state(client_id: str | None) -> TaskState:
    """The state of a run sent (or re-sent) and not begun yet: queued for its client, or for the
    server when it has none."""
    return _S.QUEUED_SERVER if client_id is None else _S.QUEUED_CLIENT


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
