"""The Python API (layer: brain, public; re-exported as ``vancetope``): submit task trees from
a program and follow them, as `vancetope run` does from a shell.

    import vancetope

    with vancetope.connect() as vt:            # the stack of `vancetope up`, or VANCETOPE_REDIS_URL
        run = vt.submit("examples/night-batch.yaml")
        report = run.wait(timeout=300)         # a TreeReport; raises vancetope.TimedOut
        print(report.status, report.counts, report.result("headline"))

A tree is a file path, a mapping (the file's content as data) or a ``TaskTree``; it is
validated against the running brain's registry before anything is recorded, and an invalid
one raises ``InvalidTaskTree`` listing every problem, as the CLI prints them. A tree over
``max_tree_bytes`` or ``max_tasks_per_tree``, or over the user's
``max_unfinished_tasks_per_user``, raises ``TreeRefused`` naming the setting.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Self

import redis
from pydantic import BaseModel, ConfigDict

from brain.config import Settings, load_settings
from brain.core.limits import check_tree_data
from brain.core.models import SessionKind, TaskRecord, TaskTree, TreeRecord, TreeStatus
from brain.core.report import tree_report
from brain.core.submission import SubmitRequest
from brain.core.treefile import load_tree, tree_from_data
from brain.errors import BrainError, StackNotRunning, TreeNotFound
from brain.runtime import operations
from brain.runtime.service import Brain
from brain.stack.embedded import EmbeddedStack, running_stack_url, without_agent
from workers.contracts import channel_tree_events, client_queue

log = logging.getLogger("vancetope.api")

TreeInput = str | os.PathLike[str] | Mapping[str, Any] | TaskTree
# Between two reads of the store while waiting without a Redis wake-up.
POLL_S = 0.5


class TimedOut(BrainError):
    """``TreeRun.wait`` ran out of time; the tree goes on. ``report`` is how it stood."""

    def __init__(self, report: TreeReport, timeout: float) -> None:
        self.report = report
        super().__init__(
            f"tree {report.tree.tree_id!r} still {report.status.value} after {timeout:g}s "
            f"({_counts_text(report.counts)}); it goes on: wait again or `vancetope status {report.tree.tree_id}`"
        )


class TreeReport(BaseModel):
    """A tree's record and every task's record, as the store holds them."""

    model_config = ConfigDict(frozen=True)

    tree: TreeRecord
    tasks: list[TaskRecord]

    @property
    def tree_id(self) -> str:
        return self.tree.tree_id

    @property
    def status(self) -> TreeStatus:
        return self.tree.status

    @property
    def done(self) -> bool:
        """Every task ended ``done`` (what `vancetope run` exits 0 for)."""
        return self.tree.status is TreeStatus.DONE

    @property
    def counts(self) -> dict[str, int]:
        return dict(Counter(t.state.value for t in self.tasks))

    def task(self, task_id: str) -> TaskRecord:
        for record in self.tasks:
            if record.task_id == task_id:
                return record
        known = ", ".join(t.task_id for t in self.tasks)
        raise KeyError(f"tree {self.tree_id!r} has no task {task_id!r}; its tasks: {known}")

    def result(self, task_id: str) -> Any:
        """The task's result value (None until it is done)."""
        return self.task(task_id).result

    def as_json(self) -> dict[str, Any]:
        """The same object as `vancetope status ID --json` prints."""
        return tree_report(self.tree, self.tasks)


