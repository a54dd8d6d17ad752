"""What one running MCP call says besides its progress: its server's logs and its sampling and
elicitation requests (layer: workers; issue 24).

One job: turn them into bounded ``ToolLog`` and ``ToolAsk`` messages for the route the call runs
on (a ``CallChannel``: the server pool's intake, or a client agent's outbox), and wait for an
ask's answer. Logs are best effort and never block the call: at most ``LOGS_PER_S`` a second
per call (a burst of as many), data capped, the rest dropped and counted. An ask is passed on
only for a gateway call (``ToolCall.interactive``: an MCP client waits for it); inside a tree
there is no LLM host to ask, and the server gets an error saying so at once.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from typing import Any, Protocol

import anyio

from workers.contracts import (
    LOG_LEVELS,
    MAX_ASK_BYTES,
    MAX_LOG_DATA_BYTES,
    MAX_LOGGER_CHARS,
    AskAnswer,
    AskKind,
    LogLevel,
    ToolAsk,
    ToolCall,
    ToolLog,
    json_size,
)

log = logging.getLogger("vancetope.worker.relay")

LOGS_PER_S = 20.0
# One blocking pop's longest wait for an answer: under redis-py's socket timeouts.
POP_BLOCK_S = 2.0
# Shown instead of data over MAX_LOG_DATA_BYTES: its start, as text.
_CUT_MARK = "… (cut: over {limit} bytes)"


class AskRefused(Exception):
    """An ask that cannot be put to an MCP client; the text says why (the MCP server reads it)."""


class CallChannel(Protocol):
    """Where a route sends a call's logs and asks (the server pool's intake, an agent's outbox)."""

    def log(self, update: ToolLog) -> None: ...

    def ask(self, ask: ToolAsk, timeout: float) -> AskAnswer:
        """Pass ``ask`` on and wait (at most ``timeout``) for its answer."""
        ...


def level_passes(level: str, threshold: str | None) -> bool:
    """Whether a log at ``level`` is sent to a session that set ``threshold`` (None: everything
    the server sent). RFC 5424 order, as MCP's levels; an unknown level passes."""
    if threshold is None or threshold not in LOG_LEVELS or level not in LOG_LEVELS:
        return True
    return LOG_LEVELS.index(level) >= LOG_LEVELS.index(threshold)  # type: ignore[arg-type]


