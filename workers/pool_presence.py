"""A server pool worker says it is alive (layer: workers, Celery glue).

``vancetope status`` answers "is anyone consuming this pool's queue?" from a sorted set per
pool (``key_pool_workers``): each pool worker adds its node name with a score of Redis's
clock plus ``PRESENCE_TTL_S`` every ``PRESENCE_EVERY_S``, and removes itself when it stops.
A reader counts the entries whose score is still ahead of Redis's clock. One ZADD every few
seconds per worker, a key the pool's ACL user already reaches (``vt:*``), no broadcast (Celery's
``inspect`` needs remote control and a reply from every worker) and no clock skew between
machines: both sides use Redis's ``TIME``.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import redis
from celery import bootsteps

from workers.contracts import key_pool_workers, pool_of_queue
from workers.redis_connect import app_redis_client

log = logging.getLogger("vancetope.worker.pool")

PRESENCE_EVERY_S = 5.0
# Three missed renewals before a worker stops counting: a SIGKILLed one is gone within this.
PRESENCE_TTL_S = 15.0


def redis_now(client: redis.Redis) -> float:
    """Redis's clock (``TIME``), the one clock every worker and reader shares."""
    seconds, micros = client.time()
    return float(seconds) + float(micros) / 1e6


def live_pool_workers(client: redis.Redis, pool: str) -> list[str]:
    """Node names of the workers of ``pool`` whose presence has not lapsed, sorted."""
    names = client.zrangebyscore(key_pool_workers(pool), redis_now(client), "+inf")
    return sorted(n.decode() if isinstance(n, bytes) else str(n) for n in names)


class PoolPresence(bootsteps.StartStopStep):
    """A consumer step: a thread that keeps this worker's entry in each pool it consumes."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, parent: Any) -> None:
        queues = [q.name for q in parent.task_consumer.queues]
        pools = sorted({p for p in map(pool_of_queue, queues) if p is not None})
        if not pools:
            return
        client = app_redis_client(parent.app, socket_timeout=10, socket_connect_timeout=5)
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._loop, args=(client, str(parent.hostname), pools), name="vancetope-pool", daemon=True
        )
        self._thread.start()

    def stop(self, parent: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    shutdown = stop

    def _loop(self, client: redis.Redis, node: str, pools: list[str]) -> None:
        try:
            while True:
                self._renew(client, node, pools)
                if self._stop.wait(PRESENCE_EVERY_S):
                    break
            # A worker that stops cleanly is gone at once, not after the TTL.
            pipe = client.pipeline(transaction=False)
            for pool in pools:
                pipe.zrem(key_pool_workers(pool), node)
            pipe.execute()
        except redis.RedisError as exc:
            log.warning("could not withdraw pool presence of %s: %s", node, exc)
        finally:
            client.close()

    @staticmethod
    def _renew(client: redis.Redis, node: str, pools: list[str]) -> None:
        try:
            now = redis_now(client)
            pipe = client.pipeline(transaction=False)
            for pool in pools:
                key = key_pool_workers(pool)
                pipe.zadd(key, {node: now + PRESENCE_TTL_S})
                pipe.zremrangebyscore(key, "-inf", now)  # entries of workers long gone
                pipe.expire(key, int(PRESENCE_TTL_S) * 4)
            pipe.execute()
        except redis.RedisError as exc:  # a lost connection: the next tick tries again
            log.warning("could not renew pool presence of %s: %s", node, exc)