class TreeRun:
    """One submitted tree: follow it, wait for it, cancel it."""

    def __init__(self, client: Vancetope, tree_id: str) -> None:
        self._client = client
        self.tree_id = tree_id

    def __repr__(self) -> str:
        return f"TreeRun({self.tree_id!r})"

    def status(self) -> TreeReport:
        """How the tree stands now (reads the store, the record)."""
        return self._client._report(self.tree_id)

    def wait(self, timeout: float | None = None) -> TreeReport:
        """Block until the tree ends and return its report; raise ``TimedOut`` after ``timeout``
        seconds (the tree goes on). Woken by the brain's per-tree events; a Redis outage only
        slows it down, since the store is read on every round."""
        deadline = None if timeout is None else time.monotonic() + timeout
        pubsub = self._client._subscribe(self.tree_id)
        try:
            while True:
                report = self.status()
                if report.status is not TreeStatus.RUNNING:
                    return report
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimedOut(report, timeout or 0.0)
                pause = POLL_S if left is None else min(POLL_S, left)
                pubsub = self._client._wait_event(pubsub, self.tree_id, pause)
        finally:
            if pubsub is not None:
                self._client._close_pubsub(pubsub)

    def cancel(self, task_id: str | None = None) -> list[str]:
        """Cancel the tree's unfinished tasks (or only ``task_id``); returns the ids cancelled."""
        return self._client._cancel(self.tree_id, task_id)


