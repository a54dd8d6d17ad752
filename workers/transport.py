"""The guarded Redis transport (layer: workers, kombu glue).

One job: no message on a queue can stop the consumer reading it. kombu 5.7's Redis
channel decodes what BRPOP hands it inline (``_brpop_read``), so one non-JSON push
raises ``JSONDecodeError`` in the consumer loop and Celery exits the worker
(docs/security.md, "A workstation"). Every Celery app of ours uses this transport
(``workers.app.celery_config`` sets ``broker_transport``); it pops exactly as kombu
does, then checks each payload with ``check_payload`` — size, nesting depth, JSON,
kombu's envelope, the body's encoding — and drops and logs what fails, naming the
queue. A dropped task or result is re-sent by the brain's reconciler (the store is
the record). ``redis://`` and ``rediss://`` URLs work as before: kombu parses the URL
(TLS options included) whatever the transport class.

``check_payload`` and ``json_depth`` are pure; the channel only wires them in.
"""

from __future__ import annotations

import base64
import binascii
import functools
import logging
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from itertools import accumulate
from queue import Empty
from typing import Any, Final, Literal

import redis
from kombu.transport import TRANSPORT_ALIASES, virtual
from kombu.transport import redis as kombu_redis
from kombu.utils import json as kombu_json
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from workers.contracts import MAX_JSON_DEPTH, MAX_MESSAGE_BYTES, client_keyprefix
from workers.redis_lock import ScriptFreeLocks
from workers.sent_ahead import SentAhead

log = logging.getLogger("vancetope.transport")

TRANSPORT_PATH: Final = "workers.transport:GuardedTransport"
"""What ``broker_transport`` names; kombu resolves it with ``symbol_by_name``."""

# A JSON string, escapes included (the unrolled form: no per-character alternation).
_JSON_STRING: Final = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS: Final = bytes(b for b in range(256) if b not in b"[]{}")
_STEP: Final = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


class UnsafeMessage(Exception):
    """A payload popped from a queue that must not reach kombu or Celery; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def json_depth(raw: bytes) -> int:
    """How deeply ``raw`` nests arrays and objects, found without parsing it (a parser is
    what a deep document would overflow). Brackets inside strings do not count."""
    brackets = _JSON_STRING.sub(b"", raw).translate(None, _NOT_BRACKETS)
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)


class _Properties(BaseModel):
    """The part of kombu's ``properties`` that kombu itself reads when it builds a Message."""

    model_config = ConfigDict(extra="allow")

    delivery_tag: str
    body_encoding: Literal["base64", "utf-8"] | None = None
    delivery_info: dict[str, Any] = Field(default_factory=dict)
    priority: int | None = None


class _CeleryHeaders(BaseModel):
    """Celery protocol 2 headers, as far as Celery reads them before its own error handling."""

    model_config = ConfigDict(extra="allow")

    task: str
    id: str


class Envelope(BaseModel):
    """kombu's message envelope on a Redis list, as ``Channel.prepare_message`` writes it."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    body: str
    content_type: str | None = Field(default=None, alias="content-type")
    content_encoding: str | None = Field(default=None, alias="content-encoding")
    headers: dict[str, Any] = Field(default_factory=dict)
    properties: _Properties


def check_payload(
    raw: bytes, *, max_bytes: int = MAX_MESSAGE_BYTES, max_depth: int = MAX_JSON_DEPTH
) -> dict[str, Any]:
    """The decoded message kombu may deliver, or ``UnsafeMessage`` saying why not."""
    if len(raw) > max_bytes:
        raise UnsafeMessage(f"{len(raw)} bytes, over the {max_bytes}-byte limit")
    _check_depth(raw, max_depth, "message")
    try:
        # kombu's own loads (its object hook revives tagged types), as kombu would call it.
        data = kombu_json.loads(raw)
    except Exception as exc:  # noqa: BLE001 - whatever the decoder raises, the payload is undecodable
        raise UnsafeMessage(f"not JSON ({exc.__class__.__name__}: {str(exc)[:200]})") from None
    try:
        envelope = Envelope.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:5])
        raise UnsafeMessage(f"not a kombu message envelope ({problems})") from None
    if "task" in envelope.headers:
        try:
            _CeleryHeaders.model_validate(envelope.headers)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:5])
            raise UnsafeMessage(f"not a Celery task message ({problems})") from None
    _check_depth(_body_bytes(envelope), max_depth, "body")
    assert isinstance(data, dict)  # Envelope.model_validate accepted it
    return data


def depth_over(raw: bytes, limit: int) -> int | None:
    """``json_depth(raw)`` when it is over ``limit``, else None. A document cannot nest deeper
    than it has openings: counting them (C speed) settles the common case without a scan."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return None
    depth = json_depth(raw)
    return depth if depth > limit else None


