"""Client agents in Flower (layer: brain/runtime; Celery glue).

Client agents run with events off (they could otherwise read every worker's events
on the shared channel, docs/security.md), so the brain speaks for them: it sends
worker-online / heartbeat / offline under ``client-agent@<id>`` and the task events of
the calls it routes to them. Flower then lists each agent beside the server workers.
"""

from __future__ import annotations

import logging
import os
import platform
import queue
import threading
import time
from collections import OrderedDict
from typing import Any

from celery import Celery
from celery.events import Event, EventDispatcher
from celery.utils.time import utcoffset

from brain.runtime.dispatch import args_summary
from workers.contracts import (
    RUN_TOOL_TASK,
    TASK_REVOKED_EVENT,
    TERMINATED_FIELDS,
    ToolAwaiting,
    ToolCall,
    ToolProgress,
    ToolResult,
    ToolStarted,
    shown_failure,
)
from workers.errors import Cancelled

log = logging.getLogger("vancetope.brain")

HEARTBEAT_S = 2.0
# The agents' heartbeats go out together (``ClientEvents.heartbeats``): this many to a
# message, so one message stays a few tens of KB however many clients are connected.
BEATS_PER_MESSAGE = 200
# Their routing key: not under ``worker.#``, which every Celery worker's gossip (the brain's,
# the pools') subscribes to: gossip reads one event a message and logs an error for a list, and
# it has no use for the agents' heartbeats (it took ~9 % of the brain's core with 1,000 agents).
# Flower's receiver subscribes to every routing key (``#``) and reads each event of a list.
BEATS_ROUTING_KEY = "agent.heartbeats"
# The queue item standing for the heartbeats of several clients (``ClientEvents.heartbeats``).
_BEATS = "worker-heartbeat*"


def agent_hostname(client_id: str) -> str:
    return f"client-agent@{client_id}"


# How long ``close`` waits for the events still queued to go out (a sender still busy then
# finishes them on its own, and then lets its connection go).
DRAIN_S = 2.0
# How long the sender lets events gather before sending them: a client call's three task
# events then go out with others as one ``task.multi`` message instead of three PUBLISHes,
# and not while the call's own result is being recorded (the same window as the server
# pool's, ``workers.event_batching``). With 10 ms, a brain recording a few hundred client
# results a second sent nearly one message per result, a kombu publish each: with two brains
# sharing the results that cost each as much as one brain's (bench/README.md, "The CPU rows").
GATHER_S = 0.1
# Runs whose end was sent, remembered so that a late "started" or "progress" of one is not
# (most recent first forgotten last; a run's late event comes within seconds of its end).
ENDED_KEPT = 10_000
# Task events of one client to a message at most (a dispatcher flushes when it holds this many):
# one message of all a 50,000-call cancel's revoked events was ~12 MB, past Redis's
# proto-max-bulk-len (8 MB), and the reset connection lost them all. 1,000 is ~250 KB.
EVENTS_PER_MESSAGE = 1000
# A client call's RETRY is said again this long after: Celery's event state lets any event
# replace RETRY, and the "received" of the call was sent by the process that published it
# (the CLI, a schedule, the gateway's door), whose events may reach Flower after this one's.
RESTATE_RETRY_S = 3.0


