"""Start a run as its message is popped, and its tool without waiting for the answer
(layer: client_agent, glue).

A call costs the agent's link to Redis a round trip for each reply it waits on. When kombu's
consumer pops a message (``workers.transport.GuardedChannel.vt_on_delivery``), ``EarlyBegin``
sends the run's begin (``workers.tasks.begin_commands``: the cancel check, the delivery count,
the mark) at once, on the consumer's thread, and its reply is read on a thread of its own
(``workers.sent_ahead``); kombu's unacked write goes out the same way (``vt_unacked_ahead``).
Both have left the process before the tool starts. What the task then waits for:

- a message kombu restored (``redelivered``: its agent died or lost its ack) waits for the
  begin's answer, as before: the poison count (``max_deliveries``) and the cancel check hold
  for it, so a tool that kills its agent is still stopped;
- a first delivery does not: its tool starts at once, counted as delivery 1 (another number
  means the same run was pushed twice, which only the client's own user can do). A cancel
  ends the task in the store, then takes a call still waiting in the client's queue out of
  it (``HotState.cancel_runs``), so only a call popped just before the cancel can start after
  it: its tool runs, and the store refuses its result; the run is recorded once, by the
  cancel. The answer, when it comes, is only logged. A begin answered before the task looks
  (on loopback, mostly) is used as it is: a run found cancelled then never starts.

A message the hook cannot read as a tool call of this client is left to the task, which says
why it drops it; one whose begin could not be sent is begun by the task itself.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from workers.contracts import RUN_TOOL_TASK, ToolCall
from workers.tasks import RunStart
from workers.transport import UnsafeMessage, body_bytes

log = logging.getLogger("vancetope.agent")

# Runs begun and not yet taken by their task: more means messages the task never ran
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


# Sends a run's begin now; the future holds its answer (``RunStart``'s).
SendBegin = Callable[[ToolCall, str, float], "Future[int | None]"]
# The number a first delivery's tool starts with, before the begin's answer is back.
FIRST_DELIVERY = 1


@dataclass(frozen=True)
class _Sent:
    answer: Future[int | None]
    redelivered: bool


def redelivered(message: dict[str, Any]) -> bool:
    """Whether kombu put this message back on its queue (``_do_restore_message`` says so)."""
    headers = message.get("headers") or {}
    info = (message.get("properties") or {}).get("delivery_info") or {}
    return bool(headers.get("redelivered") or info.get("redelivered"))


class EarlyBegin:
    """``on_delivery`` sends each run's begin as its message arrives; ``begin`` (the task's
    ``RunStart``) takes its answer, or for a first delivery does not wait for it (module
    docstring); without a begin sent, ``begin_now`` starts the run and waits."""

    def __init__(self, begin_now: RunStart, send: SendBegin, client_id: str, worker: str) -> None:
        self._begin_now = begin_now
        self._send = send
        self.client_id = client_id
        self.worker = worker
        self._lock = threading.Lock()
        self._pending: OrderedDict[str, _Sent] = OrderedDict()

    def on_delivery(self, message: dict[str, Any]) -> None:
        call = tool_call_of(message, self.client_id)
        if call is None:
            return
        try:
            answer = self._send(call, self.worker, time.time())
        except Exception as exc:  # noqa: BLE001 - the task begins it itself
            log.warning("could not send the begin of run %s (%s); the task begins it", call.run_id, exc)
            return
        with self._lock:
            self._pending[call.run_id] = _Sent(answer, redelivered(message))
            while len(self._pending) > MAX_PENDING:
                self._pending.popitem(last=False)

    def begin(self, call: ToolCall, worker: str, started_at: float) -> int | None:
        with self._lock:
            sent = self._pending.pop(call.run_id, None)
        if sent is None:
            return self._begin_now(call, worker, started_at)
        if sent.redelivered or sent.answer.done():
            try:
                return sent.answer.result()
            except Exception as exc:  # noqa: BLE001 - begun again below, where a failure is the task's
                log.warning("the begin of run %s failed (%s); beginning it again", call.run_id, exc)
                return self._begin_now(call, worker, started_at)
        sent.answer.add_done_callback(functools.partial(_confirmed, call))
        return FIRST_DELIVERY


def _confirmed(call: ToolCall, answer: Future[int | None]) -> None:
    """The begin's answer for a run whose tool started without it: only said."""
    try:
        number = answer.result()
    except Exception as exc:  # noqa: BLE001 - the result is written all the same; the store decides
        log.warning(
            "the begin of run %s of task %s got no answer (%s); its tool ran, and the store "
            "accepts its result only while the run is in flight",
            call.run_id,
            call.task_id,
            exc,
        )
        return
    if number is None:
        log.warning(
            "run %s of task %s was cancelled or is no longer its run, found after its tool "
            "started; the store refuses its result",
            call.run_id,
            call.task_id,
        )
    elif number != FIRST_DELIVERY:
        log.warning(
            "run %s of task %s was delivered %d times, not restored by kombu: the same message "
            "was pushed to this client's queue more than once",
            call.run_id,
            call.task_id,
            number,
        )