def _check_depth(raw: bytes, max_depth: int, what: str) -> None:
    depth = depth_over(raw, max_depth)
    if depth is not None:
        raise UnsafeMessage(f"{what} nested {depth} deep, over the limit of {max_depth}")


def body_bytes(message: dict[str, Any]) -> bytes:
    """The body of a message ``check_payload`` passed, decoded as kombu would."""
    return _body_bytes(Envelope.model_validate(message))


def _body_bytes(envelope: Envelope) -> bytes:
    """The body as Celery will decode it; a body kombu could not decode is refused here."""
    if envelope.properties.body_encoding != "base64":
        return envelope.body.encode("utf-8", "surrogatepass")
    try:
        # What kombu's Base64 codec does (it discards non-alphabet characters too).
        return base64.b64decode(envelope.body.encode("ascii"))
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise UnsafeMessage(f"body is not base64 ({exc})") from None


class _Client(ScriptFreeLocks, redis.Redis):
    """redis-py's client whose locks need no script."""


class _PrefixedClient(ScriptFreeLocks, kombu_redis.PrefixedStrictRedis):
    """kombu's key-prefixing client whose locks need no script."""


class ForgetfulQoS(kombu_redis.QoS):
    """kombu's QoS, except that a message whose ack or reject could not reach Redis is
    forgotten here all the same. kombu removes it from its prefetch count only after Redis
    answered: seen after a Sentinel failover, a client agent (prefetch 2) whose two acks met
    the dead master kept both slots taken, so it never sent another BRPOP, never learnt that
    its connection was gone, and took no work for good. Forgotten, the slot frees, the next
    BRPOP fails and Celery reconnects. The message itself may still be in the unacked hash
    (of the promoted replica): its tag is kept in ``ORPHANED`` and the next channel this
    process opens puts it back on its queue at once (``GuardedChannel``), instead of when its
    lease lapses (30 s for an agent: seen as 31 s from the failover to the next dispatch).
    Delivered again, its run is answered from the agent's memory of recent results, or
    recorded once by the brain."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Unacked writes sent and not yet answered, by delivery tag (``append``).
        self._writing: dict[Any, Future[Any]] = {}

    def append(self, message: Any, delivery_tag: Any) -> None:
        """kombu's append, except that with ``vt_unacked_ahead`` the write's reply is not waited
        for: its bytes leave on this thread (``workers.sent_ahead``), so the message is handed
        to Celery at once, and whatever later changes the record (an ack, a reject, a restore)
        first waits for that reply. A message whose write is lost (the link cut as it left) is
        in no queue and no hash: the brain's reconciler re-sends its run, as it does for a
        message lost between the pop and kombu's write."""
        channel = self.channel
        if not getattr(channel, "vt_unacked_ahead", False):
            super().append(message, delivery_tag)
            return
        delivery = message.delivery_info
        prefix = channel.global_keyprefix or ""
        record = kombu_json.dumps([message._raw, delivery["exchange"], delivery["routing_key"]])
        commands = [
            ("ZADD", prefix + self.unacked_index_key, time.time(), delivery_tag),
            ("HSET", prefix + self.unacked_key, delivery_tag, record),
        ]
        with channel.conn_or_acquire() as client:
            self._writing[delivery_tag] = unacked_writes().send(client.connection_pool, commands, list)
        virtual.QoS.append(self, message, delivery_tag)

    def _written(self, delivery_tag: Any) -> None:
        """Wait for the unacked write of ``delivery_tag`` sent by ``append``, if one is pending."""
        future = self._writing.pop(delivery_tag, None)
        if future is None:
            return
        try:
            future.result()
        except Exception as exc:  # noqa: BLE001 - the record is lost; the reconciler re-sends the run
            log.warning(
                "kombu's record of message %s never reached Redis (%s): if its run is unfinished, "
                "the brain's reconciler re-sends it",
                delivery_tag,
                exc,
            )

    def restore_by_tag(self, tag: Any, client: Any = None, leftmost: bool = False) -> None:
        self._written(tag)
        super().restore_by_tag(tag, client=client, leftmost=leftmost)

    def restore_unacked(self, client: Any = None) -> None:
        for tag in list(self._writing):
            self._written(tag)
        super().restore_unacked(client)

    def ack(self, delivery_tag: Any) -> None:
        self._written(delivery_tag)
        try:
            self._remove_from_indices(delivery_tag).execute()
        except Exception:
            ORPHANED.add(delivery_tag)
            raise
        finally:
            virtual.QoS.ack(self, delivery_tag)

    def reject(self, delivery_tag: Any, requeue: bool = False) -> None:
        self._written(delivery_tag)
        try:
            if requeue:
                self.restore_by_tag(delivery_tag, leftmost=True)
            else:
                self._remove_from_indices(delivery_tag).execute()
        except Exception:
            if requeue:
                ORPHANED.add(delivery_tag)
            raise
        finally:
            virtual.QoS.ack(self, delivery_tag)


