"""Retries of a failed call: the policy, which errors it covers, and when the next attempt
starts (layer: brain/core; pure).

A policy may be given on a task, on its tool in the registry, on the tree, or in the
``retry`` setting; the first one given wins (``effective_policy``). The default,
``max_attempts: 1``, retries nothing. Which failures count is decided from the error's type
alone (``retry_class``): a call that could not reach its server, client or MCP server, or
died mid-call, is ``unavailable``; one that ran past its timeout is ``timeout``; a tool that
ran and said it failed (MCP ``isError``) is ``tool_error``. Anything else (bad arguments, a
consent denial, a sandbox refusal, a cancellation, a result over its cap) is never retried:
another attempt would fail the same way, or do what a person refused.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from workers.contracts import ErrorInfo
from workers.throttle import pause_asked


class RetryOn(StrEnum):
    UNAVAILABLE = "unavailable"
    TIMEOUT = "timeout"
    TOOL_ERROR = "tool_error"


# Error types (``ErrorInfo.type``) by what they say about the call. Types not listed here
# are never retried, whatever the policy says.
_UNAVAILABLE = frozenset(
    {
        "MCPServerUnavailable",  # the server could not be started, or died mid-call
        "PoisonTask",  # its worker died every time it ran it
        "LostTooOften",  # lost between the brain and its worker, again and again
        "ConnectionError",
        "ConnectionRefusedError",
        "ConnectionResetError",
        "BrokenPipeError",
    }
)
_TIMEOUT = frozenset({"ToolTimeout", "TimeoutError", "TimeLimitExceeded", "SoftTimeLimitExceeded"})
_TOOL_ERROR = frozenset({"ToolFailed"})
# HTTP answers that mean "not now" rather than "no": a tool failing with one of these
# (``http_get`` puts it in ``data.status``) was unavailable, not wrong.
_HTTP_UNAVAILABLE = frozenset({429, 502, 503, 504})


def retry_class(error: ErrorInfo | None) -> RetryOn | None:
    """What kind of failure ``error`` is, for a retry policy; None: never retried."""
    if error is None:
        return None
    if error.type in _UNAVAILABLE:
        return RetryOn.UNAVAILABLE
    if error.type in _TIMEOUT:
        return RetryOn.TIMEOUT
    if error.type in _TOOL_ERROR:
        status = error.data.get("status") if isinstance(error.data, dict) else None
        return RetryOn.UNAVAILABLE if status in _HTTP_UNAVAILABLE else RetryOn.TOOL_ERROR
    return None


class RetryPolicy(BaseModel):
    """``retry:`` on a task, a tool, a tree or in the settings (Celery's ``retry_backoff``,
    Temporal's RetryPolicy): attempt at most ``max_attempts`` times in all, waiting
    ``backoff_s`` before the second attempt, ``backoff_factor`` times longer before each next
    one, never longer than ``max_backoff_s``; with ``jitter``, a wait is drawn uniformly
    between 0 and that (full jitter, so that many failed calls do not come back at once)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_attempts: int = Field(default=1, ge=1, le=100)
    backoff_s: float = Field(default=1.0, ge=0, le=86_400)
    backoff_factor: float = Field(default=2.0, ge=1, le=100)
    max_backoff_s: float = Field(default=300.0, ge=0, le=86_400)
    jitter: bool = True
    on: list[RetryOn] = Field(default_factory=lambda: [RetryOn.UNAVAILABLE, RetryOn.TIMEOUT], min_length=1)

    @model_validator(mode="before")
    @classmethod
    def _yaml_on(cls, data: Any) -> Any:
        # YAML 1.1 (PyYAML) reads a bare `on:` key as the boolean true, as GitHub Actions
        # workflows found: take it back as the word it was written as.
        if isinstance(data, dict) and True in data and "on" not in data:
            data = {("on" if key is True else key): value for key, value in data.items()}
        return data

    @model_validator(mode="after")
    def _check(self) -> RetryPolicy:
        if len(set(self.on)) != len(self.on):
            raise ValueError("on lists a kind twice")
        return self

    def wait_s(self, failures: int, rand: Callable[[], float] = random.random) -> float:
        """How long to wait after the ``failures``-th failed attempt (1: after the first)."""
        ceiling = min(self.max_backoff_s, self.backoff_s * self.backoff_factor ** max(failures - 1, 0))
        return ceiling * rand() if self.jitter else ceiling

    def shown(self) -> str:
        """``3 attempts, 1s ×2 (≤300s, jitter) on unavailable, timeout`` (explain, status)."""
        if self.max_attempts == 1:
            return "no retries"
        jitter = ", jitter" if self.jitter else ""
        return (
            f"{self.max_attempts} attempts, {self.backoff_s:g}s ×{self.backoff_factor:g} "
            f"(≤{self.max_backoff_s:g}s{jitter}) on {', '.join(k.value for k in self.on)}"
        )


NO_RETRIES = RetryPolicy()


def effective_policy(*given: RetryPolicy | None) -> RetryPolicy:
    """The first policy given, most specific first (task, tool, tree, setting); else none."""
    return next((p for p in given if p is not None), NO_RETRIES)


class Attempt(BaseModel):
    """One failed attempt of a task, as its record keeps it (``TaskRecord.attempts``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    number: int
    run_id: str | None = None
    route: str = ""
    error: ErrorInfo | None = None
    started_at: float | None = None
    finished_at: float | None = None
    # When the next attempt was due (None: this one was the last).
    next_at: float | None = None


def next_attempt_at(
    policy: RetryPolicy,
    error: ErrorInfo | None,
    failures: int,
    now: float,
    *,
    deadline: float | None = None,
    rand: Callable[[], float] = random.random,
) -> float | None:
    """When to try again after the ``failures``-th failed attempt, or None: the policy does not
    cover this error, the attempts are used up, or the next one could not start before
    ``deadline`` (first left ``pending`` + ``max_total_s``)."""
    kind = retry_class(error)
    if kind is None or kind not in policy.on or failures >= policy.max_attempts:
        return None
    at = now + policy.wait_s(failures, rand)
    # A server that said when to come back (429 Retry-After) is not asked again before then.
    asked = pause_asked(error.data) if error is not None else None
    if asked is not None:
        at = max(at, now + asked)
    if deadline is not None and at >= deadline:
        return None
    return at


def retries_shown(attempts: Sequence[Attempt]) -> str:
    """``2 failed attempt(s): ToolTimeout, MCPServerUnavailable`` for a summary line."""
    kinds = ", ".join(a.error.type if a.error else "failed" for a in attempts)
    return f"{len(attempts)} failed attempt(s): {kinds}"
