"""Start a run while kombu reserves its message (layer: client_agent, glue).

A call costs the agent's link to Redis a round trip for each step it waits on. kombu's
consumer pops a message and then writes it to its unacked hash (a round trip, on the
consumer's thread); the run then starts (``workers.tasks.begin_run``: the cancel check, the
delivery count, another round trip). Nothing makes the second wait
for the first, so ``EarlyBegin`` starts the run on a thread of its own the moment the message
is popped (``workers.transport.GuardedChannel.vt_on_delivery``), and the task takes that
answer when it runs. On a workstation 100 ms from Redis that is 200 ms off every call.

What ``begin_run`` guarantees is unchanged: a run is started only by that transaction, which
checks the cancel set, so a cancelled run still never starts. What moves is when: a run is
counted and shown ``running`` when its message is reserved rather than a moment later when a
pool thread takes it (the agent's prefetch is one message per pool thread, so no message waits
reserved for long). A message the hook cannot read as a tool call of this client is left to the
task, which says why it drops it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from pydantic import ValidationError

from workers.contracts import RUN_TOOL_TASK, ToolCall
from workers.tasks import RunStart
from workers.transport import UnsafeMessage, body_bytes

log = logging.getLogger("vancetope.agent")

# Runs started and not yet taken by their task: more means messages the task never ran
# (dropped by Celery); the oldest are forgotten.
MAX_PENDING = 256


def tool_call_of(message: dict[str, Any], client_id: str) -> ToolCall | None:
    """The tool call a checked kombu message carries for ``client_id``, else None."""
    headers = message.get("headers") or {}
    if headers.get("task") != RUN_TOOL_TASK:
        return None
    try:
        args, _kwargs, _embed = json.loads(body_bytes(message))
        call = ToolCall.model_validate(args[0])
    except (UnsafeMessage, ValidationError, ValueError, TypeError, IndexError, KeyError):
        return None
    return call if call.client_id == client_id else None


class EarlyBegin:
    """``on_delivery`` starts each run as its message arrives; ``begin`` (the task's
    ``RunStart``) takes that answer, or starts the run itself when there is none."""

    def __init__(self, begin: RunStart, client_id: str, worker: str) -> None:
        self._begin = begin
        self.client_id = client_id
        self.worker = worker
        self._lock = threading.Lock()
        self._pending: OrderedDict[str, Future[int | None]] = OrderedDict()
        # Two threads: a pool of -c 2 takes two messages at once.
        self._threads = ThreadPoolExecutor(max_workers=2, thread_name_prefix="vancetope-begin")

    def on_delivery(self, message: dict[str, Any]) -> None:
        call = tool_call_of(message, self.client_id)
        if call is None:
            return
        future = self._threads.submit(self._begin, call, self.worker, time.time())
        with self._lock:
            self._pending[call.run_id] = future
            while len(self._pending) > MAX_PENDING:
                self._pending.popitem(last=False)

    def begin(self, call: ToolCall, worker: str, started_at: float) -> int | None:
        with self._lock:
            future = self._pending.pop(call.run_id, None)
        if future is not None:
            try:
                return future.result()
            except Exception as exc:  # noqa: BLE001 - started again below, where a failure is the task's
                log.warning("starting run %s early failed (%s); starting it now", call.run_id, exc)
        return self._begin(call, worker, started_at)

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)