def capped_data(data: Any, limit: int = MAX_LOG_DATA_BYTES) -> Any:
    """``data`` when it is JSON within ``limit`` bytes, else its start as text, marked as cut."""
    try:
        if json_size(data) <= limit:
            return data
        text = data if isinstance(data, str) else repr(data)
    except (TypeError, ValueError):
        text = repr(data)
    mark = _CUT_MARK.format(limit=limit)
    keep = max(limit // 4 - len(mark), 0)  # a character may be up to 4 bytes (and escaped)
    while keep and json_size(text[:keep] + mark) > limit:
        keep //= 2
    return text[:keep] + mark


class LogBudget:
    """A token bucket: ``rate`` logs a second, a burst of as many; the rest are counted."""

    def __init__(self, rate: float, clock: Callable[[], float]) -> None:
        self.rate, self.clock = rate, clock
        self.tokens = rate
        self.at = clock()
        self.dropped = 0

    def take(self) -> bool:
        now = self.clock()
        self.tokens = min(self.rate, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        self.dropped += 1
        return False


def wait_answer(
    pop: Callable[[float], bytes | None],
    ask_id: str,
    timeout: float,
    clock: Callable[[], float] = time.monotonic,
) -> AskAnswer:
    """The answer ``pop(block_s)`` finds within ``timeout`` (popped in short blocks); one that
    does not parse, or answers another ask, is skipped. No answer in time: a refusal saying so."""
    deadline = clock() + timeout
    while (left := deadline - clock()) > 0:
        raw = pop(min(POP_BLOCK_S, left))
        if raw is None:
            continue
        try:
            answer = AskAnswer.model_validate_json(raw)
        except ValueError as exc:
            log.warning("ignored an answer to ask %s that is not an AskAnswer: %s", ask_id, exc)
            continue
        if answer.ask_id == ask_id:
            return answer
    return AskAnswer(ask_id=ask_id, ok=False, error=f"the MCP client did not answer within {timeout:g}s")


class CallRelay:
    """One call's logs and asks (the hooks ``MCPClientManager.call_tool_result`` takes)."""

    def __init__(
        self,
        call: ToolCall,
        channel: CallChannel | None,
        client_id: str | None,
        clock: Callable[[], float] = time.time,
        deadline: float | None = None,
    ) -> None:
        self.call, self.channel, self.client_id, self.clock = call, channel, client_id, clock
        self.tool = call.tool
        self.interactive = call.interactive
        self.budget = LogBudget(LOGS_PER_S, time.monotonic)
        # When an ask must have its answer: the call's own timeout bounds it (monotonic).
        self.deadline = deadline if deadline is not None else time.monotonic() + call.timeout_s

    # --- logs: on the MCP client's loop thread, quick, never raising -----------------------
    def log(self, level: LogLevel, logger: str | None, data: Any) -> None:
        if self.channel is None or not self.budget.take():
            return
        try:
            update = ToolLog(
                run_id=self.call.run_id,
                tree_id=self.call.tree_id,
                task_id=self.call.task_id,
                level=level,
                logger=logger[:MAX_LOGGER_CHARS] if logger else None,
                data=capped_data(data),
                at=self.clock(),
                client_id=self.client_id,
            )
            self.channel.log(update)
        except Exception:  # a log is best effort; the call goes on
            log.warning("a log message of task %s could not be passed on", self.call.task_id, exc_info=True)

    def close(self) -> None:
        if self.budget.dropped:
            log.info(
                "task %s (tool %s): dropped %d log message(s) of its MCP server (over %g a second)",
                self.call.task_id,
                self.tool,
                self.budget.dropped,
                LOGS_PER_S,
            )

    # --- asks ----------------------------------------------------------------------------
    async def ask(self, kind: AskKind, params: dict[str, Any]) -> dict[str, Any]:
        """The MCP client's result for ``params`` (as the spec spells it); AskRefused with why not."""
        what = "sampling" if kind == "sampling" else "elicitation"
        if not self.call.interactive:
            raise AskRefused(
                f"{what} is not available to calls from task trees: tool {self.tool!r} (task "
                f"{self.call.task_id!r} of tree {self.call.tree_id!r}) asked for it, but no MCP "
                "client waits for this call; call the tool through the MCP gateway to use it"
            )
        if self.channel is None:
            raise AskRefused(f"{what} for tool {self.tool!r}: this worker cannot pass requests on")
        if json_size(params) > MAX_ASK_BYTES:
            raise AskRefused(f"{what} for tool {self.tool!r}: the request is over {MAX_ASK_BYTES} bytes")
        timeout = self.deadline - time.monotonic()
        if timeout <= 0:
            raise AskRefused(f"{what} for tool {self.tool!r}: the call's time is up")
        ask = ToolAsk(
            run_id=self.call.run_id,
            tree_id=self.call.tree_id,
            task_id=self.call.task_id,
            ask_id=uuid.uuid4().hex,
            kind=kind,
            params=params,
            answer_by=time.time() + timeout,
            client_id=self.client_id,
        )
        channel = self.channel
        try:
            answer = await anyio.to_thread.run_sync(channel.ask, ask, timeout, abandon_on_cancel=True)
        except Exception as exc:  # the route failed (the broker away): the server gets why
            raise AskRefused(f"{what} for tool {self.tool!r} could not be passed on: {exc}") from exc
        if not answer.ok or answer.result is None:
            raise AskRefused(f"{what} for tool {self.tool!r}: {answer.error or 'no answer'}")
        return answer.result


__all__ = [
    "LOGS_PER_S",
    "AskRefused",
    "CallChannel",
    "CallRelay",
    "LogBudget",
    "capped_data",
    "level_passes",
    "wait_answer",
]
