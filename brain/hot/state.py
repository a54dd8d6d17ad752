"""The brain's hot state in Redis under ``vt:`` (layer: brain/hot; Redis glue).

Hot state is a cache and a signal, never the record: the registry snapshot that
the CLI validates against, wake-ups for progress displays, running marks written
by workers, and a look into kombu's lists for the reconciler.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Final, cast

import redis

from brain.errors import BrainError
from brain.hot.cancelled import TAKEN_BACK_KEPT_S, cancelled_set, redis_now, write_batch, write_chunks
from workers.contracts import (
    CLIENT_OUTBOX,
    KOMBU_UNACKED,
    KOMBU_UNACKED_INDEX,
    RECORD_RESULT_TASK,
    channel_tree_events,
    client_key,
    client_queue,
    key_pool_registry,
    key_registry,
    key_registry_loaded_at,
    key_tree_running,
    stop_member,
)
from workers.redis_connect import redis_client

# How much of a kombu queue or hash one command reads: never a whole 100,000-long queue in
# one reply (it stalls Redis for everyone, docs/performance.md).
READ_CHUNK = 1000


def as_bytes(value: bytes | str) -> bytes:
    """redis-py is typed ``bytes | str``; our clients never decode, so values are bytes."""
    return value if isinstance(value, bytes) else value.encode()


def as_text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


# Without a socket timeout a command whose bytes a link dropped (a partition between hosts, a
# Redis host that vanished without a FIN) waits for its reply for ever, and the brain with it.
# Every blocking read of the hot state blocks for a few seconds at most (the relay's BRPOP 1 s,
# the gateway door's BLPOP 2 s, answers in short blocks), and pub/sub waits use their own
# timeouts; 30 s is far above the slowest command seen (a 100k-ref requeue). Keepalive finds a
# peer that vanished while the connection was idle.
HOT_SOCKET_OPTIONS: Final[dict[str, Any]] = {
    "socket_timeout": 30.0,
    "socket_connect_timeout": 10.0,
    "socket_keepalive": True,
}


class HotState:
    def __init__(self, client: redis.Redis) -> None:
        self.r = client

    @classmethod
    def from_url(cls, url: str) -> HotState:
        return cls(redis_client(url, decode_responses=False, health_check_interval=30, **HOT_SOCKET_OPTIONS))

    def close(self) -> None:
        self.r.close()

    # registry snapshot ----------------------------------------------------------
    def put_registry(self, snapshot: dict[str, Any]) -> None:
        pipe = self.r.pipeline(transaction=True)
        text = json.dumps(snapshot)
        pipe.set(key_registry(), text)
        pipe.set(key_pool_registry(), text)  # the pools' copy (they cannot reach key_registry)
        pipe.set(key_registry_loaded_at(), repr(float(snapshot.get("loaded_at") or 0.0)))
        pipe.execute()

    def registry_loaded_at(self) -> float | None:
        """The published snapshot's ``loaded_at`` (one small GET), or None if none says."""
        raw = self.r.get(key_registry_loaded_at())
        try:
            return float(raw) if raw else None
        except ValueError:
            return None

    def get_registry(self, key: str | None = None) -> dict[str, Any] | None:
        """The brain's published snapshot (``key``: the pools' copy, ``key_pool_registry``)."""
        raw = self.r.get(key or key_registry())
        return json.loads(raw) if raw else None

    # tree wake-ups ----------------------------------------------------------------
    def notify(self, tree_id: str) -> None:
        self.r.publish(channel_tree_events(tree_id), b"1")

    def publish_event(self, tree_id: str, event: str) -> None:
        """A ``TreeEvent`` (JSON) on the tree's channel: it wakes every listener as ``notify``
        does, and the gateway following the call reads what it says."""
        self.r.publish(channel_tree_events(tree_id), event)

    # running marks ------------------------------------------------------------------
    def running(self, tree_id: str, clients: Iterable[str] = ()) -> dict[str, dict[str, Any]]:
        """Running marks of the server pool, and of the given clients (under their prefixes)."""
        pipe = self.r.pipeline(transaction=False)
        pipe.hgetall(key_tree_running(tree_id))
        for cid in clients:
            pipe.hgetall(client_key(cid, key_tree_running(tree_id)))
        marks: dict[str, dict[str, Any]] = {}
        # A client writes its own marks: one that is not a hash of JSON objects is skipped,
        # and never hides the others'.
        for raw in pipe.execute(raise_on_error=False):
            if isinstance(raw, dict):
                marks.update(_running_marks(raw))
        return marks

    def tree_finished(self, tree_id: str) -> None:
        """Drop a finished tree's server running marks at once (marks are not cleared one by
        one per result; a client's expire with the client's keys) and wake its watchers: one
        round trip."""
        pipe = self.r.pipeline(transaction=False)
        pipe.delete(key_tree_running(tree_id))
        pipe.publish(channel_tree_events(tree_id), b"1")
        pipe.execute()

    def cancel_runs(
        self,
        run_ids: Iterable[str],
        client_id: str | None = None,
        *,
        unqueue: bool = True,
        stop: Iterable[str] = (),
        kept_s: float = TAKEN_BACK_KEPT_S,
    ) -> set[str]:
        """Tell workers (offline ones too, when they come back) never to start these runs; a
        client's runs still waiting in its queue are then taken out of it (``unqueue``), so a
        workstation that comes back or frees up never pops them. Those of ``stop`` (a cancel's
        or an expiry's) that may be running are also stopped where they run (``stop_member``):
        for a client, those not taken out of its queue (its agent popped them; the store may
        not know yet that they started). Returns the run ids taken out. ``kept_s``: how long
        the set keeps them (``brain.hot.cancelled``; by default a take-back's, the longest).

        The cancelled set is written first: a message the agent pops between the two is
        refused at ``begin_run``, and one still queued costs it nothing at all. Run ids go
        ``CHUNK_WRITE`` per SADD (no multi-megabyte command); the queue is read once."""
        ids = [r for r in run_ids if r]
        stops = [r for r in stop if r]
        if not ids and not stops:
            return set()
        now = redis_now(self.r)  # the batch's time (brain.hot.cancelled)
        # One batch for all (a stop member left out below is then taken out of nothing).
        self._add_cancelled(client_id, ids, [*ids, *map(stop_member, stops)], now, kept_s)
        unqueued: set[str] = set()
        if client_id is not None and unqueue and ids:
            queue_key = client_key(client_id, client_queue(client_id))
            with _client_keys(client_id, "queue", queue_key):
                queued = self._queued(queue_key, set(ids))
            if queued:
                pipe = self.r.pipeline(transaction=False)
                _lrem_each(pipe, queue_key, queued)
                unqueued = set(_won(queued, pipe.execute(raise_on_error=False)))
        self._add_cancelled(client_id, [stop_member(r) for r in stops if r not in unqueued])
        return unqueued

    def _add_cancelled(
        self,
        client_id: str | None,
        members: list[str],
        batch: Sequence[str] = (),
        now: float = 0.0,
        kept_s: float = 0.0,
    ) -> None:
        """Add ``members`` to a cancelled set, and ``batch`` to ``brain.hot.cancelled``'s
        batches in the same ``MULTI`` (a WRONGTYPE of the SADD still runs the rest), from
        which the reconciler takes them out again once no worker can meet their run."""
        if not members and not batch:
            return
        key = cancelled_set(client_id)
        pipe = self.r.pipeline(transaction=True)
        sadds = write_chunks(members)
        for chunk in sadds:
            pipe.sadd(key, *chunk)
        write_batch(pipe, client_id, list(batch), now, kept_s)
        replies = pipe.execute(raise_on_error=False)
        for added in replies[: len(sadds)]:
            if isinstance(added, redis.ResponseError):
                if client_id is None:
                    raise added
                # The client replaced its own cancelled set: only its own workstation may now
                # run a cancelled call, whose result is refused (the task has moved on).
                raise ClientKeyUnreadable(client_id, "cancelled set", key, added) from added
        for reply in replies[len(sadds) :]:
            if isinstance(reply, Exception):
                raise reply

    # what kombu holds (reconciler) --------------------------------------------------------
    def _list_chunks(self, key: str) -> Iterator[list[bytes]]:
        """A list read ``READ_CHUNK`` items at a time from its head (kombu pushes at the head
        and pops at the tail: a push meanwhile makes an item seen twice, never missed)."""
        start = 0
        while items := self.r.lrange(key, start, start + READ_CHUNK - 1):
            yield [as_bytes(i) for i in items]
            if len(items) < READ_CHUNK:
                return
            start += len(items)

    def _hash_items(self, key: str) -> Iterator[tuple[bytes, bytes]]:
        """A hash read by HSCAN (about ``READ_CHUNK`` fields per reply), never all in one reply."""
        for tag, raw in self.r.hscan_iter(key, count=READ_CHUNK):
            yield as_bytes(tag), as_bytes(raw)

    def message_ids_held(
        self, queues: Iterable[str], client_id: str | None = None, *, both_ways: bool = False
    ) -> set[str]:
        """Run ids of messages waiting in ``queues``, reserved by a worker (kombu's unacked
        hash), or — for a client — results waiting in its outbox. Names are unprefixed;
        with ``client_id`` they are read under that client's prefix. Each is read a chunk
        at a time, queues first, then the hash (a message kombu moves meanwhile from a queue
        to the hash is still seen); ``both_ways``: the hash also before the queues, so that
        one kombu restores meanwhile from the hash to a queue is seen too."""
        prefix = client_key(client_id, "") if client_id else ""
        ids: set[str] = set()

        def reserved() -> None:
            with _client_keys(client_id, "unacked hash", prefix + KOMBU_UNACKED):
                for _tag, raw in self._hash_items(prefix + KOMBU_UNACKED):
                    ids.update(_unacked_task_id(raw))

        if both_ways:
            reserved()
        for q in queues:
            with _client_keys(client_id, "queue", prefix + q):
                for items in self._list_chunks(prefix + q):
                    for raw in items:
                        ids.update(_task_id(raw))
        reserved()
        if client_id:
            with _client_keys(client_id, "outbox", prefix + CLIENT_OUTBOX):
                for items in self._list_chunks(prefix + CLIENT_OUTBOX):
                    for raw in items:
                        ids.update(_outbox_run_id(raw))
        return ids

    def _queued(self, queue_key: str, wanted: set[str]) -> dict[str, bytes]:
        """Run id -> its message as stored, for the ``wanted`` runs waiting in ``queue_key``
        (read a chunk at a time)."""
        queued: dict[str, bytes] = {}
        for items in self._list_chunks(queue_key):
            for raw in items:
                for run_id in _task_id(raw) & wanted:
                    queued.setdefault(run_id, raw)
        return queued

    def take_client_runs(self, client_id: str, run_ids: Iterable[str]) -> dict[str, str]:
        """Pull runs' messages back from an offline client: run id -> ``"queued"`` if it was
        still waiting in its queue, ``"running"`` if it was reserved (unacked); a run the
        agent already took or finished is left out. The queue and the unacked hash are read
        once, a chunk at a time; then one pipeline of LREM/HDEL whose answers say whether
        *we* removed each message, so a run is never both re-parked here and executed there."""
        wanted = {r for r in run_ids if r}
        if not wanted:
            return {}
        queue_key = client_key(client_id, client_queue(client_id))
        unacked = client_key(client_id, KOMBU_UNACKED)
        queued: dict[str, bytes] = {}
        # A queue or hash the client replaced with another type holds none of our messages
        # any more: what it held is lost with it, so those runs are taken back as running.
        lost = False
        try:
            queued = self._queued(queue_key, wanted)
        except redis.ResponseError:
            lost = True
        reserved: dict[str, bytes] = {}
        try:
            for tag, raw in self._hash_items(unacked):
                for run_id in _unacked_task_id(raw) & (wanted - queued.keys()):
                    reserved.setdefault(run_id, tag)
        except redis.ResponseError:
            lost = True
        unknown = {run_id: "running" for run_id in wanted - queued.keys() - reserved.keys()} if lost else {}
        if not queued and not reserved:
            return unknown
        pipe = self.r.pipeline(transaction=False)
        _lrem_each(pipe, queue_key, queued)
        for tag in reserved.values():
            pipe.hdel(unacked, tag)
        answers = pipe.execute(raise_on_error=False)
        taken = {run_id: "queued" for run_id in _won(queued, answers)}
        won = [(run_id, reserved[run_id]) for run_id in _won(reserved, answers[len(queued) :])]
        taken.update((run_id, "running") for run_id, _tag in won)
        if won:
            try:
                self.r.zrem(client_key(client_id, KOMBU_UNACKED_INDEX), *(tag for _run, tag in won))
            except redis.ResponseError:
                pass  # its index replaced by the client: kombu's restore finds nothing to restore
        return {**unknown, **taken}


