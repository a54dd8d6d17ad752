"""Which source may complete a task (brain.runtime.intake.refuse_result), as a table.

The source is where a result came through: None for the brain queue, else the client
whose outbox carried it. The task record's ``client_id`` says where its run was sent.
"""

from __future__ import annotations

import pytest

from brain.core.models import TaskRecord, TaskState
from brain.runtime.intake import refuse_claim, refuse_result
from workers.contracts import ToolResult


def record(client_id: str | None) -> TaskRecord:
    state = TaskState.QUEUED_SERVER if client_id is None else TaskState.QUEUED_CLIENT
    # The route summary is for people: a misleading one must change nothing.
    return TaskRecord(
        tree_id="t",
        task_id="a",
        tool="x",
        state=state,
        run_id="r1",
        route="client:mallory",
        client_id=client_id,
    )


def result(client_id: str | None) -> ToolResult:
    return ToolResult(
        run_id="r1",
        tree_id="t",
        task_id="a",
        tool="x",
        ok=True,
        client_id=client_id,
        started_at=0,
        finished_at=0,
    )


@pytest.mark.parametrize(
    ("routed_to", "came_from", "claims", "refusal"),
    [
        (None, None, None, None),
        ("alice", "alice", "alice", None),
        ("alice", None, None, "it was routed to client 'alice', not to the server"),
        ("alice", None, "alice", "it was routed to client 'alice', not to the server"),
        (None, None, "alice", "it claims client 'alice' but came through the brain queue"),
        ("bob", "alice", "alice", "it was routed to client 'bob'"),
        ("bob", "alice", "bob", "it was routed to client 'bob'"),
        (None, "alice", "alice", "it was routed to the server"),
        ("alice", "alice", "bob", "it claims client 'bob'"),
        ("alice", "alice", None, "it claims client None"),
    ],
)
def test_a_result_counts_only_from_where_the_task_record_says_its_run_was_sent(
    routed_to: str | None, came_from: str | None, claims: str | None, refusal: str | None
) -> None:
    assert refuse_result(record(routed_to), result(claims), came_from) == refusal


def test_a_result_for_an_unknown_task_is_refused() -> None:
    assert refuse_result(None, result(None), None) == "no such task"


@pytest.mark.parametrize(
    ("came_from", "claims", "refusal"),
    [
        (None, None, None),
        ("alice", "alice", None),
        (None, "alice", "it claims client 'alice' but came through the brain queue"),
        ("alice", "bob", "it claims client 'bob'"),
        ("alice", None, "it claims client None"),
    ],
)
def test_a_claim_that_does_not_fit_its_way_in_is_refused_before_any_read(
    came_from: str | None, claims: str | None, refusal: str | None
) -> None:
    """The same words refuse_result uses for these cases: whichever check runs first, the log reads alike."""
    assert refuse_claim(result(claims).client_id, came_from) == refusal
    if refusal is not None:
        assert refuse_result(record(came_from), result(claims), came_from) == refusal
