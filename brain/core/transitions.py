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

from brain.core.models import RunIf, TaskSpec, TaskState, TaskTree, TreeStatus

_S = TaskState
_WAIT_OR_SEND: Final = frozenset({_S.QUEUED_SERVER, _S.QUEUED_CLIENT, _S.BLOCKED, _S.PENDING_CLIENT})
# result, a failed attempt to try again, cancel, expiry
_OUTCOMES: Final = frozenset({_S.DONE, _S.FAILED, _S.RETRYING, _S.SKIPPED, _S.EXPIRED})

# --- groupings: every state is pending, in flight, parked, waiting (to retry, for items) or final
FINAL: Final = frozenset(s for s in TaskState if s.is_final)
NOT_FINAL: Final = frozenset(TaskState) - FINAL
NOT_DONE: Final = frozenset(TaskState) - {_S.DONE}
# Sent and not back yet: what a result, a progress report or a take-back may move from.
IN_FLIGHT: Final = frozenset({_S.QUEUED_SERVER, _S.QUEUED_CLIENT, _S.RUNNING, _S.AWAITING_APPROVAL})
# In flight and not held for a person: on its way to a worker or agent, or running there.
QUEUED: Final = IN_FLIGHT - {_S.AWAITING_APPROVAL}
# Sent and not begun by a worker or agent: ended so (cancelled, expired at the gate or in its
# queue), no worker tells Flower, so the brain says it was revoked (brain.runtime.revoked).
NOT_BEGUN: Final = frozenset({_S.QUEUED_SERVER, _S.QUEUED_CLIENT})
# Waiting in Redis for a client to come online (blocked, or held as pending-client).
PARKED: Final = frozenset({_S.BLOCKED, _S.PENDING_CLIENT})
# What a run sent to a client may be in: what a disconnect takes back (a server run is never
# queued_client or awaiting_approval; a running one is told apart by its client id).
SENT_TO_CLIENT: Final = IN_FLIGHT - {_S.QUEUED_SERVER}
# Final and no fault: a tree whose tasks all ended so is done (not_triggered: its run_if did
# not hold, by design). Any other final state fails the tree.
SUCCESSFUL: Final = frozenset({_S.DONE, _S.NOT_TRIGGERED})
# A dependency that ended this way counts as failed for run_if (any_failed runs, all_succeeded
# is skipped); expired work failed to happen in time.
_UNSUCCESSFUL: Final = frozenset({_S.FAILED, _S.SKIPPED, _S.EXPIRED})
# Waiting for its next attempt after one failed (brain.core.retry): holds no worker, no slot,
# and no run in flight (a late result of the failed attempt is refused).
RETRY_WAIT: Final = frozenset({_S.RETRYING})
# Ended so (cancelled, expired), no worker or agent will speak of its run again: sent and not
# begun, or a failed attempt Flower shows RETRY (its next attempt would be a new run). The
# brain says it was revoked (brain.runtime.revoked); Flower showed it so for ever before.
REVOKED_IF_ENDED: Final = NOT_BEGUN | RETRY_WAIT
# A for_each task waiting for the items it made (brain.core.fanout).
FAN_OUT_WAIT: Final = frozenset({_S.FANNED_OUT})
# What a server worker may begin its run from (``Store.begin_run``, a compare-and-set on the
# run id that moves it to running): queued, or already running when the same run is delivered
# again (its worker died: ``acks_late``) and must be able to begin again.
BEGINS_FROM: Final = frozenset({_S.QUEUED_SERVER, _S.RUNNING})


