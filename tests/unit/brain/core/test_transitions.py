"""What a tree does next (pure): ready, skipped with the upstream's name, finished."""

from __future__ import annotations

import pytest

from brain.core.models import TaskSpec, TaskState, TaskTree, TreeStatus
from brain.core.transitions import (
    BEGINS_FROM,
    FAN_OUT_WAIT,
    FINAL,
    IN_FLIGHT,
    MOVES,
    NOT_DONE,
    NOT_FINAL,
    PARKED,
    QUEUED,
    RETRY_WAIT,
    SENT_TO_CLIENT,
    InvalidMove,
    check_move,
    plan,
    queued_state,
    tree_status,
    verdict,
)

P, D, F, S, X, Q = (
    TaskState.PENDING,
    TaskState.DONE,
    TaskState.FAILED,
    TaskState.SKIPPED,
    TaskState.EXPIRED,
    TaskState.QUEUED_SERVER,
)

TREE = TaskTree.model_validate(
    {
        "id": "t",
        "tasks": [
            {"id": "a", "tool": "echo"},
            {"id": "b", "tool": "echo", "depends_on": ["a"]},
            {"id": "c", "tool": "echo", "depends_on": ["a", "b"]},
        ],
    }
)


@pytest.mark.parametrize(
    ("states", "ready", "skip"),
    [
        ({"a": P, "b": P, "c": P}, ["a"], []),
        ({"a": Q, "b": P, "c": P}, [], []),
        ({"a": D, "b": P, "c": P}, ["b"], []),
        ({"a": D, "b": D, "c": P}, ["c"], []),
        (
            {"a": F, "b": P, "c": P},
            [],
            [("b", "upstream task 'a' failed"), ("c", "upstream task 'a' failed")],
        ),
        ({"a": D, "b": S, "c": P}, [], [("c", "upstream task 'b' skipped")]),
        (
            {"a": X, "b": P, "c": P},
            [],
            [("b", "upstream task 'a' expired"), ("c", "upstream task 'a' expired")],
        ),
    ],
    ids=[
        "a root task is ready",
        "nothing is ready while a dependency runs",
        "a task is ready when its dependency is done",
        "a task waits for all its dependencies",
        "dependents of a failed task are skipped naming it",
        "a skipped dependency skips its dependents",
        "an expired dependency skips its dependents",
    ],
)
def test_plan(states: dict[str, TaskState], ready: list[str], skip: list[tuple[str, str]]) -> None:
    step = plan(TREE, states)
    assert (step.ready, step.end) == (ready, [(task, TaskState.SKIPPED, why) for task, why in skip])


# --- trigger rules (run_if): what a task's dependencies' outcomes make of it ----------------

N = TaskState.NOT_TRIGGERED
RUN, WAIT = "run", "wait"


@pytest.mark.parametrize(
    ("rule", "deps", "expected"),
    [
        # all_succeeded (the default): every dependency done
        ("all_succeeded", (D, D), RUN),
        ("all_succeeded", (D, Q), WAIT),
        ("all_succeeded", (F, Q), S),  # at once: it can never run
        ("all_succeeded", (D, N), N),
        # none_failed: done, skipped or not triggered dependencies are fine
        ("none_failed", (D, S), RUN),
        ("none_failed", (S, N), RUN),
        ("none_failed", (D, Q), WAIT),
        ("none_failed", (X, Q), S),
        # all_done: every dependency ended, whatever the outcome (clean-up)
        ("all_done", (D, F), RUN),
        ("all_done", (S, X), RUN),
        ("all_done", (F, Q), WAIT),
        # any_failed: once every dependency ended, run if one failed, was skipped or expired (notify)
        ("any_failed", (D, F), RUN),
        ("any_failed", (D, S), RUN),
        ("any_failed", (D, D), N),
        ("any_failed", (D, N), N),
        ("any_failed", (F, Q), WAIT),
    ],
)
def test_a_trigger_rule_reads_its_dependencies_outcomes(
    rule: str, deps: tuple[TaskState, TaskState], expected: str | TaskState
) -> None:
    spec = TaskSpec(id="t", tool="echo", depends_on=["x", "y"], run_if=rule)
    found = verdict(spec, dict(zip(("x", "y"), deps, strict=True)))
    shown = RUN if found.ready else (found.end or WAIT)
    assert shown == expected, found


def test_a_tree_whose_notify_was_not_triggered_is_done_and_one_whose_notify_ran_is_failed() -> None:
    assert tree_status({"work": D, "notify": N}) is TreeStatus.DONE
    assert tree_status({"work": F, "notify": D}) is TreeStatus.FAILED


@pytest.mark.parametrize(
    ("states", "status"),
    [({"a": D, "b": D}, TreeStatus.DONE), ({"a": D, "b": S}, TreeStatus.FAILED), ({"a": D, "b": Q}, None)],
    ids=["all done is done", "final but not all done is failed", "anything unfinished is still running"],
)
def test_tree_status(states: dict[str, TaskState], status: TreeStatus | None) -> None:
    assert tree_status(states) == status


