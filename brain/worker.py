"""Celery entry point of the brain (layer: brain, Celery glue).

``celery -A brain.worker worker -Q brain,submit -P solo`` consumes results and advances
trees, and takes trees other Celery apps submit; a reconciler thread re-sends lost work.
The tasks hold no logic.

The brain is built (registry discovered and published) once logging is set up and before
the worker consumes anything; if it cannot be built — an invalid registry, a bad
mcpServers file, Redis refusing — the process logs why and exits non-zero (78 for a
configuration error) instead of staying up never ready.
"""

from __future__ import annotations

import logging
import re
import threading
from typing import Any

from celery.signals import celeryd_after_setup, worker_ready, worker_shutdown
from pydantic import ValidationError

from brain.config import load_settings
from brain.errors import BrainError
from brain.models import SessionKind
from brain.service import Brain, run_background, start_brain
from brain.submission import check_submission
from brain.treefile import tree_from_data
from workers.app import app
from workers.contracts import (
    PUBLISH_CALL_TASK,
    RECORD_RESULT_TASK,
    SUBMIT_TREE_TASK,
    QueuedRun,
    SubmitTree,
    ToolResult,
)
from workers.errors import WorkerError

log = logging.getLogger("vancetope.brain")
# No task events for the brain's own jobs (record_result, publish_call): bookkeeping an
# operator never needs in Flower, three events per job. The brain still sends worker
# heartbeats (Flower lists it) and the client agents' events (brain.events).
app.conf.worker_send_task_events = False
_state: dict[str, Any] = {}
_stop = threading.Event()
EXIT_CONFIG = 78  # sysexits.h EX_CONFIG: restarting will not help until the config changes
EXIT_START_FAILED = 1


def get_brain() -> Brain:
    brain = _state.get("brain")
    if brain is None:
        brain = _state["brain"] = start_brain(load_settings(), app.conf.broker_url)
    return brain


@app.task(name=RECORD_RESULT_TASK, acks_late=True, reject_on_worker_lost=True)
def record_result(payload: Any) -> bool:
    try:
        result = ToolResult.model_validate(payload)
    except ValidationError as exc:
        log.error("dropped a malformed result message: %s", exc)
        return False
    return get_brain().scheduler.on_result(result)


@app.task(name=PUBLISH_CALL_TASK, acks_late=True, reject_on_worker_lost=True)
def publish_call(payload: Any) -> bool:
    """A server worker recorded a result and dispatched a dependent to a client: send that
    call to the client's queue, which only the brain may write (``brain.recorder``)."""
    try:
        ref = QueuedRun.model_validate(payload)
    except ValidationError as exc:
        log.error("dropped a malformed publish_call message: %s", exc)
        return False
    return get_brain().scheduler.publish_queued(ref.tree_id, ref.task_id, ref.run_id, ref.client_id)


@app.task(name=SUBMIT_TREE_TASK, bind=True, acks_late=True, reject_on_worker_lost=True)
def submit_tree(self: Any, tree: Any = None, user: Any = None, tree_id: Any = None) -> str | None:
    """Another Celery app submits ``tree`` (README "Python API"). It runs as an autonomous run
    for ``user``; a refused tree is logged with every problem and never half-recorded.

    Without ``tree_id`` the run is named after this message's id, which a redelivery keeps:
    a message delivered twice (at-least-once) still makes one run.
    """
    try:
        request = SubmitTree.model_validate({"tree": tree, "user": user, "tree_id": tree_id})
    except ValidationError as exc:
        log.error("refused a submit_tree message: %s", exc)
        return None
    brain = get_brain()
    source = f"submit_tree (message {self.request.id})"
    run_id = request.tree_id or _run_id_of(request.tree, str(self.request.id))
    try:
        parsed = tree_from_data(request.tree, source=source)
        for warning in check_submission(parsed, brain.scheduler.registry, source=source, tree_id=run_id):
            log.warning("%s", warning)
        if brain.store.get_tree(run_id) is not None:
            log.info("submit_tree: run %r is already recorded (a redelivered message); nothing to do", run_id)
            return run_id
        record = brain.scheduler.submit(
            parsed, tree_id=run_id, session=SessionKind.AUTONOMOUS, user=request.user or brain.settings.user
        )
    except BrainError as exc:
        log.error("refused a submitted tree: %s", exc)
        return None
    log.info("submitted tree %s for user %s", record.tree_id, record.user)
    return record.tree_id


def _run_id_of(tree: dict[str, Any], message_id: str) -> str:
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", str(tree.get("id") or "tree"))[:80].lstrip("-_.") or "tree"
    return f"{name}-{message_id.replace('-', '')[:16]}"


@celeryd_after_setup.connect
def _build_brain(**_: Any) -> None:
    """Build before consuming. Celery logs and swallows an Exception from a signal handler,
    but lets SystemExit through: the worker then stops with that code."""
    try:
        get_brain()
    except (BrainError, WorkerError) as exc:
        log.critical("brain cannot start: %s", exc)
        raise SystemExit(EXIT_CONFIG) from exc
    except Exception as exc:
        log.critical("brain cannot start: %s", exc, exc_info=True)
        raise SystemExit(EXIT_START_FAILED) from exc


@worker_ready.connect
def _on_ready(**_: Any) -> None:
    brain = get_brain()
    run_background(brain, _stop)
    log.info("brain ready: %d tools in the registry", len(brain.scheduler.registry.tools))


@worker_shutdown.connect
def _on_shutdown(**_: Any) -> None:
    _stop.set()
