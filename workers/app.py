"""The one Celery app (layer: workers).

Settings from docs/reliability.md: late ack, reject on worker lost, prefetch 1, JSON only,
and a short visibility timeout with leases renewed by live workers (``workers.lease``):
a message reserved by a consumer that died is back on its queue within
``visibility_timeout + RESTORE_EVERY_S`` seconds, not an hour. Every app reads its queues through ``workers.transport`` (a message nobody
can decode is dropped and logged, not raised into the consumer). There is no result backend:
results travel to the brain as ``vancetope.record_result`` jobs on queue ``brain``
(docs/performance.md: awaiting thousands of AsyncResults on the Redis backend stalls).
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery

from workers import orphans
from workers.contracts import BRAIN_QUEUE, MAX_MESSAGE_BYTES, SERVER_QUEUE
from workers.event_batching import BatchedTaskEvents
from workers.lease import RESTORE_EVERY_S, VISIBILITY_TIMEOUT_S, LeaseRenewal
from workers.redis_connect import broker_settings
from workers.transport import TRANSPORT_PATH

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
# A backstop for a call that hangs its worker; per-call timeouts (timeout_s) and the
# brain's max_total_s end runs long before this.
HARD_TIME_LIMIT_S = 6 * 3600

# A Redis command's reply, and a connection, take at most this long on a live link.
SOCKET_TIMEOUT_S = 10.0
SOCKET_CONNECT_TIMEOUT_S = 5.0


def message_limit(max_result_bytes: int | None) -> int:
    """Largest message a consumer accepts: room for a result of ``max_result_bytes`` once it is
    JSON-escaped and base64-encoded, and never below ``MAX_MESSAGE_BYTES``."""
    return max(MAX_MESSAGE_BYTES, 3 * (max_result_bytes or 0))


def celery_config(
    broker_url: str,
    *,
    visibility_timeout_s: int = VISIBILITY_TIMEOUT_S,
    keyprefix: str | None = None,
    max_message_bytes: int = MAX_MESSAGE_BYTES,
    sentinel_master: str | None = None,
    client_queues: bool = False,
) -> dict[str, Any]:
    """``sentinel_master``: the master a ``sentinel://`` URL names (``workers.redis_connect.master_name``).
    ``client_queues``: calls sent to a client's queue go under its key prefix
    (``GuardedChannel.vt_client_queues``): the brain's app."""
    broker, sentinel_options = broker_settings(broker_url, sentinel_master)
    transport: dict[str, Any] = {
        **sentinel_options,
        "visibility_timeout": visibility_timeout_s,
        # Look for expired leases every few seconds, on every sweep (kombu's default is
        # every tenth sweep of ten seconds).
        "unacked_restore_interval": RESTORE_EVERY_S,
        "unacked_restore_throttle": 1,
        "vt_max_message_bytes": max_message_bytes,
        # kombu sets no socket timeout: a command whose bytes a link dropped (a cut, a Wi-Fi
        # drop, a Redis restart behind a NAT) waits for its reply for ever. Seen (issue 25):
        # an agent's consumer stuck in restore_visible's lock SET after a 15 s cut, never
        # taking work again. No Redis command Vancetope sends takes this long (BRPOP is read
        # only once readable, with its own 1 s timeout); the connection is dropped and
        # Celery reconnects. Keepalive finds a peer that vanished without a word.
        "socket_timeout": SOCKET_TIMEOUT_S,
        "socket_connect_timeout": SOCKET_CONNECT_TIMEOUT_S,
        "socket_keepalive": True,
    }
    if "master_name" in transport:
        # Given sentinel_kwargs replace redis-py's default (the socket_* options): the
        # sentinels too must not hang a consumer on a dead link.
        transport["sentinel_kwargs"] = {
            "socket_timeout": SOCKET_TIMEOUT_S,
            "socket_connect_timeout": SOCKET_CONNECT_TIMEOUT_S,
            **(transport.get("sentinel_kwargs") or {}),
        }
    if keyprefix:
        transport["global_keyprefix"] = keyprefix
    if client_queues:
        transport["vt_client_queues"] = True
    return {
        # The class, not the URL's scheme, picks the transport; kombu still parses the URL
        # (host, password, db, ssl_* options), so redis:// and rediss:// work as before. A
        # sentinel:// URL gets the guarded Sentinel transport instead (broker_settings).
        "broker_transport": TRANSPORT_PATH,
        **broker,
        "broker_transport_options": transport,
        "broker_connection_retry_on_startup": True,
        "result_backend": None,
        "task_ignore_result": True,
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "task_acks_on_failure_or_timeout": True,
        "worker_prefetch_multiplier": 1,
        "worker_cancel_long_running_tasks_on_connection_loss": True,
        # Leases are renewed while a task runs (workers.lease), so the hard limit need not
        # stay below the visibility timeout.
        "task_time_limit": HARD_TIME_LIMIT_S,
        "task_serializer": "json",
        "accept_content": ["json"],
        "result_serializer": "json",
        "result_extended": False,
        "task_track_started": True,
        "task_default_queue": SERVER_QUEUE,
        # Off here: brain.runtime.dispatch.Publisher sends the tool calls' task-sent events itself,
        # a batch of them as one message (Celery's was one message per task, ~10% of a run
        # of no-op tasks on 2 cores); bookkeeping jobs (record_result, publish_call) need none.
        "task_send_sent_event": False,
        "worker_send_task_events": True,
        "worker_hijack_root_logger": False,
        "broker_pool_limit": 10,
    }


def make_app(
    broker_url: str,
    *,
    visibility_timeout_s: int = VISIBILITY_TIMEOUT_S,
    keyprefix: str | None = None,
    max_message_bytes: int = MAX_MESSAGE_BYTES,
    sentinel_master: str | None = None,
    client_queues: bool = False,
) -> Celery:
    app = Celery("vancetope", set_as_current=False)
    orphans.install()  # a worker of a stack that was killed stops anyway
    app.steps["consumer"].add(LeaseRenewal)
    app.steps["consumer"].add(BatchedTaskEvents)
    app.conf.update(
        celery_config(
            broker_url,
            visibility_timeout_s=visibility_timeout_s,
            keyprefix=keyprefix,
            max_message_bytes=max_message_bytes,
            sentinel_master=sentinel_master,
            client_queues=client_queues,
        )
    )
    return app


def _app_from_env() -> Celery:
    return make_app(
        os.environ.get("VANCETOPE_REDIS_URL") or DEFAULT_REDIS_URL,
        visibility_timeout_s=int(os.environ.get("VANCETOPE_VISIBILITY_TIMEOUT_S") or VISIBILITY_TIMEOUT_S),
        max_message_bytes=message_limit(int(os.environ.get("VANCETOPE_MAX_RESULT_BYTES") or 0)),
    )


app = _app_from_env()

__all__ = ["BRAIN_QUEUE", "SERVER_QUEUE", "app", "celery_config", "make_app", "message_limit"]