# --- the state machine: every move the brain makes, and nothing else ------------------
QC, R, B, PC = TaskState.QUEUED_CLIENT, TaskState.RUNNING, TaskState.BLOCKED, TaskState.PENDING_CLIENT

ALLOWED = [
    # ready task: sent to the server or a client, parked (blocked / pending_client), or ended by its route
    (P, Q), (P, QC), (P, B), (P, PC), (P, S), (P, F),
    # in flight: its result, re-sent as a new run, taken back and sent elsewhere or parked, cancelled, expired
    (Q, D), (Q, F), (QC, D), (QC, F), (R, D), (R, F),
    (Q, Q), (QC, QC), (QC, Q), (QC, B), (QC, PC), (Q, S), (QC, X),
    # begun by its worker or agent; the same run begun again (redelivered); running, re-sent as
    # a new run (queued again), taken back from a client that left, cancelled, expired
    (Q, R), (QC, R), (R, R), (R, Q), (R, QC), (R, PC), (R, B), (R, S), (R, X),
    # parked: requeued (sent or parked again), cancelled, expired, failed by its new route
    (B, QC), (B, Q), (PC, QC), (PC, PC), (B, B), (B, S), (PC, X), (B, F),
]  # fmt: skip
REFUSED = [
    (P, D), (P, X), (P, R),  # a task that never ran cannot be done; pending has no deadline yet
    (B, D), (PC, D),  # a parked task has no run whose result could count
    (D, F), (F, D), (S, Q), (X, QC), (D, D),  # final is final
    (Q, P), (B, P), (R, P),  # nothing goes back to pending
    (B, R), (PC, R), (D, R),  # only a run that was sent can begin
]  # fmt: skip


@pytest.mark.parametrize(("a", "b"), ALLOWED)
def test_the_state_machine_allows(a: TaskState, b: TaskState) -> None:
    assert b in MOVES[a]
    check_move({a}, b)


@pytest.mark.parametrize(("a", "b"), REFUSED)
def test_the_state_machine_refuses(a: TaskState, b: TaskState) -> None:
    assert b not in MOVES[a]
    with pytest.raises(InvalidMove, match=f"from {a.value} to {b.value}"):
        check_move({a}, b)


def test_every_state_is_in_the_table_and_only_final_states_are_dead_ends() -> None:
    assert set(MOVES) == set(TaskState)
    assert {s for s, to in MOVES.items() if not to} == {s for s in TaskState if s.is_final}


def test_a_clients_call_may_wait_for_approval_and_then_run_or_end() -> None:
    A, QC = TaskState.AWAITING_APPROVAL, TaskState.QUEUED_CLIENT
    check_move({QC, TaskState.RUNNING}, A)
    for to in (QC, TaskState.RUNNING, D, F, S, X, TaskState.PENDING_CLIENT, TaskState.BLOCKED):
        check_move({A}, to)
    with pytest.raises(InvalidMove):
        check_move({A}, P)
    with pytest.raises(InvalidMove):
        check_move({P}, A)


def test_every_state_is_pending_in_flight_parked_or_final_exactly_once() -> None:
    groups = [frozenset({TaskState.PENDING}), IN_FLIGHT, PARKED, RETRY_WAIT, FAN_OUT_WAIT, FINAL]
    for state in TaskState:
        assert sum(state in g for g in groups) == 1, state
    assert NOT_FINAL == frozenset(TaskState) - FINAL and NOT_DONE == frozenset(TaskState) - {TaskState.DONE}
    assert QUEUED == IN_FLIGHT - {TaskState.AWAITING_APPROVAL}


def test_a_task_in_flight_may_end_with_its_result_and_be_taken_back() -> None:
    for state in IN_FLIGHT:
        assert {TaskState.DONE, TaskState.FAILED, TaskState.QUEUED_SERVER} <= MOVES[state], state


def test_a_run_begins_from_queued_or_again_from_running_and_is_in_flight_while_it_runs() -> None:
    assert BEGINS_FROM == {Q, R}
    for state in BEGINS_FROM:
        check_move({state}, R)
    assert R in IN_FLIGHT and R in QUEUED and R in SENT_TO_CLIENT
    assert Q not in SENT_TO_CLIENT and SENT_TO_CLIENT == IN_FLIGHT - {Q}
    # approved, a client's call runs again (not queued_client: it has begun)
    check_move({TaskState.AWAITING_APPROVAL}, R)


def test_a_re_sent_run_is_queued_for_where_it_goes() -> None:
    assert queued_state(None) is Q and queued_state("laptop") is QC
    for state in IN_FLIGHT:
        check_move({state}, queued_state(None))
        check_move({state}, queued_state("laptop"))
