"""Trees other Celery apps submit (layer: brain/runtime; Celery glue): queue ``submit.<user>``.

Other apps send the Celery task ``vancetope.submit_tree`` on their user's queue
``submit.<user>`` with the credential `vancetope submit-url --user U` printed (README
"Python API"), which may write that queue and nothing else (``brain.runtime.submitters``). The brain
does not register it as a task: a Celery worker runs a registered task from whichever of its
queues the message came, and the server pool may write the ``brain`` queue. So each submit
queue has a consumer of its own (a bootstep), bound to its user: a tree runs as the user of
the queue it came through, and a message naming another user is refused (issue 20, H5).
The queues follow the store's submit credentials, looked at every ``REFRESH_S``. The same
bootstep consumes queue ``gateway``: the MCP gateway's requests (``brain.runtime.gateway_door``).
"""

from __future__ import annotations

import functools
import logging
import re
import time
from collections.abc import Callable
from typing import Any

from celery import bootsteps
from kombu import Consumer, Queue
from pydantic import ValidationError

from brain.core.limits import check_tree_data
from brain.core.models import SessionKind
from brain.core.submission import SubmitRequest
from brain.core.treefile import tree_from_data
from brain.errors import BrainError
from brain.runtime import gateway_door as door
from brain.runtime.service import Brain
from workers.contracts import GATEWAY_QUEUE, SUBMIT_TREE_TASK, SubmitTree, submit_queue_of

log = logging.getLogger("vancetope.brain.submit")
MAX_TRIES = 5
RETRY_PAUSE_S = 1.0
# How often the consumed queues are matched to the store's submit credentials: a credential
# issued while the brain runs is served within this (its messages wait in Redis meanwhile).
REFRESH_S = 2.0


def submit_message(brain: Brain, body: Any, headers: dict[str, Any], user: str) -> str | None:
    """Submit the tree of one ``submit_tree`` message (Celery protocol 2) that came through
    ``user``'s submit queue; the run's id, or None when it is refused (logged with every
    problem; nothing is recorded).

    The run is ``user``'s: the queue says who sent it, the message cannot. Without
    ``tree_id`` the run is named after the message id, which a redelivery keeps: a message
    delivered twice (at-least-once) still makes one run.
    """
    queue = submit_queue_of(user)
    task, message_id = headers.get("task"), str(headers.get("id") or "")
    if task != SUBMIT_TREE_TASK or not message_id:
        log.error("dropped a message on queue %r: task %r, expected %r", queue, task, SUBMIT_TREE_TASK)
        return None
    try:
        args, kwargs = body[0], body[1]
        if args:
            raise ValueError("pass the tree, user and tree_id as keyword arguments")
        request = SubmitTree.model_validate(kwargs)
    except (ValidationError, ValueError, TypeError, IndexError, KeyError) as exc:
        log.error("refused submit_tree message %s on queue %r: %s", message_id, queue, exc)
        return None
    if request.user is not None and request.user != user:
        log.error(
            "refused submit_tree message %s on queue %r: it names user %r, but it came with the submit "
            "credential of user %r; a credential submits as its own user only (`vancetope submit-url "
            "--user U` issues one per user)",
            message_id, queue, request.user, user,
        )  # fmt: skip
        return None
    source = f"submit_tree (message {message_id}, user {user})"
    run_id = request.tree_id or run_id_of(request.tree, message_id)
    try:
        check_tree_data(request.tree, brain.settings, source=source)
        tree = tree_from_data(request.tree, source=source)
        if brain.store.get_tree(run_id) is not None:
            log.info("submit_tree: run %r is already recorded (a redelivered message); nothing to do", run_id)
            return run_id
        accepted = brain.scheduler.accept(
            SubmitRequest(tree=tree, source=source, tree_id=run_id, session=SessionKind.AUTONOMOUS, user=user)
        )
    except BrainError as exc:
        log.error("refused a submitted tree: %s", exc)
        return None
    for warning in accepted.warnings:
        log.warning("%s", warning)
    record = accepted.record
    log.info("submitted tree %s for user %s", record.tree_id, record.user)
    return record.tree_id


