"""Task events in batches (layer: workers, Celery glue).

Flower needs a server worker's task events (received, started, succeeded), and Celery
already sends buffered ones as one ``task.multi`` message per flush; but it flushes as
soon as the event loop comes round, or once 24 are waiting, so at a few hundred tasks a
second nearly every task's events were a PUBLISH of their own and the pool's main process
spent ~40 % of its time there (bench/README.md). This consumer step lets events gather for
``FLUSH_EVERY_S`` first (up to ``BUFFER_LIMIT`` of them): one PUBLISH per window, events
seen by Flower at most that much later.
"""

from __future__ import annotations

from typing import Any

from celery import bootsteps

# A tenth of a second: a person watching Flower does not see it; at 400 tasks a second a
# window's ~1,200 events are a handful of messages instead of one per task (with 10 ms and
# Celery's 24, a tenth of the pool's main process went to sending them: bench/README.md).
FLUSH_EVERY_S = 0.1
# Sent before the window ends once this many wait: a message of a few hundred KB at most.
BUFFER_LIMIT = 1000


class BatchedTaskEvents(bootsteps.StartStopStep):
    """After Celery's ``Events`` step: replace "flush soon" by "flush within FLUSH_EVERY_S"."""

    requires = ("celery.worker.consumer.events:Events",)

    def start(self, parent: Any) -> None:
        dispatcher, hub = parent.event_dispatcher, parent.hub
        if dispatcher is None or hub is None or dispatcher.on_send_buffered is None:
            return  # no event loop (solo/threads pools) or events off: Celery publishes at once
        dispatcher.buffer_limit = max(dispatcher.buffer_limit, BUFFER_LIMIT)
        pending = False

        def flush() -> None:
            nonlocal pending
            pending = False
            parent._flush_events()

        def on_send_buffered() -> None:
            nonlocal pending
            if not pending:
                pending = True
                hub.call_later(FLUSH_EVERY_S, flush)

        dispatcher.on_send_buffered = on_send_buffered
