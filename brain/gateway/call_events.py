"""What a gateway call's MCP server says while it runs, relayed to the MCP client that made the
call (layer: brain/gateway, SDK glue; issue 24).

The call's tree channel carries ``TreeEvent`` JSON besides plain wake-ups (``b"1"``): each
progress update (``ProgressEvent``), each log message (``LogEvent``) and each sampling or
elicitation request (``AskEvent``) of the call's run, published by the brain's intake whichever
route the call took. Here each one of *this* call (its task, its current run, where that run
was sent) goes to the MCP session of the request: progress as notifications/progress, logs as
notifications/message filtered by the session's logging/setLevel, and a request put to the
MCP client (``sampling/createMessage``, ``elicitation/create``), whose answer, or why there is
none, is written where the asking worker waits (a key of the client agent that runs the call,
or the server pool's). Anything else on the channel is a wake-up and nothing more.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import redis.asyncio
from mcp import types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ServerMessageMetadata
from pydantic import ValidationError

from brain.core.models import Progress, TaskRecord
from workers.call_relay import level_passes
from workers.contracts import (
    MAX_ASK_BYTES,
    MAX_ASK_ERROR_CHARS,
    TREE_EVENT,
    AskAnswer,
    AskEvent,
    LogEvent,
    LogLevel,
    ProgressEvent,
    ToolAsk,
    client_answer_key,
    client_key,
    json_size,
    key_answer,
)

log = logging.getLogger("vancetope.gateway")

# MCP sessions whose logging/setLevel is kept (the oldest forgotten first).
MAX_SESSIONS = 10_000


class SessionLevels:
    """Each MCP session's logging/setLevel (None: every level the server sent)."""

    def __init__(self, cap: int = MAX_SESSIONS) -> None:
        self.cap = cap
        self._levels: OrderedDict[str, LogLevel] = OrderedDict()

    def set(self, session: str | None, level: LogLevel) -> None:
        if session is None:
            return  # a stateless request: no session to keep it for
        self._levels[session] = level
        self._levels.move_to_end(session)
        while len(self._levels) > self.cap:
            self._levels.popitem(last=False)

    def get(self, session: str | None) -> LogLevel | None:
        return self._levels.get(session) if session is not None else None


def answer_key(ask: ToolAsk) -> str:
    """Where the worker that asked waits: its client's own key, or the server pool's."""
    if ask.client_id is None:
        return key_answer(ask.ask_id)
    return client_key(ask.client_id, client_answer_key(ask.ask_id))


def ours(ask_or_update: Any, task_id: str, rec: TaskRecord | None) -> bool:
    """Whether an event speaks of this call's current run, where it was sent. Pure."""
    return (
        rec is not None
        and ask_or_update.task_id == task_id
        and ask_or_update.run_id == rec.run_id
        and ask_or_update.client_id == rec.client_id
    )


