"""brain.core.retry: which failures a policy retries, and when the next attempt starts."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from brain.core import safeyaml
from brain.core.retry import RetryOn, RetryPolicy, effective_policy, next_attempt_at, retry_class
from workers.contracts import ErrorInfo


def error(kind: str, **data: object) -> ErrorInfo:
    return ErrorInfo(type=kind, message="m", data=data)


@pytest.mark.parametrize(
    ("kind", "data", "expected"),
    [
        # could not reach its server, client or MCP server, or died mid-call
        ("MCPServerUnavailable", {}, RetryOn.UNAVAILABLE),
        ("PoisonTask", {}, RetryOn.UNAVAILABLE),
        ("LostTooOften", {}, RetryOn.UNAVAILABLE),
        ("ConnectionResetError", {}, RetryOn.UNAVAILABLE),
        # ran past its timeout
        ("ToolTimeout", {}, RetryOn.TIMEOUT),
        ("TimeLimitExceeded", {}, RetryOn.TIMEOUT),
        # ran and said it failed (MCP isError); an HTTP "not now" is unavailable
        ("ToolFailed", {}, RetryOn.TOOL_ERROR),
        ("ToolFailed", {"status": 404}, RetryOn.TOOL_ERROR),
        ("ToolFailed", {"status": 503}, RetryOn.UNAVAILABLE),
        ("ToolFailed", {"status": 429}, RetryOn.UNAVAILABLE),
        # never retried: another attempt fails the same way, or does what a person refused
        ("InvalidArguments", {}, None),
        ("ToolNotFound", {}, None),
        ("ApprovalDenied", {}, None),
        ("ApprovalTimeout", {}, None),
        ("PolicyViolation", {}, None),
        ("Cancelled", {}, None),
        ("ResultTooLarge", {}, None),
        ("RouteFailed", {}, None),
        ("UnresolvedReference", {}, None),
        ("ValueError", {}, None),
    ],
)
def test_what_kind_of_failure_an_error_is(
    kind: str, data: dict[str, object], expected: RetryOn | None
) -> None:
    assert retry_class(error(kind, **data)) is expected


def test_the_default_policy_retries_nothing() -> None:
    assert next_attempt_at(RetryPolicy(), error("ToolTimeout"), failures=1, now=0) is None


def test_waits_grow_by_the_factor_up_to_the_cap_and_jitter_draws_below_them() -> None:
    policy = RetryPolicy(max_attempts=6, backoff_s=2, backoff_factor=3, max_backoff_s=30, jitter=False)
    assert [policy.wait_s(n) for n in range(1, 6)] == [2, 6, 18, 30, 30]
    jittered = policy.model_copy(update={"jitter": True})
    assert jittered.wait_s(3, rand=lambda: 0.5) == 9
    assert jittered.wait_s(3, rand=lambda: 0.0) == 0


def test_attempts_are_used_up_then_none() -> None:
    policy = RetryPolicy(max_attempts=3, backoff_s=1, jitter=False)
    timeout = error("ToolTimeout")
    assert next_attempt_at(policy, timeout, failures=1, now=100) == 101
    assert next_attempt_at(policy, timeout, failures=2, now=100) == 102
    assert next_attempt_at(policy, timeout, failures=3, now=100) is None


def test_only_the_kinds_named_in_on_are_retried() -> None:
    policy = RetryPolicy(max_attempts=3, on=[RetryOn.UNAVAILABLE], jitter=False)
    assert next_attempt_at(policy, error("ToolFailed"), failures=1, now=0) is None
    assert next_attempt_at(policy, error("MCPServerUnavailable"), failures=1, now=0) == 1
    assert next_attempt_at(policy, error("InvalidArguments"), failures=1, now=0) is None
    everything = RetryPolicy(max_attempts=3, on=list(RetryOn), jitter=False)
    assert next_attempt_at(everything, error("ApprovalDenied"), failures=1, now=0) is None


def test_an_attempt_that_could_not_start_before_the_deadline_is_not_planned() -> None:
    policy = RetryPolicy(max_attempts=3, backoff_s=10, jitter=False)
    assert next_attempt_at(policy, error("ToolTimeout"), failures=1, now=0, deadline=10) is None
    assert next_attempt_at(policy, error("ToolTimeout"), failures=1, now=0, deadline=11) == 10


def test_a_429_retry_after_puts_the_next_attempt_no_earlier_than_it_names() -> None:
    policy = RetryPolicy(max_attempts=3, backoff_s=1, jitter=False)
    busy = error("ToolFailed", status=429, retry_after_s=30)
    assert next_attempt_at(policy, busy, failures=1, now=100) == 130
    # the policy still decides whether: used up, or not covering unavailable, it is not retried
    assert next_attempt_at(policy, busy, failures=3, now=100) is None
    assert next_attempt_at(RetryPolicy(max_attempts=3, on=[RetryOn.TIMEOUT]), busy, failures=1, now=0) is None
    # a backoff longer than the Retry-After stays
    assert next_attempt_at(policy, error("ToolFailed", status=429, retry_after_s=0.5), failures=1, now=0) == 1


def test_the_most_specific_policy_given_wins() -> None:
    task, tool, tree, setting = (RetryPolicy(max_attempts=n) for n in (2, 3, 4, 5))
    assert effective_policy(task, tool, tree, setting) is task
    assert effective_policy(None, tool, tree, setting) is tool
    assert effective_policy(None, None, tree, setting) is tree
    assert effective_policy(None, None, None, setting) is setting
    assert effective_policy(None, None, None, None).max_attempts == 1


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"max_attempts": 0}, "max_attempts"),
        ({"backoff_s": -1}, "backoff_s"),
        ({"backoff_factor": 0.5}, "backoff_factor"),
        ({"on": ["typo"]}, "'unavailable', 'timeout' or 'tool_error'"),
        ({"on": []}, "on"),
        ({"on": ["timeout", "timeout"]}, "on lists a kind twice"),
        ({"max_attempt": 3}, "max_attempt"),
    ],
)
def test_a_bad_policy_is_refused_naming_the_field(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        RetryPolicy.model_validate(fields)


def test_a_bare_on_key_in_yaml_is_the_word_on_not_true() -> None:
    loaded = safeyaml.load("max_attempts: 3\non: [tool_error]\n")
    assert True in loaded  # PyYAML's reading, which the policy takes back
    assert RetryPolicy.model_validate(loaded).on == [RetryOn.TOOL_ERROR]
