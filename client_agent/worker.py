"""The client agent's Celery worker (layer: client_agent, Celery glue).

One job: a Celery worker, in this process, consuming only ``client.<id>`` through a
connection whose kombu ``global_keyprefix`` is ``c:<id>:`` (docs/security.md, "A
workstation"): remote control, task events, gossip, mingle and the worker heartbeat are
off, so the agent needs no pub/sub and no key outside its prefix. The brain relays
this agent's presence and task activity into Celery events for Flower.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from types import FrameType

from celery import Celery
from celery.app import trace
from celery.platforms import EX_FAILURE, EX_OK
from celery.worker import WorkController
from celery.worker import state as worker_state

from client_agent.config import AgentConfig
from workers.app import make_app
from workers.contracts import client_keyprefix, client_queue


def worker_hostname(client_id: str) -> str:
    return f"client-agent@{client_id}"


def make_agent_app(config: AgentConfig) -> Celery:
    """The shared Celery app, on this client's key prefix, with everything chatty turned off."""
    app = make_app(
        config.own_broker_url(),
        keyprefix=client_keyprefix(config.client_id),
        sentinel_master=config.redis_sentinel_master,
    )
    app.conf.update(
        worker_enable_remote_control=False,
        worker_send_task_events=False,
        task_send_sent_event=False,
        worker_concurrency=config.concurrency,
        worker_pool=config.pool.value,
        # A laptop may be offline for hours: keep trying to reach the broker, never give up.
        broker_connection_max_retries=None,
    )
    return app


def make_worker(app: Celery, config: AgentConfig, loglevel: str) -> WorkController:
    hostname = worker_hostname(config.client_id)
    # What `celery worker` does first: without it a task's request.hostname is the machine's
    # name, and results would not say which client agent ran them.
    trace.setup_worker_optimizations(app, hostname)
    return WorkController(
        app=app,
        hostname=hostname,
        queues=[client_queue(config.client_id)],
        pool_cls=config.pool.value,
        concurrency=config.concurrency,
        loglevel=loglevel,
        task_events=False,
        without_gossip=True,
        without_mingle=True,
        without_heartbeat=True,
    )


def request_stop(cold: bool = False) -> None:
    """Ask the running worker to stop: warm (finish running tasks, exit 0) or cold (exit 1).
    Celery's consumer loop checks these flags on every turn; safe from a signal handler."""
    if cold:
        worker_state.should_terminate = EX_FAILURE
    worker_state.should_stop = EX_OK


def install_signal_handlers(on_signal: Callable[[int], None]) -> None:
    """SIGTERM/SIGINT: the first asks for a warm stop, the second for a cold one."""
    received: list[int] = []

    def handle(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        request_stop(cold=len(received) > 1)
        on_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, handle)
