"""The brain's hot state in Redis under ``vt:`` (layer: brain, Redis glue).

Hot state is a cache and a signal, never the record: the registry snapshot that
the CLI validates against, wake-ups for progress displays, running marks written
by workers, and a look into kombu's lists for the reconciler.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable
from typing import Any

import redis

from workers.contracts import RECORD_RESULT_TASK, channel_tree_events, key_registry, key_tree_running

# kombu's Redis transport keeps in-flight (reserved, unacked) messages in this hash.
KOMBU_UNACKED = "unacked"


class HotState:
    def __init__(self, client: redis.Redis) -> None:
        self.r = client

    @classmethod
    def from_url(cls, url: str) -> HotState:
        return cls(redis.Redis.from_url(url, decode_responses=False, health_check_interval=30))

    def close(self) -> None:
        self.r.close()

    # registry snapshot ----------------------------------------------------------
    def put_registry(self, snapshot: dict[str, Any]) -> None:
        self.r.set(key_registry(), json.dumps(snapshot))

    def get_registry(self) -> dict[str, Any] | None:
        raw = self.r.get(key_registry())
        return json.loads(raw) if raw else None

    # tree wake-ups ----------------------------------------------------------------
    def notify(self, tree_id: str) -> None:
        self.r.publish(channel_tree_events(tree_id), b"1")

    # running marks ------------------------------------------------------------------
    def running(self, tree_id: str) -> dict[str, dict[str, Any]]:
        raw = self.r.hgetall(key_tree_running(tree_id))
        return {k.decode(): json.loads(v) for k, v in raw.items()}

    def clear_running(self, tree_id: str, task_id: str, run_id: str) -> None:
        """Drop the mark only if it belongs to this run (a newer attempt keeps its own)."""
        key = key_tree_running(tree_id)
        raw = self.r.hget(key, task_id)
        if raw and json.loads(raw).get("run_id") == run_id:
            self.r.hdel(key, task_id)

    # what kombu holds (reconciler) --------------------------------------------------------
    def message_ids_held(self, queues: Iterable[str]) -> set[str]:
        """Celery task ids of messages waiting in ``queues`` or reserved by a worker."""
        pipe = self.r.pipeline(transaction=False)
        names = list(queues)
        for q in names:
            pipe.lrange(q, 0, -1)
        pipe.hvals(KOMBU_UNACKED)
        replies = pipe.execute()
        ids: set[str] = set()
        for raw in (m for reply in replies[:-1] for m in reply):
            ids.update(_task_id(raw))
        for raw in replies[-1]:
            # unacked values are [message, exchange, routing_key]
            try:
                ids.update(_task_id(json.dumps(json.loads(raw)[0])))
            except (ValueError, IndexError, TypeError):
                continue
        return ids


def _task_id(raw: bytes | str) -> set[str]:
    """The run ids a kombu message stands for: a ``run_tool`` job's own id, or the run
    id inside a ``record_result`` job (a result on its way counts as held, not lost)."""
    try:
        msg = json.loads(raw)
        headers = msg.get("headers", {})
    except (ValueError, AttributeError):
        return set()
    ids = {headers["id"]} if isinstance(headers.get("id"), str) else set()
    if headers.get("task") == RECORD_RESULT_TASK:
        try:
            body = msg["body"]
            if msg.get("properties", {}).get("body_encoding") == "base64":
                body = base64.b64decode(body)
            run_id = json.loads(body)[0][0]["run_id"]
            ids.add(run_id)
        except (ValueError, KeyError, IndexError, TypeError):
            pass
    return ids
