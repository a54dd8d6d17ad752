"""A scheduler, client work and the reconciler on a SQLite store and a real redis-server, with
Celery replaced by a recorder of the calls sent and the clock injected: what the runtime's unit
tests (test_scheduler, test_sweeps, test_clientwork) drive."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from brain.config import load_settings
from brain.core.models import Location, TaskTree
from brain.core.snapshot import RegistrySnapshot
from brain.core.treefile import load_registry, merge_registry, spec_from_descriptor
from brain.hot.parked import ParkedWork
from brain.hot.presence import PresenceBook
from brain.hot.state import HotState
from brain.runtime.clientwork import ClientWork
from brain.runtime.scheduler import Scheduler
from brain.runtime.sweeps import Sweeps
from brain.store.sqlite import SQLiteStore
from workers.contracts import ClientConnected, ClientType, ToolCall, ToolDescriptor, ToolType
from workers.tools.builtin import builtin_descriptors

EXAMPLES = Path(__file__).resolve().parents[4] / "examples"
GRACE = 10.0


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Sent:
    """Celery's stand-in: the calls sent, in order."""

    def __init__(self) -> None:
        self.calls: list[ToolCall] = []
        # No admission gate: calls go straight, as a Publisher without one sends them.
        self.gate = None
        self.dropped: list[str] = []  # run ids the pools were asked to drop (Publisher.drop_queued)
        self.priorities: dict[str, int | None] = {}  # run id -> the priority it was sent at

    @contextmanager
    def batch(self) -> Iterator[None]:
        yield

    def send(self, call: ToolCall, pool: str | None = None, priority: int | None = None) -> None:
        self.calls.append(call)
        self.priorities[call.run_id] = priority

    def drop_queued(self, run_ids: list[str]) -> None:
        self.dropped.extend(run_ids)

    def of(self, task_id: str) -> list[ToolCall]:
        return [c for c in self.calls if c.task_id == task_id]


@dataclass
class Rig:
    scheduler: Scheduler
    clients: ClientWork
    sweeps: Sweeps
    sent: Sent
    clock: Clock
    r: redis.Redis
    store: SQLiteStore
    presence: PresenceBook

    def task(self, tree_id: str, task_id: str) -> Any:
        return self.store.get_task(tree_id, task_id)

    def later(self) -> None:
        """Past the reconciler's grace."""
        self.clock.advance(GRACE + 1)

    def connect(self, client_id: str = "laptop", session_id: str = "s1", *, requeue: bool = True) -> None:
        msg = ClientConnected(
            client_id=client_id,
            session_id=session_id,
            client_type=ClientType.CLI,
            available_tools=[ToolDescriptor(name="read_local_file", type=ToolType.NATIVE)],
            sent_at=self.clock(),
        )
        if requeue:
            assert self.clients.on_connected(msg, client_id).accepted
        else:
            enrollment = self.presence.enrollment(client_id)
            assert enrollment is not None
            self.presence.connect(msg, enrollment, self.clock())


def server_registry() -> RegistrySnapshot:
    """The built-ins and the example registry (its client tools included)."""
    builtins = {d.name: spec_from_descriptor(d, Location.SERVER) for d in builtin_descriptors()}
    return RegistrySnapshot(tools=merge_registry(builtins, load_registry(EXAMPLES / "registry.yaml")))


def make_rig(tmp_path: Path, r: redis.Redis, **settings: Any) -> Iterator[Rig]:
    registry = server_registry()
    values: dict[str, Any] = {"data_dir": tmp_path / "data", "reconcile_grace_s": GRACE, **settings}
    config = load_settings(env={}, cwd=tmp_path, **values)
    store = SQLiteStore(tmp_path / "store.db")
    hot, sent, clock = HotState(r), Sent(), Clock()
    presence, parked = PresenceBook(r, store), ParkedWork(r)
    scheduler = Scheduler(
        store, hot, sent, registry, config, presence=presence, parked=parked, clock=clock,  # type: ignore[arg-type]
    )  # fmt: skip
    clients = ClientWork(scheduler, store=store, hot=hot, presence=presence, parked=parked, clock=clock)
    sweeps = Sweeps(
        scheduler,
        clients,
        store=store,
        hot=hot,
        presence=presence,
        parked=parked,
        settings=config,
        registry=lambda: scheduler.registry,
        clock=clock,
    )
    yield Rig(scheduler, clients, sweeps, sent, clock, r, store, presence)
    store.close()


def tree(*tasks: dict[str, Any], **fields: Any) -> TaskTree:
    return TaskTree.model_validate({"id": "t", "tasks": list(tasks), **fields})


def echo(task_id: str = "a", **fields: Any) -> dict[str, Any]:
    return {"id": task_id, "tool": "echo", "args": {"value": task_id}, **fields}


def local_read(task_id: str = "r", **fields: Any) -> dict[str, Any]:
    return {"id": task_id, "tool": "read_local_file", "args": {"path": "notes.txt"}, **fields}


def kombu_message(run_id: str) -> bytes:
    """What kombu's Redis transport keeps for a job: its Celery id in the headers."""
    return json.dumps({"headers": {"id": run_id, "task": "vancetope.run_tool"}, "body": ""}).encode()
