"""Route -> Celery message (layer: brain, Celery glue). One job: publish a ``ToolCall``.

The Celery task id is the run id, so Flower, the reconciler and the store all
name one attempt the same way.
"""

from __future__ import annotations

from celery import Celery

from workers.contracts import RUN_TOOL_TASK, ToolCall

# Margins over the tool's own timeout: the executor answers first; these only stop a
# worker child that hangs past it (the hard limit kills it, the message is re-delivered).
_SOFT_MARGIN_S = 10.0
_HARD_MARGIN_S = 30.0


class Publisher:
    def __init__(self, app: Celery) -> None:
        self.app = app

    def send(self, call: ToolCall, queue: str) -> None:
        limit_cap = float(self.app.conf.task_time_limit or 3600)
        self.app.send_task(
            RUN_TOOL_TASK,
            args=[call.model_dump(mode="json")],
            task_id=call.run_id,
            queue=queue,
            soft_time_limit=min(call.timeout_s + _SOFT_MARGIN_S, limit_cap - 1),
            time_limit=min(call.timeout_s + _HARD_MARGIN_S, limit_cap),
        )