# The task state machine, whole: state -> the states it may move to. Every store write of a
# task's state is a compare-and-set naming the states its caller read; this table says which
# moves exist at all (``check_move``), so a new code path cannot invent one.
MOVES: Final[Mapping[TaskState, frozenset[TaskState]]] = {
    # ready: sent, parked, or ended by its route (skip / fail), by an upstream that did not
    # finish, or by a run_if that did not hold (not triggered)
    _S.PENDING: _WAIT_OR_SEND | {_S.SKIPPED, _S.FAILED, _S.NOT_TRIGGERED, _S.FANNED_OUT},
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
    # a for_each task: ends once every item has (done with their results, or failed), or is
    # cancelled or expires like any other
    _S.FANNED_OUT: frozenset({_S.DONE, _S.FAILED, _S.SKIPPED, _S.EXPIRED}),
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


def may_be_running(client_id: str | None, *, ended_unrun: bool) -> bool:
    """Whether a run a cancel or an expiry ended may be running, so must be stopped where it
    runs (``stop_member``). ``ended_unrun``: it ended from a state in ``REVOKED_IF_ENDED``.
    A server run only if not (a pool's begin is in the store); any client run (its agent
    tells the store a moment after it starts; ``HotState.cancel_runs`` leaves out those still
    in the client's queue)."""
    return client_id is not None or not ended_unrun


@dataclass(frozen=True)
class Plan:
    ready: list[str] = field(default_factory=list)  # pending, and its run_if holds
    # (task id, the final state it ends in without running, why): skipped or not triggered
    end: list[tuple[str, TaskState, str]] = field(default_factory=list)


@dataclass(frozen=True)
class Verdict:
    """What a pending task's dependencies, as they stand, make of it: ready, ended without
    running (``end``, with why), or neither yet (wait)."""

    ready: bool = False
    end: TaskState | None = None
    why: str = ""


_WAIT: Final = Verdict()
_READY: Final = Verdict(ready=True)


def verdict(spec: TaskSpec, states: Mapping[str, TaskState]) -> Verdict:
    """Its ``run_if`` applied to its dependencies' states (``states`` holds at least those).

    - ``all_succeeded``: ready once every one is done; skipped as soon as one failed, was
      skipped or expired; not triggered as soon as one was not triggered.
    - ``none_failed``: ready once every one is done, skipped or not triggered; skipped as soon
      as one failed or expired.
    - ``all_done``: ready once every one is final, whatever the outcome.
    - ``any_failed``: once every one is final, ready if one failed, was skipped or expired,
      else not triggered.
    """
    deps = [(d, states[d]) for d in spec.depends_on]
    rule = spec.run_if
    if rule is RunIf.ALL_SUCCEEDED:
        for dep, state in deps:
            if state in _UNSUCCESSFUL:
                return Verdict(end=_S.SKIPPED, why=f"upstream task {dep!r} {state.value}")
        for dep, state in deps:
            if state is _S.NOT_TRIGGERED:
                return Verdict(end=_S.NOT_TRIGGERED, why=f"upstream task {dep!r} was not triggered")
        return _READY if all(state is _S.DONE for _, state in deps) else _WAIT
    if rule is RunIf.NONE_FAILED:
        for dep, state in deps:
            if state in (_S.FAILED, _S.EXPIRED):
                return Verdict(
                    end=_S.SKIPPED, why=f"upstream task {dep!r} {state.value} (run_if: none_failed)"
                )
        return _READY if all(state.is_final for _, state in deps) else _WAIT
    if not all(state.is_final for _, state in deps):
        return _WAIT
    if rule is RunIf.ALL_DONE:
        return _READY
    if any(state in _UNSUCCESSFUL for _, state in deps):  # any_failed
        return _READY
    return Verdict(end=_S.NOT_TRIGGERED, why="run_if: any_failed, and no upstream task failed")


def plan(tree: TaskTree, states: Mapping[str, TaskState]) -> Plan:
    """Each pending task's ``verdict``: the ready ones, and those that end without running."""
    result = Plan()
    for spec in tree.tasks:
        if states.get(spec.id) is not TaskState.PENDING:
            continue
        found = verdict(spec, states)
        if found.ready:
            result.ready.append(spec.id)
        elif found.end is not None:
            result.end.append((spec.id, found.end, found.why))
    return result


def tree_status(states: Mapping[str, TaskState]) -> TreeStatus | None:
    """The tree's final status once every task is final, else None."""
    if not all(s.is_final for s in states.values()):
        return None
    if all(s in SUCCESSFUL for s in states.values()):
        return TreeStatus.DONE
    return TreeStatus.FAILED
