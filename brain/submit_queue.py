"""Trees other Celery apps submit (layer: brain, Celery glue): queue ``submit``.

Other apps send the Celery task ``vancetope.submit_tree`` on queue ``submit`` (README
"Python API"). The brain does not register it as a task: a Celery worker runs a registered
task from whichever of its queues the message came, and the server pool may write the
``brain`` queue. So the submit queue has a consumer of its own (a bootstep), and only what
arrives on it is taken: a ``submit_tree`` message put on ``brain`` is an unregistered task.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from typing import Any

from celery import bootsteps
from kombu import Consumer, Queue
from pydantic import ValidationError

from brain.errors import BrainError
from brain.models import SessionKind
from brain.service import Brain
from brain.submission import check_submission
from brain.treefile import tree_from_data
from workers.contracts import SUBMIT_QUEUE, SUBMIT_TREE_TASK, SubmitTree

log = logging.getLogger("vancetope.brain.submit")
MAX_TRIES = 5
RETRY_PAUSE_S = 1.0


def submit_message(brain: Brain, body: Any, headers: dict[str, Any]) -> str | None:
    """Submit the tree of one ``submit_tree`` message (Celery protocol 2); the run's id, or
    None when it is refused (logged with every problem; nothing is recorded).

    Without ``tree_id`` the run is named after the message id, which a redelivery keeps: a
    message delivered twice (at-least-once) still makes one run.
    """
    task, message_id = headers.get("task"), str(headers.get("id") or "")
    if task != SUBMIT_TREE_TASK or not message_id:
        log.error("dropped a message on queue %r: task %r, expected %r", SUBMIT_QUEUE, task, SUBMIT_TREE_TASK)
        return None
    try:
        args, kwargs = body[0], body[1]
        if args:
            raise ValueError("pass the tree, user and tree_id as keyword arguments")
        request = SubmitTree.model_validate(kwargs)
    except (ValidationError, ValueError, TypeError, IndexError, KeyError) as exc:
        log.error("refused submit_tree message %s: %s", message_id, exc)
        return None
    source = f"submit_tree (message {message_id})"
    run_id = request.tree_id or run_id_of(request.tree, message_id)
    try:
        tree = tree_from_data(request.tree, source=source)
        for warning in check_submission(tree, brain.scheduler.registry, source=source, tree_id=run_id):
            log.warning("%s", warning)
        if brain.store.get_tree(run_id) is not None:
            log.info("submit_tree: run %r is already recorded (a redelivered message); nothing to do", run_id)
            return run_id
        record = brain.scheduler.submit(
            tree, tree_id=run_id, session=SessionKind.AUTONOMOUS, user=request.user or brain.settings.user
        )
    except BrainError as exc:
        log.error("refused a submitted tree: %s", exc)
        return None
    log.info("submitted tree %s for user %s", record.tree_id, record.user)
    return record.tree_id


def run_id_of(tree: dict[str, Any], message_id: str) -> str:
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", str(tree.get("id") or "tree"))[:80].lstrip("-_.") or "tree"
    return f"{name}-{message_id.replace('-', '')[:16]}"


def submit_consumer(get_brain: Callable[[], Brain]) -> type[bootsteps.ConsumerStep]:
    """A worker bootstep consuming queue ``submit`` with ``submit_message``."""

    class SubmitQueue(bootsteps.ConsumerStep):
        def get_consumers(self, channel: Any) -> list[Consumer]:
            return [
                Consumer(
                    channel,
                    queues=[Queue(SUBMIT_QUEUE)],
                    callbacks=[self.on_message],
                    accept=["json"],
                    prefetch_count=1,
                )
            ]

        def __init__(self, parent: Any, **kwargs: Any) -> None:
            super().__init__(parent, **kwargs)
            self.failures: dict[str, int] = {}

        def on_message(self, body: Any, message: Any) -> None:
            headers = dict(message.headers or {})
            message_id = str(headers.get("id"))
            try:
                submit_message(get_brain(), body, headers)
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

    return SubmitQueue


__all__ = ["run_id_of", "submit_consumer", "submit_message"]
