"""Watching one task tree to its end (layer: brain/cli; CLI glue behind `vancetope run`).

The store is read on every redraw (it is the record); Redis pub/sub is only a wake-up, and
Redis also says which tasks a worker holds. So a Redis blip — the stack restarting its
redis-server — costs the watcher nothing but those extras: it keeps reading the store,
shows a dim "Redis unreachable, retrying…" line, resubscribes when Redis answers again,
and gives up (StackNotRunning) only after ``REDIS_RETRY_FOR_S`` without it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import redis
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.text import Text

from brain.cli.display import progress, task_table
from brain.core.models import TaskRecord, TaskState, TreeRecord, TreeStatus
from brain.errors import StackNotRunning
from brain.hot.boundary import unreachable
from brain.hot.gate import Gate
from brain.runtime.service import Brain
from workers.contracts import channel_tree_events

REDRAW_EVERY_S = 0.2
# While Redis does not answer: read the store this often, and give up after this long.
REDIS_RETRY_EVERY_S = 1.0
REDIS_RETRY_FOR_S = 120.0
REDIS_DOWN = "Redis unreachable, retrying…"


def _wait_for_events(pubsub: Any) -> None:
    """Wait for a wake-up, then let a burst of them coalesce: a big tree sends one per result,
    and redrawing on each would spend the cores the workers need."""
    if pubsub.get_message(timeout=0.5) is None:
        return
    settle = time.monotonic() + REDRAW_EVERY_S
    while time.monotonic() < settle:
        pubsub.get_message(timeout=max(settle - time.monotonic(), 0.0))


def clients_of(records: list[TaskRecord]) -> set[str]:
    return {r.client_id for r in records if r.client_id is not None}


class _RedisLink:
    """The watcher's Redis side: a subscription that is dropped on an error and made again on
    the next call, and the time Redis stopped answering (None while it answers)."""

    def __init__(self, brain: Brain, tree_id: str, clock: Callable[[], float]) -> None:
        self.brain, self.tree_id, self.clock = brain, tree_id, clock
        self.pubsub: Any = None
        self.down_since: float | None = None

    def running(self, records: list[TaskRecord]) -> dict[str, dict[str, Any]]:
        """Which tasks a worker holds ({} while Redis is unreachable)."""
        try:
            if self.pubsub is None:
                self.pubsub = self.brain.hot.r.pubsub(ignore_subscribe_messages=True)
                self.pubsub.subscribe(channel_tree_events(self.tree_id))
            running = dict(self.brain.hot.running(self.tree_id, clients_of(records)))
            # Queued server runs waiting at the gate show as throttled (brain.hot.gate).
            waiting = {
                r.run_id: r.task_id for r in records if r.state is TaskState.QUEUED_SERVER and r.run_id
            }
            if waiting:
                for run, why in Gate(self.brain.hot.r).throttled(waiting).items():
                    running.setdefault(waiting[run], {"run_id": run, "throttled": why})
        except redis.RedisError as exc:
            self._lost(exc)
            return {}
        self.down_since = None
        return running

    def wait(self) -> None:
        if self.pubsub is None:
            time.sleep(REDIS_RETRY_EVERY_S)  # bounded: the store is polled meanwhile
            return
        try:
            _wait_for_events(self.pubsub)
        except redis.RedisError as exc:
            self._lost(exc)

    def _lost(self, exc: redis.RedisError) -> None:
        self.close()
        now = self.clock()
        self.down_since = self.down_since if self.down_since is not None else now
        if now - self.down_since > REDIS_RETRY_FOR_S:
            raise unreachable(self.brain.redis_url, exc) from exc

    def close(self) -> None:
        pubsub, self.pubsub = self.pubsub, None
        if pubsub is not None:
            try:
                pubsub.close()
            except redis.RedisError:
                pass


def _read(brain: Brain, tree_id: str) -> tuple[TreeRecord, list[TaskRecord]]:
    tree_rec = brain.store.get_tree(tree_id)
    assert tree_rec is not None
    return tree_rec, brain.store.get_tasks(tree_id)


def watch(
    brain: Brain,
    tree_id: str,
    timeout: float | None,
    console: Console,
    err: Console,
    clock: Callable[[], float] = time.monotonic,
    show_table: bool = True,
    on_interrupt: Callable[[], None] | None = None,
) -> TreeStatus | None:
    """Redraw until the tree ends (its status) or ``timeout`` passes (None); then print every
    task (unless ``show_table`` is off: the caller prints its own report). Ctrl-C ends the
    watch too: ``on_interrupt`` is called then, before the last read (the caller says what
    happens to the tree); without one the watcher says the tree goes on."""
    link = _RedisLink(brain, tree_id, clock)
    deadline = clock() + timeout if timeout else None
    try:
        with Live(console=console, refresh_per_second=8, transient=True) as live:
            while True:
                tree_rec, records = _read(brain, tree_id)
                running = link.running(records)
                view: RenderableType = progress(tree_rec, records, running)
                if link.down_since is not None:
                    # Above the table: below it, a tree taller than the terminal cut it off.
                    view = Group(Text(REDIS_DOWN, style="dim"), view)
                live.update(view)
                if tree_rec.status is not TreeStatus.RUNNING:
                    break
                if deadline and clock() > deadline:
                    err.print(
                        f"[yellow]still running after {timeout:g}s; see `vancetope status {tree_id}`[/]"
                    )
                    break
                link.wait()
    except KeyboardInterrupt:
        if on_interrupt is not None:
            on_interrupt()
        else:
            err.print(f"[yellow]stopped watching; the tree goes on: `vancetope status {tree_id}`[/]")
    except StackNotRunning as exc:
        # Given up on Redis: say which tree, and that it is not lost.
        raise StackNotRunning(
            f"{exc} The tree {tree_id} goes on once the stack is back: `vancetope status {tree_id}`"
        ) from exc
    finally:
        link.close()
    tree_rec, records = _read(brain, tree_id)
    if show_table:
        console.print(task_table(tree_rec, records, link.running(records)))
    link.close()
    if tree_rec.status is TreeStatus.RUNNING:
        return None
    return tree_rec.status