class Vancetope:
    """A connection to a running stack. Thread use: one per thread (it holds a store connection)."""

    def __init__(self, brain: Brain, stack: EmbeddedStack | None = None) -> None:
        self.brain = brain
        self._stack = stack

    # --- opening ----------------------------------------------------------------------
    @classmethod
    def connect(cls, settings: Settings | None = None, *, redis_url: str | None = None) -> Self:
        """Connect to a running stack: ``redis_url``, else the settings' ``redis_url``
        (VANCETOPE_REDIS_URL), else the `vancetope up` stack of the settings' data dir.
        Raises ``StackNotRunning`` when none answers."""
        settings = settings or load_settings()
        url = redis_url or settings.redis_url or running_stack_url(settings)
        if not url:
            raise StackNotRunning(
                f"no stack is running for data dir {settings.data_dir}: start one with `vancetope up`, "
                "set VANCETOPE_REDIS_URL, or use vancetope.embedded()"
            )
        return cls(Brain.connect(settings, url))

    @classmethod
    def embedded(cls, settings: Settings | None = None, *, agent: bool = True) -> Self:
        """Start the embedded stack (as `vancetope run` does without `up`) for this object's
        life; ``close()`` stops it."""
        settings = settings or load_settings()
        stack = EmbeddedStack(settings, only=None if agent else without_agent(settings))
        stack.start()
        try:
            return cls(Brain.connect(settings, stack.redis_url), stack)
        except BaseException:
            stack.stop()
            raise

    def close(self) -> None:
        try:
            self.brain.close()
        finally:
            if self._stack is not None:
                self._stack.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- submitting -------------------------------------------------------------------
    def submit(
        self,
        tree: TreeInput,
        *,
        user: str | None = None,
        client_id: str | None = None,
        interactive: bool | None = None,
        tree_id: str | None = None,
    ) -> TreeRun:
        """Validate and submit ``tree``; returns at once with a handle.

        Sessions as in `vancetope run`: bound to ``client_id``, the tree's client tasks run on
        that client only (parked while it is offline; its enrolled user is the default
        ``user``), interactive unless ``interactive=False``; else autonomous for ``user``
        (default: the settings' user), on any connected client of that user. An invalid tree
        (every problem named, unknown tools with a "did you mean") raises ``InvalidTaskTree``.
        ``tree_id`` names the run (default: ``<tree id>-<time>-<random>``); a known one is a
        ``StoreError``.
        """
        scheduler = self.brain.scheduler
        parsed = self._parse(tree)
        bound_user = None  # bound to a client: as its enrolled user (its work runs on it only)
        if client_id is not None:
            client_queue(client_id)  # a malformed id is a ValueError naming it
            enrollment = scheduler.presence.enrollment(client_id)
            if enrollment is None:
                raise BrainError(
                    f"client {client_id!r} is not enrolled, so no session can be bound to it; "
                    f"`vancetope clients enroll {client_id} --user U` enrolls it"
                )
            bound_user = enrollment.user
        session = (
            SessionKind.INTERACTIVE
            if (interactive or (interactive is None and client_id))
            else SessionKind.AUTONOMOUS
        )
        request = SubmitRequest(
            tree=parsed,
            source=_source(tree),
            tree_id=tree_id,
            session=session,
            client_id=client_id,
            user=user or bound_user or self.brain.settings.user,
        )
        accepted = scheduler.accept(request)
        for warning in accepted.warnings:
            log.warning("%s", warning)
        return TreeRun(self, accepted.record.tree_id)

    def run(self, tree: TreeInput, *, timeout: float | None = None, **submit: Any) -> TreeReport:
        """Submit ``tree`` and wait for its end (``submit``'s keywords apply)."""
        return self.submit(tree, **submit).wait(timeout)

    def tree(self, tree_id: str) -> TreeRun:
        """A handle on a tree submitted earlier (by anyone); ``TreeNotFound`` if there is none."""
        if self.brain.store.get_tree(tree_id) is None:
            raise TreeNotFound(tree_id)
        return TreeRun(self, tree_id)

    def trees(self, limit: int = 20) -> list[TreeRecord]:
        """The most recent trees, newest first."""
        return self.brain.store.list_trees(limit=limit)

    # --- what TreeRun uses ------------------------------------------------------------
    def _parse(self, tree: TreeInput) -> TaskTree:
        if isinstance(tree, TaskTree):
            return tree
        if isinstance(tree, Mapping):
            check_tree_data(tree, self.brain.settings, source="<tree given as data>")
            return tree_from_data(tree, source="<tree given as data>")
        if isinstance(tree, (str, os.PathLike)):
            return load_tree(Path(tree), max_bytes=self.brain.settings.max_tree_bytes)
        raise TypeError(f"a tree is a file path, a mapping or a TaskTree, not {type(tree).__name__}")

    def _report(self, tree_id: str) -> TreeReport:
        record = self.brain.store.get_tree(tree_id)
        if record is None:
            raise TreeNotFound(tree_id)
        return TreeReport(tree=record, tasks=self.brain.store.get_tasks(tree_id))

    def _subscribe(self, tree_id: str) -> Any:
        try:
            pubsub = self.brain.hot.r.pubsub(ignore_subscribe_messages=True)
            pubsub.subscribe(channel_tree_events(tree_id))
            return pubsub
        except redis.RedisError as exc:
            log.info("waiting without Redis wake-ups (%s); reading the store every %gs", exc, POLL_S)
            return None

    def _wait_event(self, pubsub: Any, tree_id: str, pause: float) -> Any:
        """Sleep until the tree's next event or ``pause``; returns the pubsub to use next."""
        if pubsub is None:
            time.sleep(pause)
            return self._subscribe(tree_id)
        try:
            pubsub.get_message(timeout=pause)
            return pubsub
        except redis.RedisError:
            self._close_pubsub(pubsub)
            time.sleep(pause)
            return None

    @staticmethod
    def _close_pubsub(pubsub: Any) -> None:
        try:
            pubsub.close()
        except redis.RedisError:
            pass

    def _cancel(self, tree_id: str, task_id: str | None) -> list[str]:
        return operations.cancel(self.brain, tree_id, task_id)


def connect(settings: Settings | None = None, *, redis_url: str | None = None) -> Vancetope:
    """``Vancetope.connect``: a client of the running stack."""
    return Vancetope.connect(settings, redis_url=redis_url)


def embedded(settings: Settings | None = None, *, agent: bool = True) -> Vancetope:
    """``Vancetope.embedded``: start the embedded stack for the client's life."""
    return Vancetope.embedded(settings, agent=agent)


def _source(tree: TreeInput) -> str:
    return str(tree) if isinstance(tree, (str, os.PathLike)) else "<tree given as data>"


def _counts_text(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{n} {state}" for state, n in sorted(counts.items())) or "no tasks"


__all__ = ["TimedOut", "TreeReport", "TreeRun", "Vancetope", "connect", "embedded"]