class ClientEvents:
    """Sends from a thread of its own: an event is a PUBLISH, a round trip, and neither a
    client's call nor its result should wait for Flower's copy of it (on the client round
    trip they were three of the brain's round trips). The sender lets them gather for
    ``GATHER_S`` and sends a client's task events as one ``task.multi`` message (each
    ``kombu`` publish costs more CPU than the call's own record). Events keep their order
    and the time they happened; Flower sees them up to ``GATHER_S`` later.

    Each sender thread opens its own connection and releases it itself when it stops, also
    one that is still sending when ``close`` gives up waiting: no other thread touches it."""

    def __init__(self, app: Celery, *, task_events: bool = True) -> None:
        self.app = app
        # Settings.task_events: off, only the agents' worker events (Flower still lists them).
        self.task_events = task_events
        self._lock = threading.Lock()
        # The sender thread's connection and its dispatchers (``_dispatcher``, ``_release``).
        self._link = threading.local()
        self._queue: queue.SimpleQueue[tuple[str, str, dict[str, Any]] | None] = queue.SimpleQueue()
        self._sender: threading.Thread | None = None
        self._pid = 0
        # Celery's event state (Flower's) lets any event replace RETRY, so a "received" queued
        # after a run's "retried" turned it back to RECEIVED for good (seen in CI: a client call
        # that failed at once, its end sent by the relay before the thread that published it
        # sent its "received"). Ends are noted here and checked under ``_order``, with the
        # event queued in the same step.
        self._order = threading.Lock()
        # Each ended run's last end event: a RETRY is said again only while it is the last.
        self._ended: OrderedDict[str, str] = OrderedDict()
        self._restates: set[threading.Timer] = set()

    def _dispatcher(self, client_id: str) -> EventDispatcher:
        """The calling sender's dispatcher for ``client_id``, on that sender's connection."""
        link = self._link
        if not hasattr(link, "dispatchers"):
            link.conn, link.dispatchers = self.app.connection_for_write(), {}
        dispatchers: dict[str, EventDispatcher] = link.dispatchers
        d = dispatchers.get(client_id)
        if d is None:
            d = dispatchers[client_id] = self.app.events.Dispatcher(
                link.conn,
                hostname=agent_hostname(client_id),
                enabled=True,
                # task-* events wait in the dispatcher until flush(), or until it holds a
                # message's worth; worker-* go at once
                buffer_group=("task",),
                buffer_limit=EVENTS_PER_MESSAGE,
                buffer_while_offline=False,
            )
        return d

    def _send_unless_ended(self, client_id: str, run_id: str, event: str, **fields: Any) -> None:
        """A running call's event (started, progress, awaiting): dropped once its end was sent."""
        with self._order:
            if run_id not in self._ended:
                self._send(client_id, event, uuid=run_id, **fields)

    def _send_end(
        self,
        client_id: str,
        run_id: str,
        events: list[tuple[str, dict[str, Any]]],
        *,
        unless_ended: bool = False,
    ) -> None:
        with self._order:
            if unless_ended and run_id in self._ended:
                return
            self._ended[run_id] = events[-1][0]
            self._ended.move_to_end(run_id)
            while len(self._ended) > ENDED_KEPT:
                self._ended.popitem(last=False)
            for event, fields in events:
                self._send(client_id, event, uuid=run_id, **fields)

    def _send(self, client_id: str, event: str, **fields: Any) -> None:
        if not self.task_events and event.startswith("task-"):
            return
        fields.setdefault("timestamp", time.time())
        if self._sender is None or self._pid != os.getpid():
            self._start_sender()
        self._queue.put((client_id, event, fields))

    def _start_sender(self) -> None:
        with self._lock:
            if self._sender is not None and self._pid == os.getpid():
                return
            if self._pid != os.getpid():
                # Forked: the parent's thread, queue and connection are not this process's (its
                # connection lives in its sender's ``_link``, which no thread here reads).
                self._pid = os.getpid()
            # Each sender its own queue: one that outlived close()'s wait drains only its own.
            self._queue = queue.SimpleQueue()
            self._sender = threading.Thread(
                target=self._run_sender, args=(self._queue,), name="vancetope-flower-events", daemon=True
            )
            self._sender.start()

    def _run_sender(self, events: queue.SimpleQueue[tuple[str, str, dict[str, Any]] | None]) -> None:
        try:
            done = False
            while not done and (first := events.get()) is not None:
                batch = [first]
                # Asleep while the rest gathers: an event put meanwhile wakes no thread, so the
                # call or result that sent it is not interrupted by this one.
                time.sleep(GATHER_S)
                while True:
                    try:
                        item = events.get_nowait()
                    except queue.Empty:
                        break
                    if item is None:
                        done = True  # close(): send what is here, then stop
                        break
                    batch.append(item)
                self._send_batch(batch)
        finally:
            self._release()

    def _send_batch(self, batch: list[tuple[str, str, dict[str, Any]]]) -> None:
        # Events are for watching, not for correctness: a failed send is logged, never raised.
        used: dict[str, Any] = {}
        for client_id, event, fields in batch:
            if event == _BEATS:
                self._send_beats(fields)
                continue
            try:
                dispatcher = used[client_id] = self._dispatcher(client_id)
                dispatcher.send(event, **fields)
            except Exception:
                log.warning("could not send %s for client %s to Flower", event, client_id, exc_info=True)
        for client_id, dispatcher in used.items():
            try:
                dispatcher.flush()
            except Exception:
                log.warning("could not send task events for client %s to Flower", client_id, exc_info=True)

    def _send_beats(self, fields: dict[str, Any]) -> None:
        """Several clients' heartbeats as lists of events, ``BEATS_PER_MESSAGE`` to a message: a
        list body is how Celery sends its ``task.multi`` (``EventDispatcher.flush``), and Celery's
        receiver (Flower's) reads every event of one, each under its own ``hostname``. A kombu
        publish per client per sweep was a third of the brain's CPU with 1,000 clients idle."""
        clients: list[str] = fields.pop("clients")
        try:
            # A dispatcher of its own for the producer and exchange: each event names its agent.
            d = self._dispatcher("")
            events = [
                Event(
                    "worker-heartbeat",
                    hostname=agent_hostname(cid),
                    utcoffset=utcoffset(),
                    pid=d.pid,
                    clock=d.clock.forward(),
                    **fields,
                )
                for cid in clients
            ]
            for i in range(0, len(events), BEATS_PER_MESSAGE):
                d.producer.publish(
                    events[i : i + BEATS_PER_MESSAGE],
                    routing_key=BEATS_ROUTING_KEY,
                    exchange=d.exchange.name,
                    declare=[d.exchange],
                    serializer=d.serializer,
                    headers=d.headers,
                    delivery_mode=d.delivery_mode,
                )
        except Exception:
            log.warning(
                "could not send the heartbeats of %d client(s) to Flower", len(clients), exc_info=True
            )

    def _release(self) -> None:
        """Let the calling sender's dispatchers and connection go (it is stopping)."""
        link = self._link
        if not hasattr(link, "dispatchers"):
            return
        dispatchers: dict[str, EventDispatcher] = link.dispatchers
        conn, link.conn = link.conn, None
        del link.dispatchers
        for client_id, d in dispatchers.items():
            try:
                d.close()
            except Exception:
                log.warning("could not close the Flower events of client %s", client_id, exc_info=True)
        try:
            conn.release()
        except Exception:
            log.warning("could not close the connection for Flower events", exc_info=True)

    def _worker_fields(self) -> dict[str, Any]:
        return {
            "freq": HEARTBEAT_S,
            "sw_ident": "vancetope-agent",
            "sw_ver": "0.1",
            "sw_sys": platform.system(),
        }

    def online(self, client_id: str) -> None:
        self._send(client_id, "worker-online", **self._worker_fields())

    def heartbeat(self, client_id: str, active: int = 0) -> None:
        self._send(client_id, "worker-heartbeat", active=active, processed=0, **self._worker_fields())

    def heartbeats(self, client_ids: list[str]) -> None:
        """The heartbeats of all ``client_ids`` at once: a few messages, not one per client."""
        if client_ids:
            self._send("", _BEATS, clients=list(client_ids), active=0, processed=0, **self._worker_fields())

    def offline(self, client_id: str) -> None:
        self._send(client_id, "worker-offline", **self._worker_fields())

    def task_sent(self, call: ToolCall) -> None:
        if call.client_id is None:
            return
        # Sent after the call was published: a call that fails at once may have ended (and its
        # end been sent) first, and a "received" then would replace its RETRY in Flower.
        self._send_unless_ended(
            call.client_id,
            call.run_id,
            "task-received",
            name=RUN_TOOL_TASK,
            args=args_summary(call),  # as for the server pool's tasks: argument names, no values
            kwargs="{}",
            retries=0,
            eta=None,
            root_id=call.run_id,
            parent_id=None,
        )

    def task_done(self, result: ToolResult, *, unless_ended: bool = False, task_ended: bool = False) -> None:
        """A client's call ended as its agent says; ``unless_ended``: not if this brain already
        sent its run an end (a result refused, of a run it said was revoked or lost).
        ``task_ended``: the brain had ended its task (cancelled, expired) while it ran, so an
        agent's ``Cancelled`` is that end, shown REVOKED; any other result is shown as the agent
        says (a ``Cancelled`` the store recorded as the task's failure is a FAILURE)."""
        if result.client_id is None:
            return
        runtime = max(result.finished_at - result.started_at, 0.0)
        if result.ok:
            summary = repr({"ok": True, "tool": result.tool, "task": result.task_id})
            end = ("task-succeeded", {"runtime": runtime, "result": summary})
        elif task_ended and result.error is not None and result.error.type == Cancelled.__name__:
            # Its agent gave it up, its task cancelled or expired (``workers.call_stop``, or held
            # for approval): REVOKED, as a server pool shows a call it stopped; not a FAILURE.
            end = (TASK_REVOKED_EVENT, dict(TERMINATED_FIELDS))
        else:
            # As a server pool's task shows it (workers.contracts.shown_failure): never the message.
            end = ("task-failed", {"exception": shown_failure(result), "traceback": ""})
        started = ("task-started", {"timestamp": result.started_at})
        self._send_end(result.client_id, result.run_id, [started, end], unless_ended=unless_ended)

    def task_retried(self, result: ToolResult, next_at: float) -> None:
        """A client's call failed and is tried again at ``next_at``: Flower shows RETRY, as for
        a Celery task that retries (a server pool's task raises ``Retry`` itself)."""
        if result.client_id is None:
            return
        shown = (
            f"{shown_failure(result)}; next attempt at {time.strftime('%H:%M:%S', time.localtime(next_at))}"
        )
        started = ("task-started", {"timestamp": result.started_at})
        retried = {"exception": shown, "traceback": "", "timestamp": time.time()}
        self._send_end(result.client_id, result.run_id, [started, ("task-retried", retried)])
        # Said again: a late "received" from another process would otherwise show for good.
        timer = threading.Timer(RESTATE_RETRY_S, self._restate, (result.client_id, result.run_id, retried))
        timer.daemon = True
        with self._lock:
            self._restates.add(timer)
        timer.start()

    def _restate(self, client_id: str, run_id: str, fields: dict[str, Any]) -> None:
        with self._lock:
            self._restates.discard(threading.current_thread())  # type: ignore[arg-type]  # this timer
        with self._order:
            # Not once the brain ended it since (its task cancelled while it waited to retry).
            if self._ended.get(run_id) == "task-retried":
                self._send(client_id, "task-retried", uuid=run_id, **fields)

    def task_revoked(self, client_id: str, run_id: str, **fields: Any) -> None:
        """A client's call the brain ended before its agent began it (``brain.runtime.revoked``,
        ``fields`` Celery's): REVOKED, and a late "started" or "progress" of it is dropped."""
        self.task_ended_by_brain(client_id, run_id, TASK_REVOKED_EVENT, fields)

    def task_ended_by_brain(self, client_id: str, run_id: str, event: str, fields: dict[str, Any]) -> None:
        """A client's run the brain ended for its agent (``brain.runtime.revoked``): ``event``
        with ``fields`` ends it in Flower, and a late "started" or "progress" of it is dropped."""
        self._send_end(client_id, run_id, [(event, fields)])

    def task_started(self, started: ToolStarted) -> None:
        """A client's call began: Flower shows it STARTED until it ends (or awaits approval)."""
        if started.client_id is None:
            return
        self._send_unless_ended(
            started.client_id, started.run_id, "task-started", timestamp=started.started_at
        )

    def task_progress(self, update: ToolProgress) -> None:
        """A client's call reporting progress: Flower shows the task as PROGRESS meanwhile."""
        if update.client_id is None:
            return
        self._send_unless_ended(
            update.client_id,
            update.run_id,
            "task-progress",
            progress=update.progress,
            total=update.total,
            message=update.message or "",
        )

    def task_awaiting(self, update: ToolAwaiting) -> None:
        """A client's call held for its user's approval: Flower shows AWAITING_APPROVAL (a custom
        event's state is its name, upper-cased); approved, APPROVED until it ends."""
        if update.client_id is None:
            return
        if update.waiting:
            self._send_unless_ended(
                update.client_id, update.run_id, "task-awaiting_approval", approval=update.approval_id
            )
        else:
            # Not task-started: Celery ranks a custom state above STARTED and would keep showing
            # AWAITING_APPROVAL; another custom state replaces it.
            self._send_unless_ended(update.client_id, update.run_id, "task-approved", timestamp=update.at)

    def close(self) -> None:
        """Send what is queued (waiting at most ``DRAIN_S``). The sender then stops and lets its
        connection go; one still sending after the wait does so once it has sent the rest."""
        with self._lock:
            restates, self._restates = self._restates, set()
        for timer in restates:
            timer.cancel()
        sender = self._sender
        if sender is not None and self._pid == os.getpid() and sender.is_alive():
            self._queue.put(None)
            sender.join(DRAIN_S)
        self._sender = None
