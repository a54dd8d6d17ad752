"""ToolCall -> Celery message (layer: brain/runtime; Celery glue). One job: publish a call on
the queue its route names.

The Celery task id is the run id, so Flower, the reconciler and the store all name
one attempt the same way. A call for a client goes through a connection carrying
that client's key prefix (docs/security.md, "A workstation"), so it lands in ``c:<id>:client.<id>``
where only that client's agent can read it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from celery import Celery
from celery.events import Event
from celery.events.event import get_exchange
from celery.utils.nodenames import anon_nodename
from celery.utils.time import utcoffset

from brain.hot.gate import INBOX_PREFIX, Gate, Lane, Waiting
from workers.app import make_app
from workers.contracts import (
    MAX_MESSAGE_BYTES,
    REFILLS_WINDOW_HEADER,
    RUN_TOOL_TASK,
    ToolCall,
    broker_priority,
    client_keyprefix,
    client_queue,
    pool_queue,
)
from workers.lease import VISIBILITY_TIMEOUT_S

# Margins over the tool's own timeout: the executor answers first; these only stop a
# worker child that hangs past it (the hard limit kills it, the message is re-delivered).
_SOFT_MARGIN_S = 10.0
_HARD_MARGIN_S = 30.0

log = logging.getLogger("vancetope.brain")
# Run ids per revoke broadcast: one PUBLISH each, and one "Tasks flagged as revoked" line in each
# pool's log; far under the pools' message size cap.
REVOKE_CHUNK = 1000


class Publisher:
    """Sends tool calls, and for a server pool's calls the ``task-sent`` events Flower shows
    while a call waits in its queue (``task_send_sent_event`` is off in the app: Celery sends
    one event message per task; here a batch's events go out as one ``task.multi``, as a
    worker sends its own, after the batch's calls). A client's call gets none: its queue's
    events would land under the client's key prefix, where Flower does not listen; the brain
    reports a client's calls itself (``brain.runtime.events``). The events ride in the batch's own
    pipeline, after its calls: no round trip of their own."""

    def __init__(self, app: Celery, *, task_events: bool = True, gate: Gate | None = None) -> None:
        self.app = app
        self.task_events = task_events  # Settings.task_events: off, no task-sent events
        # Calls with limits wait at the gate (brain.hot.gate); without one every call goes straight.
        self.gate = gate
        self._client_apps: dict[str, Celery] = {}
        self._client_queues = bool((app.conf.broker_transport_options or {}).get("vt_client_queues"))
        # The relay thread and the Celery thread both dispatch: one app (and pool) per client
        # prefix, built once, when the main app does not put client queues under their prefix.
        self._lock = threading.Lock()
        self._local = threading.local()

    def drop_queued(self, run_ids: list[str]) -> None:
        """Ask every server pool to drop these runs' messages when it reaches them: Celery's own
        ``revoke`` (never ``terminate``, which kills whatever the pool process runs by then), a
        broadcast each worker keeps in memory (``worker_revoke_expires``, at most 50,000 ids), so
        the pool's main process acks them on receipt. Without it a cancelled tree's calls still
        in the server queue went one by one to a pool process that began each, found it cancelled
        and ended it: 5,000 of them took as long to drain as to run, and other users' calls
        waited behind them. A pool that misses the broadcast (started later, or away) still
        refuses each at its begin."""
        for start in range(0, len(run_ids), REVOKE_CHUNK):
            self.app.control.revoke(run_ids[start : start + REVOKE_CHUNK])

    def app_for(self, client_id: str | None) -> Celery:
        """The app that sends to ``client_id``'s queue (None: a pool's): the main app when its
        channel puts client queues under their prefix (``make_app(client_queues=True)``, the
        brain's), else an app of that client's prefix, kept."""
        if client_id is None or self._client_queues:
            return self.app
        return self._prefixed(client_keyprefix(client_id))

    def _prefixed(self, keyprefix: str) -> Celery:
        """An app whose keys all carry ``keyprefix``: a client's own keys, or the gate's inbox."""
        with self._lock:
            app = self._client_apps.get(keyprefix)
            if app is None:
                opts = self.app.conf.broker_transport_options or {}
                app = self._client_apps[keyprefix] = make_app(
                    self.app.conf.broker_url,
                    visibility_timeout_s=int(opts.get("visibility_timeout", VISIBILITY_TIMEOUT_S)),
                    keyprefix=keyprefix,
                    max_message_bytes=int(opts.get("vt_max_message_bytes", MAX_MESSAGE_BYTES)),
                    sentinel_master=opts.get("master_name"),
                )
            return app

    def close(self) -> None:
        """Release the per-client connection pools (the main app is the caller's)."""
        with self._lock:
            for app in self._client_apps.values():
                app.close()
            self._client_apps.clear()

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Messages sent inside go to Redis in pipelines (kombu's ``Producer.batch``: each
        message's LPUSH and its task-sent event), flushed when the block exits; a message
        costs a fraction of a round trip instead of two. Nested batches join the outer one."""
        if getattr(self._local, "producers", None) is not None:
            yield
            return
        sent: list[dict[str, Any]] = []
        gated: list[Waiting] = []
        with ExitStack() as stack:
            self._local.producers, self._local.stack, self._local.sent = {}, stack, sent
            self._local.gated = gated
            try:
                yield
                if gated and self.gate is not None:
                    # The lanes and runs are recorded before their messages are flushed.
                    self.gate.enqueue(gated)
                # Last in the pipeline, so after the calls; flushed with them when the stack exits.
                self._publish_events(sent)
            finally:
                self._local.producers = self._local.stack = self._local.sent = None
                self._local.gated = None
        if gated and self.gate is not None:
            try:
                self.gate.admit()
            except Exception:  # the brain's gate timer admits them at its next turn
                log.warning(
                    "could not run the gate after putting %d call(s) there", len(gated), exc_info=True
                )

    def _producer(self, app: Celery) -> Any:
        producers: dict[int, Any] | None = getattr(self._local, "producers", None)
        if producers is None:
            return None
        producer = producers.get(id(app))
        if producer is None:
            stack: ExitStack = self._local.stack
            producer = producers[id(app)] = stack.enter_context(app.producer_or_acquire())
            stack.enter_context(producer.batch())
        return producer

    def send(
        self, call: ToolCall, pool: str | None = None, lane: Lane | None = None, priority: int | None = None
    ) -> None:
        """Publish ``call`` on its client's queue, else on ``pool``'s (None: the default pool);
        with ``lane`` (a server call with limits), into that lane's wait list at the gate.
        ``priority`` (0-9, 9 first) of a server call sent straight to its pool's queue: the
        pool takes higher ones first (``workers.contracts.broker_priority``)."""
        if getattr(self._local, "producers", None) is None:
            with self.batch():  # a batch of one: the call and its event in one pipeline
                self.send(call, pool, lane, priority)
            return
        gated = lane is not None and self.gate is not None and call.client_id is None
        # Every gated call goes to its pool's inbox at the gate, under one key prefix: one app
        # and connection for them all (one per lane was a new connection per tree, kept open).
        app = self._prefixed(INBOX_PREFIX) if gated else self.app_for(call.client_id)
        queue = pool_queue(pool) if call.client_id is None else client_queue(call.client_id)
        limit_cap = float(app.conf.task_time_limit or 3600)
        time_limit = min(call.timeout_s + _HARD_MARGIN_S, limit_cap)
        if gated and lane is not None:
            call = call.model_copy(update={"holds_slot": lane.holds_slot})
            # A slot outlives a run whose worker died until its message is delivered again
            # (visibility timeout + 5 s) and that delivery ran out its hard limit.
            lease_s = time_limit + VISIBILITY_TIMEOUT_S + 35
            self._local.gated.append(Waiting(call.run_id, lane, int(lease_s * 1000)))
        app.send_task(
            RUN_TOOL_TASK,
            producer=self._producer(app),
            args=[call.model_dump(mode="json")],
            task_id=call.run_id,
            queue=queue,
            soft_time_limit=min(call.timeout_s + _SOFT_MARGIN_S, limit_cap - 1),
            time_limit=time_limit,
            # What Flower shows as the task's arguments: the tool and the names of its
            # arguments, never their values (they may hold file contents or upstream
            # results). Celery's default, a saferepr of the whole call, was also a third of
            # the cost of sending.
            argsrepr=args_summary(call),
            kwargsrepr="{}",
            # The default exchange routes by queue name; nothing needs declaring per message.
            declare=[],
            headers={REFILLS_WINDOW_HEADER: True}
            if gated and lane is not None and lane.refills_window
            else None,
            # A client's queue is its own and in order; a gated call's order is the gate's.
            priority=None
            if gated or call.client_id is not None or priority is None
            else broker_priority(priority),
        )
        if call.client_id is None and self.task_events:
            self._local.sent.append(sent_event(call, queue))

    def _publish_events(self, sent: list[dict[str, Any]]) -> None:
        """``task-sent`` events for Flower as one ``task.multi`` message (after the batch's calls).
        Watching is not correctness: a failure is logged, never raised (the calls still go out)."""
        if not sent:
            return
        try:
            publish_task_events(self.app, self._producer(self.app), "task-sent", sent)
        except Exception:
            log.warning("could not send %d task-sent event(s) to Flower", len(sent), exc_info=True)


def publish_task_events(app: Celery, producer: Any, event_type: str, events: list[dict[str, Any]]) -> None:
    """Task events of one type as one ``task.multi`` message, as Celery's buffered event
    dispatcher sends a worker's (same fields, exchange and headers), under this process's
    anonymous node name (a client's, as Celery's own ``task-sent``: not a worker Flower lists)."""
    exchange = get_exchange(producer.connection, name=app.conf.event_exchange)
    hostname, pid, offset = anon_nodename(), os.getpid(), utcoffset()
    body = [
        Event(event_type, hostname=hostname, utcoffset=offset, pid=pid, clock=app.clock.forward(), **fields)
        for fields in events
    ]
    producer.publish(
        body,
        routing_key="task.multi",
        exchange=exchange.name,
        declare=[exchange],
        serializer=app.conf.event_serializer,
        headers={"hostname": hostname},
        delivery_mode=1,  # transient, as Celery's dispatcher sends events
        retry=False,
    )


def send_task_events(app: Celery, event_type: str, events: list[dict[str, Any]]) -> None:
    """``publish_task_events`` on a producer of its own (outside a batch of calls). Watching is
    not correctness: a failure is logged, never raised (a lost event is not a lost call)."""
    try:
        with app.producer_or_acquire() as producer:
            publish_task_events(app, producer, event_type, events)
    except Exception:
        log.warning("could not send %d %s event(s) to Flower", len(events), event_type, exc_info=True)


def sent_event(call: ToolCall, queue: str) -> dict[str, Any]:
    """The fields Celery's own ``task-sent`` carries (``celery.app.amqp``), arguments by name only."""
    return {
        "uuid": call.run_id,
        "root_id": call.run_id,
        "parent_id": None,
        "name": RUN_TOOL_TASK,
        "args": args_summary(call),
        "kwargs": "{}",
        "retries": 0,
        "eta": None,
        "expires": None,
        "queue": queue,
        "exchange": "",
        "routing_key": queue,
        "timestamp": time.time(),
    }


def args_summary(call: ToolCall) -> str:
    """``tool(arg, ...)`` with the argument names only."""
    return f"{call.tool}({', '.join(sorted(call.args))})"
