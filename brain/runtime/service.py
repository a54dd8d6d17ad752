"""Assemble the brain from settings (layer: brain/runtime; wiring). No decisions here."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

import redis
from celery import Celery

from brain.config import Settings
from brain.core.snapshot import RegistrySnapshot
from brain.core.toolnames import clash_lines
from brain.errors import StackNotRunning
from brain.hot.acl import AclUsers, sync_users_of
from brain.hot.boundary import unreachable
from brain.hot.gate import Gate
from brain.hot.parked import ParkedWork
from brain.hot.presence import PresenceBook
from brain.hot.state import HotState
from brain.runtime import vault
from brain.runtime.clientwork import ClientWork
from brain.runtime.dispatch import Publisher
from brain.runtime.events import ClientEvents
from brain.runtime.gate_timer import run_gate_timer
from brain.runtime.intake import Intake
from brain.runtime.registry import build_registry
from brain.runtime.relay import Relay
from brain.runtime.reload import Reloader, Signature, signature, sources
from brain.runtime.retries import run_retry_timer
from brain.runtime.revoked import RevokedEvents
from brain.runtime.schedule_runs import ScheduleRuns
from brain.runtime.scheduler import Scheduler
from brain.runtime.submitters import SubmitterUsers
from brain.runtime.sweeps import Sweeps
from brain.runtime.throttle_events import run_throttle_events
from brain.store import Store, open_store
from workers.app import make_app, message_limit
from workers.urls import redact_url

log = logging.getLogger("vancetope.brain")


@dataclass
class Brain:
    settings: Settings
    redis_url: str
    app: Celery
    store: Store
    hot: HotState
    scheduler: Scheduler
    intake: Intake
    clients: ClientWork
    sweeps: Sweeps
    schedules: ScheduleRuns
    # The registry sources' size and mtime when the registry in use was built (brain.runtime.reload).
    sources_seen: Signature | None = None

    @classmethod
    def connect(cls, settings: Settings, redis_url: str, registry: RegistrySnapshot | None = None) -> Brain:
        """Wire a brain to a running Redis. Without ``registry`` it uses the snapshot the
        brain worker published (the CLI's case); raises StackNotRunning if there is none."""
        app = make_app(
            redis_url,
            visibility_timeout_s=settings.visibility_timeout_s,
            max_message_bytes=message_limit(settings.max_result_bytes),
            client_queues=True,  # the brain alone sends client calls (brain.runtime.dispatch)
        )
        hot = HotState.from_url(redis_url)
        if registry is None:
            try:
                registry = published_registry(hot, redis_url)
            except BaseException:
                hot.close()  # connected by the read: closed here, not left to the garbage collector
                app.close()
                raise
        store = open_store(settings.store)
        events = ClientEvents(app, task_events=settings.task_events)
        scheduler = Scheduler(
            store,
            hot,
            Publisher(app, task_events=settings.task_events, gate=Gate(hot.r)),
            registry,
            settings,
            presence=PresenceBook(hot.r, store),
            parked=ParkedWork(hot.r),
            events=events,
            revoked=RevokedEvents(app, events, task_events=settings.task_events),
        )
        # The scheduler's own presence book, parked lists and clock: one of each per brain.
        presence, parked, clock = scheduler.presence, scheduler.parked, scheduler.clock
        clients = ClientWork(
            scheduler,
            store=store,
            hot=hot,
            presence=presence,
            parked=parked,
            clock=clock,
            events=scheduler.events,
        )
        sweeps = Sweeps(
            scheduler,
            clients,
            store=store,
            hot=hot,
            presence=presence,
            parked=parked,
            settings=settings,
            registry=lambda: scheduler.registry,  # replaced on a reload (brain.runtime.reload)
            clock=clock,
        )
        return cls(
            settings=settings,
            redis_url=redis_url,
            app=app,
            store=store,
            hot=hot,
            scheduler=scheduler,
            intake=Intake(scheduler),
            clients=clients,
            sweeps=sweeps,
            schedules=ScheduleRuns(scheduler, settings.schedules),
        )

    def sync_client_users(self) -> None:
        """Make Redis's client ACL users match the store's enrollments (the record)."""
        sync_users(self.hot.r, self.store)

    def publish_registry(self) -> None:
        self.hot.put_registry(self.scheduler.registry.model_dump(mode="json"))

    def close(self) -> None:
        if self.scheduler.events is not None:
            self.scheduler.events.close()
        self.scheduler.publisher.close()
        self.app.close()
        self.store.close()
        self.hot.close()


def published_registry(hot: HotState, redis_url: str) -> RegistrySnapshot:
    """The registry snapshot the brain worker published; StackNotRunning when Redis does not
    answer or holds none."""
    try:
        snapshot = hot.get_registry()
    except redis.RedisError as exc:
        raise unreachable(redis_url, exc) from exc
    if snapshot is None:
        raise StackNotRunning(
            f"no brain has published its registry in Redis at {redact_url(redis_url)}; start one with "
            "`vancetope up` (or `vancetope brain` beside an external Redis)"
        )
    return RegistrySnapshot.model_validate(snapshot)


def sync_users(r: redis.Redis, store: Store) -> None:
    """Redis's (and its sentinels') client and submit users made equal to the store's record."""
    sync_users_of(r, [(AclUsers(r), store.list_enrollments()), (SubmitterUsers(r), store.list_submitters())])


def restore_users_first(settings: Settings, redis_url: str) -> None:
    """The users, before discovery (which may take a minute of MCP servers starting): sentinels
    started from a config written anew, with the brain away, refuse every client until then.
    Failing here is not fatal: the brain syncs again once connected, and every sweep."""
    hot = HotState.from_url(redis_url)
    store = open_store(settings.store)
    try:
        sync_users(hot.r, store)
    except Exception as exc:  # noqa: BLE001 - the sync after connecting says it again
        log.warning("could not restore the client users before discovery: %s", exc)
    finally:
        store.close()
        hot.close()


def start_brain(settings: Settings, redis_url: str) -> Brain:
    """The brain process: discover server tools, publish the registry snapshot."""
    seen = signature(sources(settings))
    restore_users_first(settings, redis_url)
    vault.install(settings)  # discovery starts the MCP servers: their ${vault:NAME} resolve here
    registry = build_registry(settings)
    for line in clash_lines(registry.clashes):
        log.warning("%s", line)
    for failure in registry.mcp_failures:
        log.error("%s", failure.described())
    brain = Brain.connect(settings, redis_url, registry)
    brain.sources_seen = seen
    # Before readiness: enrolled agents can connect as soon as the stack says it is up.
    brain.sync_client_users()
    brain.publish_registry()
    return brain


def run_background(brain: Brain, stop: threading.Event) -> list[threading.Thread]:
    """The brain's own threads: the client relay, the reconciler, the retry timer and the registry's reloader,
    until ``stop`` is set."""
    threads = [
        Relay(brain.intake, brain.clients).run(stop),
        run_reconciler(brain, stop),
        run_retry_timer(brain.scheduler, stop),
        run_gate_timer(brain.redis_url, stop),
        Reloader(brain.settings, brain.hot, brain.scheduler, brain.sources_seen).run(stop),
    ]
    if brain.settings.task_events:  # off: Flower gets no task events from the brain at all
        threads.append(run_throttle_events(brain.hot.r, brain.app, stop))
    return threads


def run_reconciler(brain: Brain, stop: threading.Event) -> threading.Thread:
    """Sweep every ``reconcile_interval_s`` until ``stop`` is set."""

    def loop() -> None:
        while not stop.wait(brain.settings.reconcile_interval_s):
            try:
                brain.sync_client_users()
            except Exception:
                log.exception("restoring client ACL users from the store failed")
            try:
                resent = brain.sweeps.run_once()
                if resent:
                    log.warning("reconciler re-sent %d lost task(s): %s", len(resent), ", ".join(resent))
            except Exception:
                log.exception("reconcile sweep failed at %s", time.strftime("%X"))
            try:
                brain.schedules.sweep()  # queued fires, run summaries (brain.runtime.schedule_runs)
            except Exception:
                log.exception("schedule sweep failed at %s", time.strftime("%X"))

    thread = threading.Thread(target=loop, name="vancetope-reconciler", daemon=True)
    thread.start()
    return thread
