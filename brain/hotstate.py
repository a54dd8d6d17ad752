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

from workers.contracts import (
    CLIENT_OUTBOX,
    RECORD_RESULT_TASK,
    channel_tree_events,
    client_key,
    client_queue,
    key_cancelled,
    key_registry,
    key_tree_running,
)

# kombu's Redis transport keeps in-flight (reserved, unacked) messages in this hash,
# with delivery times in the sorted set beside it.
KOMBU_UNACKED = "unacked"
KOMBU_UNACKED_INDEX = "unacked_index"


def as_bytes(value: bytes | str) -> bytes:
    """redis-py is typed ``bytes | str``; our clients never decode, so values are bytes."""
    return value if isinstance(value, bytes) else value.encode()


def as_text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


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
    def running(self, tree_id: str, clients: Iterable[str] = ()) -> dict[str, dict[str, Any]]:
        """Running marks of the server pool, and of the given clients (under their prefixes)."""
        pipe = self.r.pipeline(transaction=False)
        pipe.hgetall(key_tree_running(tree_id))
        for cid in clients:
            pipe.hgetall(client_key(cid, key_tree_running(tree_id)))
        marks: dict[str, dict[str, Any]] = {}
        for raw in pipe.execute():
            marks.update({k.decode(): json.loads(v) for k, v in raw.items()})
        return marks

    def forget_running(self, tree_id: str) -> None:
        """Drop a finished tree's server running marks at once (marks are not cleared one by
        one per result; a client's expire with the client's keys)."""
        self.r.delete(key_tree_running(tree_id))

    def cancel_runs(self, run_ids: Iterable[str], client_id: str | None = None) -> None:
        """Tell workers (offline ones too, when they come back) never to start these runs."""
        ids = list(run_ids)
        if ids:
            key = key_cancelled() if client_id is None else client_key(client_id, key_cancelled())
            self.r.sadd(key, *ids)

    # what kombu holds (reconciler) --------------------------------------------------------
    def message_ids_held(self, queues: Iterable[str], client_id: str | None = None) -> set[str]:
        """Run ids of messages waiting in ``queues``, reserved by a worker (kombu's unacked
        hash), or — for a client — results waiting in its outbox. Names are unprefixed;
        with ``client_id`` they are read under that client's prefix."""
        prefix = client_key(client_id, "") if client_id else ""
        pipe = self.r.pipeline(transaction=False)
        names = list(queues)
        for q in names:
            pipe.lrange(prefix + q, 0, -1)
        pipe.hvals(prefix + KOMBU_UNACKED)
        if client_id:
            pipe.lrange(prefix + CLIENT_OUTBOX, 0, -1)
        replies = pipe.execute()
        outbox = replies.pop() if client_id else []
        unacked = replies.pop()
        ids: set[str] = set()
        for raw in (m for reply in replies for m in reply):
            ids.update(_task_id(raw))
        for raw in unacked:
            ids.update(_unacked_task_id(raw))
        for raw in outbox:
            ids.update(_outbox_run_id(raw))
        return ids

    def take_client_run(self, client_id: str, run_id: str) -> str | None:
        """Pull one run's message back from an offline client: ``"queued"`` if it was still
        waiting in its queue, ``"running"`` if it was reserved (unacked), None if the agent
        already took or finished it. LREM/HDEL answer whether *we* removed it, so a run is
        never both re-parked here and executed there."""
        queue_key = client_key(client_id, client_queue(client_id))
        for raw in self.r.lrange(queue_key, 0, -1):
            if run_id in _task_id(raw):
                return "queued" if self.r.lrem(queue_key, 1, as_text(raw)) else None
        unacked = client_key(client_id, KOMBU_UNACKED)
        for tag, raw in self.r.hgetall(unacked).items():
            if run_id in _unacked_task_id(as_bytes(raw)):
                if self.r.hdel(unacked, tag):
                    self.r.zrem(client_key(client_id, KOMBU_UNACKED_INDEX), tag)
                    return "running"
                return None
        return None


def _unacked_task_id(raw: bytes) -> set[str]:
    # unacked values are [message, exchange, routing_key]
    try:
        return _task_id(json.dumps(json.loads(raw)[0]))
    except (ValueError, IndexError, TypeError):
        return set()


def _outbox_run_id(raw: bytes) -> set[str]:
    try:
        msg = json.loads(raw)
        return {msg["result"]["run_id"]} if msg.get("type") == "tool_result" else set()
    except (ValueError, KeyError, TypeError, AttributeError):
        return set()


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
