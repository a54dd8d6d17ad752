"""Celery entry point of the brain (layer: brain, Celery glue).

``celery -A brain.worker worker -Q brain -P solo`` consumes results and advances
trees; a reconciler thread re-sends lost work. The task holds no logic.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery.signals import worker_ready, worker_shutdown
from pydantic import ValidationError

from brain.config import load_settings
from brain.service import Brain, run_background, start_brain
from workers.app import app
from workers.contracts import RECORD_RESULT_TASK, ToolResult

log = logging.getLogger("vancetope.brain")
_state: dict[str, Any] = {}
_stop = threading.Event()


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


@worker_ready.connect
def _on_ready(**_: Any) -> None:
    brain = get_brain()
    run_background(brain, _stop)
    log.info("brain ready: %d tools in the registry", len(brain.scheduler.registry.tools))


@worker_shutdown.connect
def _on_shutdown(**_: Any) -> None:
    _stop.set()