# Delivery tags of this process's messages whose ack (or requeue) met a lost connection.
ORPHANED: set[Any] = set()
_UNACKED_WRITES: list[SentAhead] = []
_UNACKED_LOCK = threading.Lock()


def unacked_writes() -> SentAhead:
    """The process's reader of unacked writes' replies (one thread: they come back in order)."""
    with _UNACKED_LOCK:
        if not _UNACKED_WRITES:
            _UNACKED_WRITES.append(SentAhead("vancetope-unacked", threads=1))
        return _UNACKED_WRITES[0]


CLIENT_QUEUE_PREFIX: Final = "client."  # workers.contracts.client_queue


class GuardedChannel(kombu_redis.Channel):
    """kombu's Redis channel, except that a payload ``check_payload`` refuses is dropped and
    logged instead of raised into the consumer loop, and an ack that cannot reach Redis frees
    its prefetch slot anyway (``ForgetfulQoS``)."""

    QoS = ForgetfulQoS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._requeue_orphans()

    def _requeue_orphans(self) -> None:
        """Put the messages of ``ORPHANED`` back on their queues, at the front (what kombu's
        restore does when a lease lapses); a tag the hash no longer holds is only forgotten."""
        for tag in list(ORPHANED):
            try:
                self.qos.restore_by_tag(tag, leftmost=True)
            except redis.RedisError as exc:
                log.warning("could not put back message %s whose ack was lost: %s (its lease will)", tag, exc)
                return
            ORPHANED.discard(tag)

    #: Transport options (``broker_transport_options``) this channel reads, as kombu's do.
    from_transport_options: tuple[str, ...] = (  # type: ignore[assignment]  # kombu types it by length
        *kombu_redis.Channel.from_transport_options,
        "vt_max_message_bytes",
        "vt_max_json_depth",
        "vt_on_delivery",
        "vt_unacked_ahead",
        "vt_client_queues",
    )
    vt_max_message_bytes: int = MAX_MESSAGE_BYTES
    vt_max_json_depth: int = MAX_JSON_DEPTH
    # Told of each checked message popped, before kombu writes it to its unacked hash (one
    # round trip): a client agent starts the run meanwhile (client_agent.early_begin).
    vt_on_delivery: Callable[[dict[str, Any]], None] | None = None
    # Send kombu's unacked write without waiting for its reply (``ForgetfulQoS.append``): a
    # client agent's tool starts a round trip sooner.
    vt_unacked_ahead: bool = False
    # Publish to a client's queue (``client.<id>``) under that client's key prefix
    # (``c:<id>:client.<id>``, where its agent reads), on this channel's connection: the brain's
    # one app sends every client's calls, instead of an app and its connections per client
    # (with 1,000 clients, 2,000 Redis connections and ~100 MB in each brain). Only the key
    # changes: the message, its routing key included, is what a channel with that prefix sends.
    vt_client_queues: bool = False

    def _get_client(self) -> Any:
        # kombu's client classes, with a lock released without a script (workers.redis_lock):
        # a client agent's Redis user may run none.
        if self.global_keyprefix:
            return functools.partial(_PrefixedClient, global_keyprefix=self.global_keyprefix)
        return _Client

    def _connparams(self, asynchronous: bool = False) -> Any:
        # kombu 5.7: when the broker connection is lost, Celery closes the connection, the
        # channel's close() tries to restore its unacked messages on a new client, and by
        # then the transport's ``client`` is None: AttributeError, which Celery takes for an
        # unrecoverable error, and the worker exits instead of reconnecting (seen killing the
        # server pool when redis-server restarts). A connection error here is what it is:
        # Celery ignores it while closing and reconnects; the unrestored messages come back
        # when their lease lapses (workers.lease).
        if self.connection.client is None:
            raise redis.exceptions.ConnectionError("the broker connection is already closed")
        return super()._connparams(asynchronous=asynchronous)

    def _create_client(self, asynchronous: bool = False) -> Any:
        # kombu builds a new redis-py client for every publish, ack and reservation
        # (conn_or_acquire); with redis-py 8 building one is ~0.05 ms (its response-callback
        # table), a tenth of a pool main process's loop on the throughput benchmark. A client
        # is only a handle on the connection pool and safe to share between threads (commands
        # and pipelines take their own connection), so one is kept per pool the channel has.
        if asynchronous:
            return super()._create_client(asynchronous=True)
        pool = self.pool
        kept: tuple[Any, Any] | None = self.__dict__.get("_vt_client")
        if kept is None or kept[0] is not pool:
            kept = self._vt_client = (pool, super()._create_client())
        return kept[1]

    def _put(self, queue: str, message: Any, **kwargs: Any) -> None:
        if self.vt_client_queues and not self.global_keyprefix and queue.startswith(CLIENT_QUEUE_PREFIX):
            queue = client_keyprefix(queue[len(CLIENT_QUEUE_PREFIX) :]) + queue  # validates the id
        super()._put(queue, message, **kwargs)

    def _checked(self, raw: bytes, queue: str) -> dict[str, Any] | None:
        try:
            return check_payload(raw, max_bytes=self.vt_max_message_bytes, max_depth=self.vt_max_json_depth)
        except UnsafeMessage as exc:
            log.error(
                "dropped a message from queue %r (key %r): %s",
                queue,
                f"{self.global_keyprefix or ''}{queue}",
                exc.reason,
            )
            return None

    def _brpop_read(self, **options: Any) -> bool:
        # kombu's _brpop_read, with the inline ``loads`` replaced by ``_checked``.
        try:
            try:
                dest__item = self.client.parse_response(self.client.connection, "BRPOP", **options)
            except self.connection_errors:
                # A broken connection is dropped so the next poll reconnects (as kombu does).
                self.client.connection.disconnect()
                raise
            if not dest__item:
                raise Empty()
            key, item = dest__item
            dest = kombu_redis.bytes_to_str(key).rsplit(self.sep, 1)[0]
            self._queue_cycle.rotate(dest)
            message = self._checked(item, dest)
            if message is None:
                raise Empty()  # what kombu raises for "nothing delivered"; the loop goes on
            self._tell_delivered(message)
            self.connection._deliver(message, dest)
            return True
        finally:
            self._in_poll = None  # type: ignore[assignment]  # kombu's own reset, typed bool there
            self._flush_brpop_reauth()

    def _tell_delivered(self, message: dict[str, Any]) -> None:
        if self.vt_on_delivery is None:
            return
        try:
            self.vt_on_delivery(message)
        except Exception:  # a hint only: the message is delivered whatever it does
            log.exception("the delivery hook failed; delivering the message anyway")

    def _get(self, queue: str, timeout: float | None = None) -> dict[str, Any]:
        # kombu's _get (basic_get and the polling path), checked the same way.
        with self.conn_or_acquire() as client:
            for pri in self.priority_steps:
                item = client.rpop(self._q_for_pri(queue, pri))
                if item:
                    self._maybe_update_queues_expire(client, queue)
                    message = self._checked(item, queue)
                    if message is None:
                        raise Empty()
                    return message
            self._maybe_update_queues_expire(client, queue)
            raise Empty()


