"""Errors raised while executing a tool call (layer: workers).

A tool that ran and failed is a *result* (``ToolResult.ok = False``); these
exceptions are how the executor gets there. Each maps to ``ErrorInfo`` by
``to_info()`` so it crosses Celery as data.
"""

from __future__ import annotations

from typing import Any

from workers.contracts import ErrorInfo


class WorkerError(Exception):
    """Root of every error raised on the execution side."""

    def __init__(self, message: str, **data: Any) -> None:
        super().__init__(message)
        self.message = message
        self.data = data

    def to_info(self) -> ErrorInfo:
        return ErrorInfo(type=type(self).__name__, message=self.message, data=self.data)


class ToolNotFound(WorkerError):
    """The worker has no tool by that name."""


class ToolFailed(WorkerError):
    """The tool ran and reported an error (an MCP ``isError`` result, an exception in a built-in)."""


class ToolTimeout(WorkerError):
    """The tool did not answer within its timeout."""


class Cancelled(WorkerError):
    """The call's task was cancelled (or passed its ``max_total_s``) while the call ran, and
    the call was stopped (``workers.call_stop``); its result is refused, as is any result of
    a task that ended."""


class ResultTooLarge(WorkerError):
    """The tool's result is larger than the configured cap."""


class MCPServerUnavailable(WorkerError):
    """An MCP server could not be started or connected to; carries its stderr tail."""


class InvalidArguments(WorkerError):
    """The arguments do not match the tool's input schema."""


class CallFailed(WorkerError):
    """Raised by the server pool's Celery task after a failed call's result was handed on
    (recorded, or sent to the brain), so that Celery's ``task-failed`` event tells Flower the
    truth. It names the error's type and where to read its message, never the message: that
    may quote argument values or file contents (the store keeps it whole)."""


class PoisonTask(WorkerError):
    """A task run was delivered more often than allowed (its worker keeps dying)."""
