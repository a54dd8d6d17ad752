"""Leases on reserved messages (layer: workers, Celery glue).

kombu's Redis transport keeps every reserved, unacknowledged message in ``unacked`` and
its reservation time in ``unacked_index``; any live consumer of the same key namespace
puts a message back on its queue once that time is older than ``visibility_timeout``
(``restore_visible``). With the one-hour default, a message reserved by a consumer that
died waits an hour (issue 8). So the visibility timeout is short (``VISIBILITY_TIMEOUT_S``)
and each worker renews the lease of every message it still holds, reserved or running,
every ``RENEW_EVERY_S``: a live worker's long task is never re-delivered, and a dead
worker's messages come back within ``visibility_timeout + restore interval``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from typing import Any

import redis
from celery import bootsteps
from celery.worker import state as worker_state

from workers.redis_connect import app_redis_client

log = logging.getLogger("vancetope.worker.lease")

VISIBILITY_TIMEOUT_S = 30
UNACKED_INDEX = "unacked_index"  # kombu's default unacked_index_key
# How often a live consumer looks for expired leases (kombu's restore_visible sweep).
RESTORE_EVERY_S = 5


def renew_every(visibility_timeout_s: float) -> float:
    """Renew three times per timeout: two renewals may be missed before a lease lapses."""
    return max(visibility_timeout_s / 3, 0.5)


def held_tags(requests: Iterable[Any]) -> list[str]:
    """Delivery tags of the messages behind Celery requests (reserved or active)."""
    tags = []
    for request in requests:
        message = getattr(request, "message", None)
        tag = getattr(message, "delivery_tag", None)
        if tag:
            tags.append(str(tag))
    return tags


class LeaseRenewal(bootsteps.StartStopStep):
    """A consumer step: a thread that moves the reservation time of every held message to now.

    ``ZADD ... XX`` only touches entries that still exist: a message acked (or restored by
    someone else) in between is never brought back.
    """

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, parent: Any) -> None:
        app = parent.app
        options = app.conf.broker_transport_options or {}
        interval = renew_every(float(options.get("visibility_timeout", VISIBILITY_TIMEOUT_S)))
        # kombu's own key name, under the connection's prefix (a client agent's c:<id>:).
        key = options.get("global_keyprefix", "") + options.get("unacked_index_key", UNACKED_INDEX)
        # A client of our own: the consumer's channel belongs to its event loop, and a command
        # sent on it from this thread could interleave with the loop's BRPOP on the same socket.
        client = app_redis_client(app, socket_timeout=10, socket_connect_timeout=5)
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._loop, args=(client, key, interval), name="vancetope-lease", daemon=True
        )
        self._thread.start()

    def stop(self, parent: Any) -> None:
        self._stop.set()

    shutdown = stop

    def _loop(self, client: redis.Redis, key: str, interval: float) -> None:
        try:
            while not self._stop.wait(interval):
                tags = held_tags([*worker_state.reserved_requests, *worker_state.active_requests])
                if not tags:
                    continue
                try:
                    client.zadd(key, dict.fromkeys(tags, time.time()), xx=True)
                except redis.RedisError as exc:  # a lost connection: the next tick tries again
                    log.warning("could not renew the lease of %d message(s): %s", len(tags), exc)
        finally:
            client.close()
