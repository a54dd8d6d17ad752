"""What Flower is told of calls the brain ended before a worker began them (brain.core.revoked)."""

from __future__ import annotations

from brain.core.models import TaskState
from brain.core.revoked import by_destination, revoked_fields
from brain.core.transitions import IN_FLIGHT, NOT_BEGUN


def test_the_fields_are_celerys_for_a_task_revoked_before_it_ran() -> None:
    assert revoked_fields(expired=False) == {"terminated": False, "signum": None, "expired": False}
    assert revoked_fields(expired=True)["expired"] is True


def test_runs_split_by_where_they_were_sent_and_unsent_ones_are_left_out() -> None:
    runs = [("s1", None), ("c1", "laptop"), (None, None), ("s2", None), ("c2", "laptop"), ("d1", "desk")]
    assert by_destination(runs) == (["s1", "s2"], {"laptop": ["c1", "c2"], "desk": ["d1"]})
    assert by_destination([]) == ([], {})


def test_not_begun_is_in_flight_before_a_worker_or_agent_began_it() -> None:
    assert NOT_BEGUN == {TaskState.QUEUED_SERVER, TaskState.QUEUED_CLIENT}
    assert NOT_BEGUN < IN_FLIGHT