class CallEvents:
    """One gateway call's relay: ``handle`` each message of its tree's channel."""

    def __init__(
        self,
        ctx: ServerRequestContext[Any, Any],
        aredis: redis.asyncio.Redis | None,
        task_id: str,
        level: LogLevel | None,
        reread: Callable[[], Awaitable[TaskRecord]] | None = None,
    ) -> None:
        self.ctx, self.aredis, self.task_id, self.level = ctx, aredis, task_id, level
        # The call's record as last read: what an event must match (its run, its client).
        self.current: TaskRecord | None = None
        self.reread = reread
        self.last_at = float("-inf")  # when the last progress relayed was reported
        self.last: tuple[float, float | None, str | None] | None = None

    async def handle(self, raw: bytes) -> None:
        if raw == b"1" or not raw.startswith(b"{"):
            return  # a wake-up
        try:
            event = TREE_EVENT.validate_json(raw)
        except ValidationError:
            log.debug("ignored a tree event that is not one: %r", raw[:200])
            return
        if isinstance(event, ProgressEvent):
            if await self._ours(event.progress):
                p = event.progress
                await self._progress(p.progress, p.total, p.message, p.at)
        elif isinstance(event, LogEvent):
            await self._log(event)
        elif isinstance(event, AskEvent):
            await self._ask(event.ask)

    async def _ours(self, update: Any) -> bool:
        """Whether ``update`` is of this call's current run. The record read last may be older
        than the run that speaks (read while the call was still queued, or before a retry was
        sent): an event of this task that does not match has the record read once more."""
        if ours(update, self.task_id, self.current):
            return True
        if update.task_id != self.task_id or self.reread is None:
            return False
        self.current = await self.reread()
        return ours(update, self.task_id, self.current)

    # --- progress --------------------------------------------------------------------
    async def progress_from_record(self, rec: TaskRecord) -> None:
        progress: Progress | None = rec.progress
        if progress is not None and progress.at > self.last_at:
            await self._progress(progress.progress, progress.total, progress.message, progress.at)

    async def _progress(self, progress: float, total: float | None, message: str | None, at: float) -> None:
        values = (progress, total, message)
        if at < self.last_at or (at == self.last_at and values == self.last):
            return  # older than, or the same as, what was relayed
        self.last_at, self.last = at, values
        await self.ctx.session.report_progress(progress, total, message)

    # --- logs ------------------------------------------------------------------------
    async def _log(self, event: LogEvent) -> None:
        update = event.log
        if not await self._ours(update) or not level_passes(update.level, self.level):
            return
        await self.ctx.session.send_log_message(
            update.level, update.data, update.logger, related_request_id=self.ctx.request_id
        )

    # --- sampling and elicitation ----------------------------------------------------------
    async def _ask(self, ask: ToolAsk) -> None:
        if not await self._ours(ask):
            log.warning(
                "ignored a %s request for task %s (run %s, client %s): not this call's current run",
                ask.kind,
                ask.task_id,
                ask.run_id,
                ask.client_id,
            )
            return
        answer: AskAnswer | None = None
        # Not past when the worker stops waiting: after it, nobody would read the answer (and
        # its key would stay: the gateway may not set a TTL, brain.hot.acl).
        with anyio.move_on_after(ask.answer_by - time.time()):
            try:
                result = await self._put(ask)
                answer = AskAnswer(ask_id=ask.ask_id, ok=True, result=result)
            except Exception as exc:  # noqa: BLE001 - whatever failed, the worker waits for a word
                answer = AskAnswer(ask_id=ask.ask_id, ok=False, error=_why(ask, exc))
        if answer is None or time.time() >= ask.answer_by:
            log.info(
                "the %s request of task %s was not answered before its call stopped waiting",
                ask.kind,
                ask.task_id,
            )
            return
        if self.aredis is not None:  # None: not serving (a test's gateway), nobody waits
            await self.aredis.lpush(answer_key(ask), answer.model_dump_json())

    async def _put(self, ask: ToolAsk) -> dict[str, Any]:
        """The MCP client's answer to ``ask`` as JSON; MCPError when it has not the capability,
        refuses or fails, ValidationError when the request or the answer is not valid."""
        session = self.ctx.session
        metadata = ServerMessageMetadata(related_request_id=self.ctx.request_id)
        if ask.kind == "sampling":
            if not session.check_client_capability(
                types.ClientCapabilities(sampling=types.SamplingCapability())
            ):
                raise MCPError(types.INVALID_REQUEST, "the MCP client does not offer sampling")
            params = types.CreateMessageRequestParams.model_validate(ask.params)
            model: type[types.CreateMessageResult | types.CreateMessageResultWithTools] = (
                types.CreateMessageResultWithTools if params.tools else types.CreateMessageResult
            )
            result: Any = await session.send_request(
                types.CreateMessageRequest(params=params), model, metadata=metadata
            )
        else:
            capability = types.ClientCapabilities(elicitation=types.ElicitationCapability())
            if not session.check_client_capability(capability):
                raise MCPError(types.INVALID_REQUEST, "the MCP client does not offer elicitation")
            form = ask.params.get("mode", "form") == "form"
            request = types.ElicitRequest(
                params=(
                    types.ElicitRequestFormParams if form else types.ElicitRequestURLParams
                ).model_validate(ask.params)
            )
            result = await session.send_request(request, types.ElicitResult, metadata=metadata)
        data: dict[str, Any] = result.model_dump(mode="json", by_alias=True, exclude_none=True)
        if json_size(data) > MAX_ASK_BYTES:
            raise ValueError(f"the MCP client's answer is over {MAX_ASK_BYTES} bytes")
        return data


def _why(ask: ToolAsk, exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        reason = f"not valid: {exc.errors()[0]['msg']}"
    else:
        reason = exc.message if isinstance(exc, MCPError) else str(exc)
    return f"{ask.kind} refused by the gateway's MCP client: {reason}"[:MAX_ASK_ERROR_CHARS]


__all__ = ["CallEvents", "SessionLevels", "answer_key", "ours"]