def run_id_of(tree: dict[str, Any], message_id: str) -> str:
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", str(tree.get("id") or "tree"))[:80].lstrip("-_.") or "tree"
    return f"{name}-{message_id.replace('-', '')[:16]}"


def submit_consumer(get_brain: Callable[[], Brain]) -> type[bootsteps.ConsumerStep]:
    """A worker bootstep consuming each user's queue ``submit.<user>`` with ``submit_message``."""

    class SubmitQueues(bootsteps.ConsumerStep):
        def __init__(self, parent: Any, **kwargs: Any) -> None:
            super().__init__(parent, **kwargs)
            self.failures: dict[str, int] = {}
            self.channel: Any = None
            self.by_user: dict[str, Consumer] = {}
            self.timer_ref: Any = None
            self.gateway: Any = None

        def get_consumers(self, channel: Any) -> list[Consumer]:
            self.channel, self.by_user = channel, {}
            for credential in get_brain().store.list_submitters():
                self.by_user[credential.user] = self._consumer(credential.user)
            # The MCP gateway's requests (brain.runtime.gateway_door): it submits and cancels through here.
            self.gateway = Consumer(
                channel,
                queues=[Queue(GATEWAY_QUEUE)],
                callbacks=[self.on_gateway],
                accept=["json"],
                prefetch_count=1,
            )
            return [self.gateway, *self.by_user.values()]

        def start(self, c: Any) -> None:
            super().start(c)
            # The worker's timer runs in its event loop, where the consumers live.
            self.timer_ref = c.timer.call_repeatedly(REFRESH_S, self.refresh)

        def stop(self, c: Any) -> None:
            self._cancel_timer()
            super().stop(c)

        def shutdown(self, c: Any) -> None:
            self._cancel_timer()
            super().shutdown(c)

        def _cancel_timer(self) -> None:
            if self.timer_ref is not None:
                self.timer_ref.cancel()
                self.timer_ref = None

        def _consumer(self, user: str) -> Consumer:
            return Consumer(
                self.channel,
                queues=[Queue(submit_queue_of(user))],
                callbacks=[functools.partial(self.on_message, user)],
                accept=["json"],
                prefetch_count=1,
            )

        def refresh(self) -> None:
            """Consume the queue of each new credential; stop on a revoked one's."""
            try:
                wanted = {c.user for c in get_brain().store.list_submitters()}
            except Exception:
                log.exception("reading the submit credentials failed; the submit queues stay as they are")
                return
            for user in sorted(wanted - self.by_user.keys()):
                consumer = self._consumer(user)
                consumer.consume()
                self.by_user[user] = consumer
                self.consumers = [self.gateway, *self.by_user.values()]
                log.info("consuming queue %s (submit credential of user %s)", submit_queue_of(user), user)
            for user in sorted(self.by_user.keys() - wanted):
                self.by_user.pop(user).cancel()
                self.consumers = [self.gateway, *self.by_user.values()]
                log.info("stopped consuming queue %s: its credential was revoked", submit_queue_of(user))

        def on_gateway(self, body: Any, message: Any) -> None:
            # A request the gateway waits for: no retries (the gateway's wait is bounded and it
            # tells its caller); a failure is logged and the gateway's wait ends with its words.
            try:
                door.on_request(get_brain(), body)
            except Exception:
                log.exception("a gateway request failed")
            message.ack()

        def on_message(self, user: str, body: Any, message: Any) -> None:
            headers = dict(message.headers or {})
            message_id = str(headers.get("id"))
            try:
                submit_message(get_brain(), body, headers, user)
            except Exception:
                # A store or Redis outage must not lose a submission: put it back and try
                # again, a few times, pausing so an outage is not a busy loop.
                tries = self.failures[message_id] = self.failures.get(message_id, 0) + 1
                if tries < MAX_TRIES:
                    log.exception(
                        "submit_tree %s failed (try %d of %d); it goes back", message_id, tries, MAX_TRIES
                    )
                    time.sleep(RETRY_PAUSE_S)
                    message.requeue()
                    return
                log.exception("submit_tree %s failed %d times; dropped", message_id, tries)
            self.failures.pop(message_id, None)
            message.ack()

    return SubmitQueues


__all__ = ["REFRESH_S", "run_id_of", "submit_consumer", "submit_message"]