class GuardedTransport(kombu_redis.Transport):
    """kombu's Redis transport with ``GuardedChannel``."""

    Channel = GuardedChannel


class GuardedSentinelChannel(GuardedChannel, kombu_redis.SentinelChannel):
    """kombu's Sentinel channel (its pool follows the master the sentinels name) with the
    guard, the script-free locks and the key prefix of ``GuardedChannel``: a client agent
    behind Sentinel stays confined to its own keys."""

    from_transport_options: tuple[str, ...] = (  # type: ignore[assignment]  # kombu types it by length
        *GuardedChannel.from_transport_options,
        "master_name",
        "min_other_sentinels",
        "sentinel_kwargs",
        "sentinel_fanout_compat",
    )


class GuardedSentinelTransport(kombu_redis.SentinelTransport):
    """kombu's Sentinel transport with ``GuardedSentinelChannel``
    (``workers.redis_connect.SENTINEL_TRANSPORT_PATH`` names it)."""

    Channel = GuardedSentinelChannel


# kombu's Connection.switch (Celery calls it on every reconnect when the URL has ';'-separated
# alternates, as a Sentinel URL does) re-reads the transport from the URL's scheme and drops
# the class ``broker_transport`` named. Seen: a client agent's consumer, reconnecting after a
# failover, got kombu's own Sentinel channel, whose mutex is a Lua script its Redis user may
# not run (NOPERM evalsha), and stopped. In our processes "sentinel" means the guarded one.
TRANSPORT_ALIASES["sentinel"] = "workers.transport:GuardedSentinelTransport"
