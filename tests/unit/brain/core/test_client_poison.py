"""The client route's poison bound (brain.core.client_poison)."""

from __future__ import annotations

import pytest

from brain.core.client_poison import TakeBack, poison_error, running_take_back
from brain.core.retry import RetryOn, RetryPolicy, next_attempt_at, retry_class
from workers.contracts import ErrorInfo


@pytest.mark.parametrize(
    ("taken_back", "max_deliveries", "expected"),
    [
        (0, 3, TakeBack(taken_back=1, poison=False)),  # first loss of its agent: routed again
        (1, 3, TakeBack(taken_back=2, poison=False)),
        (2, 3, TakeBack(taken_back=3, poison=True)),  # its tool ran 3 times, losing its agent each time
        (5, 3, TakeBack(taken_back=6, poison=True)),  # a limit lowered since: no more runs either
        (0, 1, TakeBack(taken_back=1, poison=True)),  # max_deliveries 1: one run, as on the server route
        (1, 2, TakeBack(taken_back=2, poison=True)),
        (0, 2, TakeBack(taken_back=1, poison=False)),
    ],
)
def test_a_running_call_taken_back_fails_once_its_tool_has_lost_its_agent_max_deliveries_times(
    taken_back: int, max_deliveries: int, expected: TakeBack
) -> None:
    assert running_take_back(taken_back, max_deliveries) == expected


def test_the_server_route_bound_is_the_same_number_of_runs() -> None:
    """workers.tasks fails a run delivered more than max_deliveries times, without running it:
    its tool ran max_deliveries times. The client route allows as many runs."""
    limit = 3
    runs = 0
    taken_back = 0
    while True:
        runs += 1  # the tool runs and its agent dies
        taken_back, poison = running_take_back(taken_back, limit)
        if poison:
            break
    assert runs == limit


def test_its_error_is_the_server_routes_poison_type_and_says_what_to_do() -> None:
    error = poison_error("crash", "ledger.die", "laptop", 3, 3)
    assert error.type == "PoisonTask"
    assert error.data == {"taken_back": 3, "client": "laptop"}
    for part in ("'crash'", "'ledger.die'", "'laptop'", "3 times", "max_deliveries (3)", "workstation"):
        assert part in error.message


@pytest.mark.parametrize(
    ("on", "retried"),
    [([RetryOn.UNAVAILABLE], True), ([RetryOn.TIMEOUT, RetryOn.TOOL_ERROR], False)],
)
def test_its_error_is_retried_as_the_server_routes_is_when_a_policy_covers_unavailable(
    on: list[RetryOn], retried: bool
) -> None:
    """Both routes' PoisonTask go through the same retry decision (brain.core.retry): the
    client route's is given up at a take-back, not in a result, but is the same kind."""
    server = ErrorInfo(type="PoisonTask", message="died each time", data={"deliveries": 4})
    client = poison_error("crash", "ledger.die", "laptop", 3, 3)
    policy = RetryPolicy(max_attempts=2, backoff_s=5, jitter=False, on=on)
    assert retry_class(client) is retry_class(server) is RetryOn.UNAVAILABLE
    for error in (server, client):
        assert next_attempt_at(policy, error, 1, 100.0) == (105.0 if retried else None)
        assert next_attempt_at(policy, error, 2, 100.0) is None  # its attempts used up
    assert next_attempt_at(RetryPolicy(), client, 1, 100.0) is None  # no policy: final