def _lrem_each(pipe: Any, queue_key: str, queued: dict[str, bytes]) -> None:
    for raw in queued.values():
        pipe.lrem(queue_key, 1, cast(str, raw))  # the bytes as stored; redis-py sends them as they are


def _won(run_ids: Iterable[str], answers: list[Any]) -> list[str]:
    """The runs whose LREM/HDEL answered 1: removed by *us*, not by the agent popping or acking
    it meanwhile (so a run is never both taken back here and executed there)."""
    return [run_id for run_id, n in zip(run_ids, answers) if isinstance(n, int) and n]


def is_wrong_type(exc: redis.ResponseError) -> bool:
    """Redis's answer to a command on a key of another type than the command's."""
    return str(exc).startswith("WRONGTYPE")


class ClientKeyUnreadable(BrainError):
    """One of a client's keys the brain needs has the wrong type (the client wrote it)."""

    def __init__(self, client_id: str, name: str, key: str, exc: Exception) -> None:
        self.client_id = client_id
        self.name = name
        self.detail = f"its {name} {key!r} cannot be read ({(str(exc).splitlines() or [''])[0][:200]})"
        super().__init__(f"client {client_id!r}: {self.detail}")


@contextmanager
def _client_keys(client_id: str | None, name: str, key: str) -> Iterator[None]:
    """Redis's refusal to read one of a client's keys, as ClientKeyUnreadable naming it."""
    try:
        yield
    except redis.ResponseError as exc:
        if client_id is None:
            raise
        raise ClientKeyUnreadable(client_id, name, key, exc) from exc


