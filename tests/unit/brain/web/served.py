"""Stored trees and a served web view for the web view's tests: the app on a real uvicorn
server (in a thread) over a real SQLite store opened read-only, as ``python -m brain.web`` runs it."""

from __future__ import annotations

import threading
import time
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn

from brain.core.models import TaskRecord, TaskState, TaskTree, TreeRecord, TreeStatus
from brain.stack.redis_server import free_port
from brain.store import SQLiteStore, open_store
from brain.web.actions import Actions
from brain.web.app import create_app

USERS = {"ops": "ops-password"}
UNAUTHORIZED = "401 Unauthorized: log in as user ops, the password in /somewhere/web.secret\n"
T0 = 1_700_000_000.0


def stored_tree(
    store: SQLiteStore,
    tree_id: str,
    tasks: list[dict[str, Any]],
    states: dict[str, TaskState] | None = None,
    *,
    user: str = "ada",
    status: TreeStatus = TreeStatus.RUNNING,
    submitted_at: float = T0,
    schedule: str | None = None,
    **fields: Any,
) -> TreeRecord:
    """Put a tree whose tasks are ``tasks`` (spec dicts) into ``store``, each task in its state
    of ``states`` (default pending), with times from ``submitted_at`` that make a timeline;
    ``fields`` go on records by task id (``{"b": {"client_id": "laptop"}}``)."""
    spec = TaskTree.model_validate({"id": tree_id.split("-")[0], "tasks": tasks})
    record = TreeRecord(
        tree_id=tree_id,
        tree=spec,
        user=user,
        status=status,
        schedule=schedule,
        submitted_at=submitted_at,
        finished_at=submitted_at + 60 if status is not TreeStatus.RUNNING else None,
    )
    records = []
    for i, task in enumerate(spec.tasks):
        state = (states or {}).get(task.id, TaskState.PENDING)
        times: dict[str, Any] = {}
        if state is not TaskState.PENDING:
            times = {"queued_at": submitted_at + i, "first_queued_at": submitted_at + i}
        if state in (TaskState.RUNNING, TaskState.DONE, TaskState.FAILED):
            times["started_at"] = submitted_at + i + 0.5
        if state.is_final:
            times["finished_at"] = submitted_at + i + 2
        values = {
            "route": "server" if state is not TaskState.PENDING else "",
            **times,
            **fields.get(task.id, {}),
        }
        records.append(TaskRecord(tree_id=tree_id, task_id=task.id, tool=task.tool, state=state, **values))
    store.put_tree(record, records)
    return record


@dataclass
class Served:
    url: str
    store_path: Path
    writer: SQLiteStore
    server: uvicorn.Server


@contextmanager
def served(
    tmp_path: Path,
    address: str = "127.0.0.1",
    poll_s: float = 0.1,
    actions: Actions | None = None,
    store_path: Path | None = None,
    flower_url: str | None = None,
    users: Mapping[str, str] = USERS,
    result_users: Collection[str] = (),
    argument_users: Collection[str] = (),
) -> Iterator[Served]:
    """The web view on ``address`` over a fresh store (or the one at ``store_path``): ``writer``
    writes it, the app reads it through its own read-only connection; ``actions``: what it may
    change through (none by default: pages only); ``result_users``, ``argument_users``: the logins shown results, argument values."""
    path = store_path or tmp_path / "store.db"
    writer = SQLiteStore(path)
    reader = open_store(str(path), read_only=True)
    port = free_port()
    app = create_app(
        reader,
        address=address,
        users=users,
        unauthorized=UNAUTHORIZED,
        poll_s=poll_s,
        actions=actions,
        flower_url=flower_url,
        result_users=result_users,
        argument_users=argument_users,
    )
    server = uvicorn.Server(uvicorn.Config(app, host=address, port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="test:web", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the web view did not start"
        time.sleep(0.02)
    try:
        yield Served(f"http://{address}:{port}", path, writer, server)
    finally:
        server.should_exit = True
        thread.join(10)
        reader.close()
        writer.close()
