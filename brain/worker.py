"""Celery entry point of the brain (layer: brain, Celery glue).

``celery -A brain.worker worker -Q brain -P solo`` consumes results and advances trees; a
reconciler thread re-sends lost work; a consumer of its own takes the trees other Celery
apps put on queue ``submit`` (``brain.runtime.submit_queue``). The tasks hold no logic.

The brain is built (registry discovered and published) once logging is set up and before
the worker consumes anything; if it cannot be built — an invalid registry, a bad
mcpServers file, Redis refusing — the process logs why and exits non-zero (78 for a
configuration error) instead of staying up never ready.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery.signals import celeryd_after_setup, worker_ready, worker_shutdown
from pydantic import ValidationError

from brain.config import load_settings, sandbox_hidden
from brain.errors import BrainError
from brain.runtime.service import Brain, run_background, start_brain
from brain.runtime.submit_queue import submit_consumer
from workers import sandbox
from workers.app import app
from workers.contracts import (
    PUBLISH_CALL_TASK,
    RECORD_RESULT_TASK,
    RUN_SCHEDULE_TASK,
    QueuedRun,
    ScheduleFire,
    ToolResult,
)
from workers.errors import WorkerError
from workers.proc_guard import protect_process

log = logging.getLogger("vancetope.brain")
# No task events for the brain's own jobs (record_result, publish_call): bookkeeping an
# operator never needs in Flower, three events per job. The brain still sends worker
# heartbeats (Flower lists it) and the client agents' events (brain.runtime.events).
app.conf.worker_send_task_events = False
_state: dict[str, Any] = {}
_stop = threading.Event()
EXIT_CONFIG = 78  # sysexits.h EX_CONFIG: restarting will not help until the config changes
EXIT_START_FAILED = 1


def get_brain() -> Brain:
    brain = _state.get("brain")
    if brain is None:
        settings = load_settings()
        # Before discovery starts the MCP servers: the credentials leave the environment and
        # this process's memory is closed to its children (workers.proc_guard).
        protect_process("brain")
        sandbox.install_chosen(settings.mcp_sandbox, sandbox_hidden(settings))
        brain = _state["brain"] = start_brain(settings, app.conf.broker_url)
    return brain


@app.task(name=RECORD_RESULT_TASK, acks_late=True, reject_on_worker_lost=True)
def record_result(payload: Any) -> bool:
    try:
        result = ToolResult.model_validate(payload)
    except ValidationError as exc:
        log.error("dropped a malformed result message: %s", exc)
        return False
    return get_brain().intake.on_result(result)


@app.task(name=PUBLISH_CALL_TASK, acks_late=True, reject_on_worker_lost=True)
def publish_call(payload: Any) -> bool:
    """A server worker recorded a result and dispatched a dependent to a client: send that
    call to the client's queue, which only the brain may write (``brain.runtime.recorder``)."""
    try:
        ref = QueuedRun.model_validate(payload)
    except ValidationError as exc:
        log.error("dropped a malformed publish_call message: %s", exc)
        return False
    return get_brain().scheduler.publish_queued(ref.tree_id, ref.task_id, ref.run_id, ref.client_id)


@app.task(name=RUN_SCHEDULE_TASK, acks_late=True, reject_on_worker_lost=True)
def run_schedule(payload: Any) -> str | None:
    """Celery beat fired a schedule (``brain.beat``): start, queue or skip its run. The tree id
    started, if any."""
    try:
        fire = ScheduleFire.model_validate(payload)
    except ValidationError as exc:
        log.error("dropped a malformed run_schedule message: %s", exc)
        return None
    record = get_brain().schedules.fire(fire)
    return record.tree_id if record else None


app.steps["consumer"].add(submit_consumer(get_brain))


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