# Every parser below reads what a client may have written: anything that is not the shape
# kombu writes stands for no run id, and none of them raises.
def _running_marks(raw: dict[Any, Any]) -> dict[str, dict[str, Any]]:
    marks: dict[str, dict[str, Any]] = {}
    for k, v in raw.items():
        try:
            mark = json.loads(v)
            if isinstance(mark, dict):
                marks[as_bytes(k).decode()] = mark
        except (ValueError, RecursionError):
            continue
    return marks


def _unacked_task_id(raw: bytes) -> set[str]:
    # unacked values are [message, exchange, routing_key]
    try:
        entry = json.loads(raw)
    except (ValueError, RecursionError):
        return set()
    if not isinstance(entry, list) or not entry or not isinstance(entry[0], dict):
        return set()
    return _ids_of(entry[0])


def _outbox_run_id(raw: bytes) -> set[str]:
    try:
        msg = json.loads(raw)
    except (ValueError, RecursionError):
        return set()
    result = msg.get("result") if isinstance(msg, dict) and msg.get("type") == "tool_result" else None
    run_id = result.get("run_id") if isinstance(result, dict) else None
    return {run_id} if isinstance(run_id, str) else set()


def _task_id(raw: bytes | str) -> set[str]:
    """The run ids a kombu message stands for: a ``run_tool`` job's own id, or the run
    id inside a ``record_result`` job (a result on its way counts as held, not lost)."""
    try:
        msg = json.loads(raw)
    except (ValueError, RecursionError):
        return set()
    return _ids_of(msg) if isinstance(msg, dict) else set()


def _ids_of(msg: dict[str, Any]) -> set[str]:
    headers = msg.get("headers")
    if not isinstance(headers, dict):
        return set()
    ids = {headers["id"]} if isinstance(headers.get("id"), str) else set()
    if headers.get("task") == RECORD_RESULT_TASK:
        try:
            body = msg["body"]
            properties = msg.get("properties")
            if isinstance(properties, dict) and properties.get("body_encoding") == "base64":
                body = base64.b64decode(body)
            run_id = json.loads(body)[0][0]["run_id"]
            if isinstance(run_id, str):
                ids.add(run_id)
        except (ValueError, KeyError, IndexError, TypeError, RecursionError):
            pass
    return ids
