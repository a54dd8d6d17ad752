"""Advance task trees (layer: brain/runtime; glue around pure decisions).

Each task is its own Celery job (docs/architecture.md). The store is the record:
every state change is a compare-and-set on (state, run_id), so a redelivered job,
a late result or two brains advancing the same tree never complete a task or
dispatch a dependent twice. Decisions come from ``transitions.plan`` and
``routing.decide_route``; this module only applies them. What happens when clients
come and go lives in ``brain.runtime.clientwork``; results, progress and approvals
coming back enter through ``brain.runtime.intake``.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

from brain.config import Settings
from brain.core.fairshare import (
    DEFAULT_PRIORITY,
    applied_limits,
    call_origin,
    call_priority,
    highest_first,
    lane_id,
    queue_priority,
    user_limit,
)
from brain.core.fanout import (
    FanOutError,
    ItemIds,
    gathered,
    item_records,
    item_specs,
    items_of,
    parent_of,
)
from brain.core.limits import check_limits
from brain.core.models import (
    Location,
    RunIf,
    SessionKind,
    TaskRecord,
    TaskSpec,
    TaskState,
    TaskTree,
    ToolSpec,
    TreeRecord,
    TreeStatus,
)
from brain.core.pools import pool_route
from brain.core.retry import Attempt, effective_policy, next_attempt_at
from brain.core.routing import (
    Presence,
    Route,
    RouteKind,
    RouteRequest,
    client_tools,
    decide_route,
    reachable_client_ids,
    route_without_presence,
)
from brain.core.sessions import ClientSession, announced_schemas, held_names
from brain.core.snapshot import RegistrySnapshot
from brain.core.submission import Accepted, SubmitRequest, check_submission
from brain.core.transitions import (
    FAN_OUT_WAIT,
    FINAL,
    NOT_DONE,
    NOT_FINAL,
    RETRY_WAIT,
    REVOKED_IF_ENDED,
    SUCCESSFUL,
    Verdict,
    check_move,
    may_be_running,
    plan,
    verdict,
)
from brain.core.treefile import spec_from_descriptor
from brain.core.validation import UnresolvedReference, resolve_args
from brain.hot.gate import Lane
from brain.hot.parked import ParkedRef, ParkedWork, owner_of
from brain.hot.presence import PresenceBook
from brain.hot.retries import RetryTimers
from brain.hot.state import ClientKeyUnreadable, HotState
from brain.runtime.dispatch import Publisher
from brain.runtime.events import ClientEvents
from brain.runtime.revoked import RevokedEvents
from brain.store import Ended, Store
from workers.contracts import (
    MAX_WIRE_ID_CHARS,
    ErrorInfo,
    ToolCall,
    ToolType,
)
from workers.toolnames import name_on_server, qualified

log = logging.getLogger("vancetope.brain")

TREE_CACHE = 256
# Ready tasks dispatched per store batch: big enough to amortise a commit and a pipeline,
# small enough that workers start on the first chunk while the next is written.
DISPATCH_CHUNK = 200
# The reason a cancelled task records unless its canceller gives another (`vancetope run`
# stopped by Ctrl-C records that instead).
CANCELLED_BY_USER = "cancelled by user"
# Dependencies asked about per lookup when a result may have made a task ready.
_DEPENDENCY_PROBE = 32


def new_run_id(tree_id: str, task_id: str, attempt: int, token: str | None = None) -> str:
    """``<tree_id>.<task_id>.<attempt>.<12 hex>``, the readable part cut short when the whole
    would not fit the wire (ToolCall.run_id); the attempt and the random token stay whole."""
    tail = f".{attempt}.{token or uuid.uuid4().hex[:12]}"
    return f"{tree_id}.{task_id}"[: MAX_WIRE_ID_CHARS - len(tail)] + tail


def new_tree_id(tree: TaskTree) -> str:
    """A run's tree id: ``<tree.id>-<YYYYmmdd-HHMMSS>-<6 hex>`` (RUN_TREE_ID_SUFFIX_CHARS)."""
    return f"{tree.id}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


def client_route(client_id: str) -> str:
    """The route summary recorded for a task sent to a client; results must come from it."""
    return f"client:{client_id}"


def first_queued(rec: TaskRecord, spec: TaskSpec, at: float) -> dict[str, Any]:
    """A move's ``first_queued_at`` (when the task first left ``pending``, kept by every later
    move: a retry, a requeue) and, for a task with a ``max_total_s``, the ``expires_at`` it
    makes of it, through which the expiry sweep finds it (``Store.tasks_expired``). A task
    without one writes no deadline: nothing more on the common dispatch."""
    first = rec.first_queued_at or at
    if not spec.max_total_s:
        return {"first_queued_at": first}
    return {"first_queued_at": first, "expires_at": first + spec.max_total_s}


class Scheduler:
    def __init__(
        self,
        store: Store,
        hot: HotState,
        publisher: Publisher,
        registry: RegistrySnapshot,
        settings: Settings,
        *,
        presence: PresenceBook,
        parked: ParkedWork,
        events: ClientEvents | None = None,
        revoked: RevokedEvents | None = None,
        retries: RetryTimers | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """Every collaborator is handed in (``brain.runtime.service.Brain.connect`` wires the
        real ones), so a test can run the scheduler on a store and nothing else."""
        self.store = store
        self.hot = hot
        self.publisher = publisher
        self.registry = registry
        self.settings = settings
        self.clock = clock
        self.presence = presence
        self.parked = parked
        self.events = events  # Flower's view of client agents, when wired
        self.revoked = revoked  # Flower told of calls ended before a worker began them, when wired
        self._retries = retries
        self._trees: dict[str, TreeRecord] = {}
        # Tasks this process saw done, per running tree. Done is final, so the set is never
        # stale, only incomplete (another brain recorded the rest): a miss asks the store.
        self._done: dict[str, set[str]] = {}
        self._local = threading.local()

    @property
    def retries(self) -> RetryTimers:
        """When each task waiting to retry goes again (made on first use: a scheduler that
        never records a failure to retry needs no Redis for it)."""
        if self._retries is None:
            self._retries = RetryTimers(self.hot.r)
        return self._retries

    # --- submit ------------------------------------------------------------------
    def accept(self, request: SubmitRequest) -> Accepted:
        """The one way in: check ``request``'s tree against the registry in use and the clients
        this run may use (InvalidTaskTree naming every problem, an unknown tool with "did you
        mean"), then ``submit`` it (TreeRefused over a limit)."""
        user = request.user
        if request.client_id and not user:
            enrollment = self.presence.enrollment(request.client_id)
            user = enrollment.user if enrollment else None
        sessions = self.presence.sessions_for(user, request.client_id)
        view = self.presence.view(
            user=user, session_client=request.client_id, sessions=sessions, registry=self.registry.tools
        )
        # Names the user's other clients announce are only suggestions ("did you mean").
        elsewhere = frozenset(n for c in view.clients if user and c.user == user for n in c.tools)
        reachable = reachable_client_ids(view)
        warnings = check_submission(
            request.tree,
            self.registry,
            source=request.source,
            tree_id=request.tree_id,
            announced=client_tools(view) | held_names(sessions, reachable),
            elsewhere=elsewhere,
            announced_schemas=announced_schemas(
                (sessions[c] for c in sorted(reachable) if c in sessions), self.registry.tools
            ),
        )
        record = self.submit(
            request.tree,
            tree_id=request.tree_id,
            session=request.session,
            client_id=request.client_id,
            user=user,
            schedule=request.schedule,
            gateway_call=request.gateway_call,
        )
        return Accepted(record=record, warnings=warnings)

    def submit(
        self,
        tree: TaskTree,
        *,
        tree_id: str | None = None,
        session: SessionKind = SessionKind.AUTONOMOUS,
        client_id: str | None = None,
        user: str | None = None,
        schedule: str | None = None,
        gateway_call: bool = False,
    ) -> TreeRecord:
        """Record the tree and its tasks, then dispatch what is ready. ``tree_id`` names this run;
        ``schedule`` the `[[schedules]]` entry that started it; ``gateway_call`` marks one
        gateway tools/call (a one-task tree an MCP client waits for)."""
        now = self.clock()
        if client_id and not user:
            enrollment = self.presence.enrollment(client_id)
            user = enrollment.user if enrollment else None
        # Every way in ends here: the tree's size and the user's quota, before anything is written.
        check_limits(
            tree,
            self.settings,
            source=f"tree {tree.id!r}",
            user=user,
            unfinished=self.store.count_unfinished(user, NOT_FINAL),
        )
        run_tree_id = tree_id or new_tree_id(tree)
        record = TreeRecord(
            tree_id=run_tree_id,
            tree=tree,
            session=session,
            client_id=client_id,
            user=user,
            submitted_at=now,
            schedule=schedule,
            gateway_call=gateway_call and len(tree.tasks) == 1,
        )
        tasks = [
            TaskRecord(tree_id=run_tree_id, task_id=t.id, tool=t.tool, updated_at=now) for t in tree.tasks
        ]
        # A small tree's record and the dispatch of its first tasks are one store transaction
        # (its calls go out once both are written); a big tree's chunks go out as each is.
        with self.batch() if len(tasks) <= DISPATCH_CHUNK else nullcontext():
            self.store.put_tree(record, tasks)
            self._cache_tree(record)  # the record just written: no read and parse of it back
            # No wake-up: nobody can be watching a tree before submit has returned its id.
            self.advance(run_tree_id, wake=False)
        return record

    # --- advance -------------------------------------------------------------------
    def advance(
        self, tree_id: str, ended: Mapping[str, TaskState] | None = None, *, wake: bool = True
    ) -> TreeStatus | None:
        """Skip what cannot run, dispatch what is ready, finish the tree when all is final.

        ``ended``: tasks that just reached these final states. Only their dependents can
        change, so only those are looked at, and a result costs O(its dependents) whatever
        the tree's size. Without it (submit, sweeps) the whole tree is planned from its states
        and, with ``wake``, its live views are woken (after a result ``Intake.on_result`` wakes them).
        A finished tree always wakes them.
        """
        tree_rec = self.tree(tree_id)
        if tree_rec is None or tree_rec.status is not TreeStatus.RUNNING:
            return tree_rec.status if tree_rec else None
        if ended is None:
            unfinished = self._advance_all(tree_rec)
        else:
            unfinished = self._advance_after(tree_rec, ended)
        # A task just sent or parked, or seen in flight, is not final, so the tree goes on: no
        # need to ask. (Its result may be recorded elsewhere at once; whoever records the
        # last one asks.)
        status = None if unfinished else self._tree_status(tree_id)
        if status is not None and self.store.finish_tree(tree_id, status, self.clock()):
            self._trees.pop(tree_id, None)
            self._done.pop(tree_id, None)
            # Its running marks go and its watchers wake in one round trip, once it is written;
            # the log line after that (formatting it cost more than the round trip).
            self.after_write(lambda: self.hot.tree_finished(tree_id))
            self.after_write(lambda: log.info("tree %s finished: %s", tree_id, status.value))
        elif ended is None and wake:
            self.after_write(lambda: self.hot.notify(tree_id))
        return status

    def retry_due(self, tree_id: str, task_id: str) -> bool:
        """Start the next attempt of a task waiting to retry: routed again (its server, or its
        client; parked as its offline strategy says when that client is gone), as a new run.
        False when it no longer waits (cancelled, expired, or started by another brain)."""
        rec = self.store.get_task(tree_id, task_id)
        tree_rec = self.tree(tree_id)
        if rec is None or rec.state is not TaskState.RETRYING or tree_rec is None:
            return False
        ended = self._ended_here()
        with self.batch():
            try:
                started = self.start(tree_rec, rec, self._presence(tree_rec), RETRY_WAIT)
            finally:
                self._local.sessions = None
        if started and self._ended_here() != ended:
            self.advance(tree_id)  # failed or skipped by its new route: its dependents follow
        return started

    def retry_later(
        self,
        tree_rec: TreeRecord,
        rec: TaskRecord,
        error: ErrorInfo | None,
        from_states: Collection[TaskState],
        *,
        started_at: float | None,
        finished_at: float | None,
        worker: str | None = None,
    ) -> float | None:
        """Record the failed attempt of ``rec``'s current run as ``retrying`` when its retry
        policy covers ``error`` (brain.core.retry), and set its timer: when its next attempt
        starts, or None when it was not recorded (not covered, attempts used up, no time left
        in its ``max_total_s``, or the run moved on: a compare-and-set on the run and on where
        it was sent). Whatever ended the attempt asks here, so a failed result and a client
        call given up as poison at its take-back, or lost too often, are retried alike. The next
        attempt counts its own take-backs and re-sends (``taken_back`` and ``resent`` start
        again), as a server run counts its own deliveries: the bound is per attempt, and the
        attempts are bounded by the policy."""
        spec = self.spec_of(tree_rec, rec)
        tool = self.registry.tools.get(rec.tool)
        policy = effective_policy(
            spec.retry, tool.retry if tool else None, tree_rec.tree.retry, self.settings.retry
        )
        failures = len(rec.attempts) + 1
        now = self.clock()
        deadline = (
            rec.first_queued_at + spec.max_total_s if rec.first_queued_at and spec.max_total_s else None
        )
        at = next_attempt_at(policy, error, failures, now, deadline=deadline)
        if at is None:
            return None
        attempt = Attempt(
            number=failures,
            run_id=rec.run_id,
            route=rec.route,
            error=error,
            started_at=started_at,
            finished_at=finished_at,
            next_at=at,
        )
        kind = error.type if error else "failed"
        moved = self.move(
            rec.tree_id,
            rec.task_id,
            TaskState.RETRYING,
            from_states,
            expect_run_id=rec.run_id,
            expect_client_id=rec.client_id,
            error=error,
            reason=f"attempt {failures} of {policy.max_attempts} failed ({kind}); "
            f"next attempt at {time.strftime('%H:%M:%S', time.localtime(at))}",
            attempts=[*rec.attempts, attempt],
            retry_at=at,
            progress=None,
            taken_back=0,
            resent=0,
            worker=rec.worker if worker is None else worker,
            started_at=started_at,
            finished_at=finished_at,
            updated_at=now,
        )
        if moved is None:
            return None
        log.info(
            "task %s of tree %s: attempt %d failed (%s); next attempt in %.1fs",
            rec.task_id,
            rec.tree_id,
            failures,
            kind,
            at - now,
        )
        self.after_write(lambda: self.retries.set(rec.tree_id, rec.task_id, at))
        return at

    def _advance_all(self, tree_rec: TreeRecord) -> int:
        """Plan the whole tree and act on it; how many tasks it sent or parked."""
        tree_id = tree_rec.tree_id
        placed = 0
        while True:
            states = self.store.task_states(tree_id)
            step = plan(tree_rec.tree, states)
            ended = self._ended_here()
            for task_id, state, why in step.end:
                self._end(tree_id, task_id, state, why, {TaskState.PENDING})
            # Items of a for_each task are not in the tree's spec: a crash may have left some
            # unsent, or all ended with their for_each task still waiting for them.
            items = [t for t, state in states.items() if state is TaskState.PENDING and parent_of(t)]
            for task_id, state in states.items():
                if state is TaskState.FANNED_OUT and self._finish_fan_out(tree_id, task_id) is not None:
                    self._local.ended = self._ended_here() + 1
            placed += self._start_ready(tree_rec, step.ready + items)
            # Plan again only when a task ended without running (skipped, failed by its route
            # or its arguments): its dependents may now be skipped too. Tasks sent or parked
            # change nothing another plan would see; for a big tree that re-read is its size.
            if self._ended_here() == ended:
                return placed

    def _advance_after(self, tree_rec: TreeRecord, ended: Mapping[str, TaskState]) -> int:
        """A task that ended unsuccessfully skips its pending dependents (and theirs); one that
        is done makes ready each dependent whose other dependencies are done too. A dependent
        with another dependency that failed was skipped when that one ended (or the idle-tree
        sweep's full plan skips it). How many tasks it knows to be unfinished: those it sent or
        parked, plus one if a dependency it waits on is still in flight."""
        tree_id, tree = tree_rec.tree_id, tree_rec.tree
        done = self._done.setdefault(tree_id, set())
        work = list(ended.items())
        ready: list[str] = []
        in_flight = 0
        while work:
            task_id, state = work.pop()
            if state is TaskState.DONE:
                done.add(task_id)
            parent = parent_of(task_id)
            if parent is not None:
                # An item: its for_each task ends with the last of them, then its dependents go on.
                # Not counted in flight while its siblings run: the tree's status is asked, so a
                # tree whose for_each task ended early (cancelled, expired) still finishes.
                ended_as = self._finish_fan_out(tree_id, parent) if state.is_final else None
                if ended_as is not None:
                    work.append((parent, ended_as))
                continue
            for dependent in tree.dependents.get(task_id, ()):
                spec = tree.task(dependent)
                if spec.run_if is not RunIf.ALL_SUCCEEDED or state is TaskState.NOT_TRIGGERED:
                    found = self._verdict_after(tree_id, spec, task_id, state, done)
                    if found.ready:
                        ready.append(dependent)
                    elif found.end is not None:
                        if self._end(tree_id, dependent, found.end, found.why, {TaskState.PENDING}):
                            work.append((dependent, found.end))
                    else:
                        in_flight = 1
                    continue
                if state is not TaskState.DONE:
                    why = f"upstream task {task_id!r} {state.value}"
                    if self._end(tree_id, dependent, TaskState.SKIPPED, why, {TaskState.PENDING}):
                        work.append((dependent, TaskState.SKIPPED))
                    continue
                waiting_on = self._not_done(tree_id, spec.depends_on, done)
                if waiting_on is None:
                    ready.append(dependent)
                elif not waiting_on[1].is_final:
                    in_flight = 1  # the tree goes on: no "is anything unfinished?" lookup
        return self._start_ready(tree_rec, ready) + in_flight

    def _verdict_after(
        self, tree_id: str, spec: TaskSpec, task_id: str, state: TaskState, done: set[str]
    ) -> Verdict:
        """``spec``'s verdict now that its dependency ``task_id`` ended ``state``, for a task with
        a trigger rule (or one whose dependency was not triggered). The records of all its
        dependencies are read once, when the last of them has ended, not after each one: a
        fan-in of 1,000 under ``all_done`` costs O(1,000) reads, not O(1,000²)."""
        if spec.run_if is RunIf.ALL_SUCCEEDED or (
            spec.run_if is RunIf.NONE_FAILED and state in (TaskState.FAILED, TaskState.EXPIRED)
        ):
            return verdict(spec, {**dict.fromkeys(spec.depends_on, TaskState.DONE), task_id: state})
        if self._not_final(tree_id, spec.depends_on, done):
            return Verdict()
        states = {r.task_id: r.state for r in self.store.get_tasks(tree_id, spec.depends_on)}
        return verdict(spec, states)

    def _not_done(
        self, tree_id: str, task_ids: Sequence[str], done: set[str]
    ) -> tuple[str, TaskState] | None:
        """One of ``task_ids`` that is not done yet, with its state, or None (``done``: seen
        done here)."""
        return self._first_in(tree_id, task_ids, done, NOT_DONE)

    def _not_final(self, tree_id: str, task_ids: Sequence[str], done: set[str]) -> bool:
        """Whether one of ``task_ids`` is not final yet (``done``: seen done here)."""
        return self._first_in(tree_id, task_ids, done, NOT_FINAL) is not None

    def _first_in(
        self, tree_id: str, task_ids: Sequence[str], done: set[str], states: Collection[TaskState]
    ) -> tuple[str, TaskState] | None:
        """One of ``task_ids`` (none of ``done``) in ``states``, with its state, or None. The
        last listed first, a few at a time: in a fan-in the dependencies still running are the
        last sent, so the answer is usually in one small lookup, not in one naming all the
        others (each of 1,000 members asked about 999)."""
        probe: list[str] = []
        for task_id in reversed(task_ids):
            if task_id in done:
                continue
            probe.append(task_id)
            if len(probe) == _DEPENDENCY_PROBE:
                found = self.store.first_task_in(tree_id, states, among=probe)
                if found is not None:
                    return found
                probe = []
        return self.store.first_task_in(tree_id, states, among=probe) if probe else None

    def _start_ready(self, tree_rec: TreeRecord, ready: list[str]) -> int:
        """Route and send (or park) ready tasks, in chunks: each chunk's compare-and-sets are
        one store batch, and its messages go out once that batch is written. How many were
        sent or parked (not ended without running, not moved on meanwhile)."""
        try:
            return self._route_and_send(tree_rec, ready)
        finally:
            self._local.sessions = None

    def _route_and_send(self, tree_rec: TreeRecord, ready: list[str]) -> int:
        placed = 0
        presence: Presence | None = None  # read once, and only for a route that needs it
        items: list[str] = []  # made by for_each tasks: sent after the chunk that made them
        ready = highest_first(ready, lambda task_id: self._priority(tree_rec, task_id))
        for start in range(0, len(ready), DISPATCH_CHUNK):
            chunk = ready[start : start + DISPATCH_CHUNK]
            with self.batch():
                # In the chunk's order (highest priority first), not the store's.
                found = {rec.task_id: rec for rec in self.store.get_tasks(tree_rec.tree_id, chunk)}
                for rec in (found[task_id] for task_id in chunk if task_id in found):
                    if rec.state is not TaskState.PENDING:
                        continue
                    spec = self.spec_of(tree_rec, rec)
                    if spec.for_each is not None:
                        items += self._fan_out(tree_rec, rec, spec)
                        continue
                    req = self.route_request(tree_rec, spec)
                    route = route_without_presence(req, self.registry.tools)
                    if route is None:
                        presence = presence or self._presence(tree_rec)
                        route = decide_route(req, self.registry.tools, presence)
                    ended = self._ended_here()
                    if self.act(tree_rec, rec, route, {TaskState.PENDING}):
                        placed += self._ended_here() == ended
                        if route.kind is RouteKind.CLIENT and route.client_id is not None and presence:
                            # One view serves the whole loop: count what it sends, so ready tasks
                            # spread over the user's clients instead of all taking the first.
                            presence = presence.with_call_sent_to(route.client_id)
        if items:
            placed += self._route_and_send(tree_rec, items)
        return placed

    def spec_of(self, tree_rec: TreeRecord, rec: TaskRecord) -> TaskSpec:
        """What ``rec`` runs: its tree's task, or for an item of a for_each task, its own spec."""
        return rec.spec or tree_rec.tree.task(rec.task_id)

    def _fan_out(self, tree_rec: TreeRecord, rec: TaskRecord, spec: TaskSpec) -> list[str]:
        """Make ``spec``'s items (brain.core.fanout) and wait for them: the ids to send. A list
        that is not one, too long, or whose items lack what the arguments ask fails the task."""
        tree_id = tree_rec.tree_id
        try:
            value = resolve_args({"list": spec.for_each}, *self.upstream(tree_id, spec.depends_on))["list"]
            specs = item_specs(spec, items_of(spec, value, spec.max_fan_out or self.settings.max_fan_out))
        except (UnresolvedReference, FanOutError) as exc:
            message = str(exc) if isinstance(exc, FanOutError) else f"task {spec.id!r}: for_each: {exc}"
            error = ErrorInfo(type="FanOutFailed", message=message, data={"task": spec.id})
            self.finish_without_run(rec, TaskState.FAILED, message, {TaskState.PENDING}, error=error)
            return []
        now = self.clock()
        # The items first: a crash after them leaves the task pending, and its next plan adds
        # the same items again (ids and specs are the list's), which the store keeps once.
        self.store.add_tasks(tree_id, item_records(tree_id, specs, spec.id, now))
        moved = self.move(
            tree_id,
            spec.id,
            TaskState.FANNED_OUT,
            {TaskState.PENDING},
            fan_out=len(specs),
            reason=f"for_each: {len(specs)} item(s), {spec.id}[0] to {spec.id}[{max(len(specs) - 1, 0)}]",
            route="for_each",
            queued_at=now,
            updated_at=now,
            **first_queued(rec, spec, now),
        )
        if moved is None:
            return []
        if not specs:
            ended = self._finish_fan_out(tree_id, spec.id)
            if ended is not None:
                self.advance(tree_id, {spec.id: ended})
        return [s.id for s in specs]

    def _finish_fan_out(self, tree_id: str, parent: str) -> TaskState | None:
        """End a for_each task whose items have all ended (brain.core.fanout.gathered): the
        state it ended in, or None while one has not (or it ended already)."""
        rec = self.store.get_task(tree_id, parent)
        if rec is None or rec.state is not TaskState.FANNED_OUT or rec.fan_out is None:
            return None
        ids = ItemIds(parent, rec.fan_out)
        if self._not_final(tree_id, ids, set()):
            return None
        every = list(ids)  # all final: read them all, once
        by_id = {r.task_id: r for r in self.store.get_tasks(tree_id, every)}
        state, results, why = gathered([by_id[i] for i in every])
        error = None
        if state is TaskState.FAILED:
            error = ErrorInfo(type="ItemsFailed", message=f"task {parent!r}: {why}", data={"task": parent})
        now = self.clock()
        moved = self.move(
            tree_id,
            parent,
            state,
            FAN_OUT_WAIT,
            result=results,
            error=error,
            reason=why,
            finished_at=now,
            updated_at=now,
        )
        return moved.state if moved is not None else None

    def _tree_status(self, tree_id: str) -> TreeStatus | None:
        """The tree's final status once every task is final (two index lookups), else None."""
        if self.store.first_task_in(tree_id, NOT_FINAL) is not None:
            return None
        return TreeStatus.FAILED if self.store.first_task_in(tree_id, FINAL - SUCCESSFUL) else TreeStatus.DONE

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Writes inside go to the store as one batch; the messages and parked refs that
        announce them go out only after it is written (a worker must never see a run id
        the store does not have yet). Nested batches join the outer one."""
        if getattr(self._local, "after", None) is not None:
            yield
            return
        after: list[Callable[[], None]] = []
        self._local.after = after
        try:
            with self.store.batch():
                yield
        finally:
            self._local.after = None
        self._flush(after)

    def after_write(self, action: Callable[[], None]) -> None:
        after = getattr(self._local, "after", None)
        if after is None:
            action()
        else:
            after.append(action)

    def _flush(self, actions: list[Callable[[], None]]) -> None:
        try:
            with self.publisher.batch():
                for action in actions:
                    action()
        except Exception:
            # The store already says queued: the reconciler re-sends what never left.
            log.exception("could not send %d message(s); the reconciler will re-send them", len(actions))

    def tree(self, tree_id: str) -> TreeRecord | None:
        """The tree's record; a running tree's is cached (its spec never changes, and a stale
        status is harmless: every write is a compare-and-set). Its tasks are validated as they
        are asked for (``TreeRecord.stored``): they were when it was submitted, and a process
        that records one result of a big tree uses that task's dependents only."""
        cached = self._trees.get(tree_id)
        if cached is not None:
            return cached
        rec = self.store.get_tree(tree_id, lazy=True)
        if rec is not None:
            self._cache_tree(rec)
        return rec

    def _cache_tree(self, rec: TreeRecord) -> None:
        if rec.status is not TreeStatus.RUNNING:
            return
        if len(self._trees) >= TREE_CACHE:
            evicted = next(iter(self._trees))
            self._trees.pop(evicted)
            self._done.pop(evicted, None)
        self._trees[rec.tree_id] = rec

    def _ended_here(self) -> int:
        """How many tasks this thread ended without running them so far (``_end``)."""
        return getattr(self._local, "ended", 0)

    @contextmanager
    def recording(self, recorded: TaskRecord) -> Iterator[None]:
        """While a result's tree advances: ``recorded`` is that result's record, which
        ``upstream`` takes instead of reading it back (a chain's next task takes just that)."""
        self._local.recorded = recorded
        try:
            yield
        finally:
            self._local.recorded = None

    def upstream(
        self, tree_id: str, task_ids: Iterable[str]
    ) -> tuple[dict[str, Any], dict[str, Any], dict[str, str], dict[str, Any]]:
        """Upstream results, whole MCP results, states and errors (``${tasks.<id>.result}``,
        ``.mcp``, ``.status``, ``.error``): one read, none for the result this thread is
        recording (a chain's next task takes just that)."""
        fresh: TaskRecord | None = getattr(self._local, "recorded", None)
        ids = list(task_ids)
        if fresh is not None and fresh.tree_id == tree_id and fresh.task_id in ids:
            ids.remove(fresh.task_id)
            records = [fresh, *(self.store.get_tasks(tree_id, ids) if ids else [])]
        else:
            records = self.store.get_tasks(tree_id, ids) if ids else []
        final = [r for r in records if r.state.is_final]
        return (
            {r.task_id: r.result for r in records},
            {r.task_id: r.mcp for r in records},
            {r.task_id: r.state.value for r in final},
            {r.task_id: r.error.model_dump(mode="json") if r.error else None for r in final},
        )

    def resolved_args(self, tree_id: str, spec: TaskSpec) -> dict[str, Any]:
        """``spec``'s arguments with its references resolved (UnresolvedReference if one cannot be)."""
        return resolve_args(spec.args, *self.upstream(tree_id, spec.depends_on))

    def _presence(self, tree_rec: TreeRecord) -> Presence:
        """The router's view; the sessions it was made of describe the client tools this
        thread sends until ``_start_ready`` ends (``tool_spec``), with no read of their own.
        A tree bound to a client routes to that client alone (brain.core.routing): its one
        session is read; another tree routes to its user's clients, read through the user's
        index (``PresenceBook.sessions_for``). Not every connected client's session, each with its
        tool list: with 1,000 connected, reading them all cost the brain ~5 ms per tree step."""
        if tree_rec.client_id is not None:
            own = self.presence.session(tree_rec.client_id)
            sessions = {own.client_id: own} if own is not None else {}
        else:
            sessions = self.presence.sessions_for(tree_rec.user)
        self._local.sessions = sessions
        return self.presence.view(
            user=tree_rec.user,
            session_client=tree_rec.client_id,
            sessions=sessions,
            registry=self.registry.tools,
        )

    def route(self, tree_rec: TreeRecord, spec: TaskSpec, presence: Presence) -> Route:
        return decide_route(self.route_request(tree_rec, spec), self.registry.tools, presence)

    def route_request(self, tree_rec: TreeRecord, spec: TaskSpec) -> RouteRequest:
        engine = self.registry.engines.get(tree_rec.tree.engine) if tree_rec.tree.engine else None
        return RouteRequest(
            tool=spec.tool,
            execution_target=spec.execution_target,
            session=tree_rec.session,
            engine=engine,
            pool=spec.pool,
            tree_pool=tree_rec.tree.pool,
            pools=frozenset(self.registry.pools),
        )

    def start(
        self,
        tree_rec: TreeRecord,
        rec: TaskRecord,
        presence: Presence,
        from_states: Collection[TaskState],
        parked_at: float | None = None,
    ) -> bool:
        """Route one task and act on the route. ``from_states`` guards the compare-and-set."""
        route = self.route(tree_rec, self.spec_of(tree_rec, rec), presence)
        return self.act(tree_rec, rec, route, from_states, parked_at)

    def act(
        self,
        tree_rec: TreeRecord,
        rec: TaskRecord,
        route: Route,
        from_states: Collection[TaskState],
        parked_at: float | None = None,
    ) -> bool:
        """Send, park, skip or fail one task as ``route`` says. False when the task moved on meanwhile."""
        spec = self.spec_of(tree_rec, rec)
        if route.kind in (RouteKind.SERVER, RouteKind.CLIENT):
            return self._dispatch(tree_rec, spec, rec, route, from_states)
        if route.kind is RouteKind.FAIL:
            hint = self.registry.failure_hint(spec.tool) if route.reason.startswith("Tool unknown") else ""
            error = ErrorInfo(
                type="RouteFailed",
                message=f"task {spec.id!r}: {route.reason}{hint}",
                data={"task": spec.id, "tool": spec.tool},
            )
            return self.finish_without_run(rec, TaskState.FAILED, route.reason, from_states, error=error)
        if route.kind is RouteKind.SKIP:
            return self.finish_without_run(rec, TaskState.SKIPPED, route.reason, from_states)
        state = TaskState.BLOCKED if route.kind is RouteKind.BLOCKED else TaskState.PENDING_CLIENT
        return self.park(tree_rec, rec, state, route.reason, from_states, parked_at)

    def park(
        self,
        tree_rec: TreeRecord,
        rec: TaskRecord,
        state: TaskState,
        reason: str,
        from_states: Collection[TaskState],
        parked_at: float | None = None,
    ) -> bool:
        """Record the task as waiting, then list it for its owner. The store is written first:
        a crash between the two leaves a parked task the reconciler lists again."""
        now = self.clock()
        parked_at = parked_at or now
        moved = self.move(
            rec.tree_id,
            rec.task_id,
            state,
            from_states,
            expect_run_id=rec.run_id,
            reason=reason,
            route=state.value,
            queued_at=parked_at,
            updated_at=now,
            **first_queued(rec, self.spec_of(tree_rec, rec), parked_at),
        )
        if moved is None:
            return False
        ref = ParkedRef(
            tree_id=rec.tree_id,
            task_id=rec.task_id,
            owner=owner_of(tree_rec.user, tree_rec.client_id),
            parked_at=parked_at,
        )
        self.after_write(lambda: self.parked.park(ref))
        return True

    def _dispatch(
        self,
        tree_rec: TreeRecord,
        spec: TaskSpec,
        rec: TaskRecord,
        route: Route,
        from_states: Collection[TaskState],
    ) -> bool:
        try:
            args = self.resolved_args(tree_rec.tree_id, spec)
        except UnresolvedReference as exc:
            error = ErrorInfo(
                type="UnresolvedReference", message=f"task {spec.id!r}: {exc}", data={"task": spec.id}
            )
            return self.finish_without_run(rec, TaskState.FAILED, str(exc), from_states, error=error)
        tool = self.tool_spec(route.tool, route.client_id)
        if tool is None:
            # Only a client announced this tool, and it left between routing and here.
            reason = (
                f"Queued for Client: {route.tool} (client {route.client_id} left while it was being sent)"
            )
            return self.park(tree_rec, rec, TaskState.PENDING_CLIENT, reason, from_states)
        attempt = rec.attempt + 1
        to_client = route.kind is RouteKind.CLIENT
        summary = client_route(route.client_id or "") if to_client else pool_route(route.pool)
        if route.fell_back_from is not None:
            summary += f" (fallback from {route.fell_back_from})"
        now = self.clock()
        moved = self.move(
            rec.tree_id,
            rec.task_id,
            TaskState.QUEUED_CLIENT if to_client else TaskState.QUEUED_SERVER,
            from_states,
            expect_run_id=rec.run_id,
            run_id=new_run_id(tree_rec.tree_id, spec.id, attempt),
            attempt=attempt,
            deliveries=0,
            route=summary,
            client_id=route.client_id if to_client else None,
            pool=None if to_client else route.pool,
            reason=route.reason,
            tool=route.tool,
            queued_at=now,
            updated_at=now,
            **first_queued(rec, spec, now),
            # A retry's new attempt: the last one's error stays in its attempts, not on the task.
            **({"retry_at": None, "error": None} if rec.state is TaskState.RETRYING else {}),
        )
        if moved is None:
            return False
        call = self.call(spec, moved, tool, args, route.client_id if to_client else None)
        self.after_write(lambda: self.publish(call, moved.pool))
        return True

    def tool_spec(self, tool: str, client_id: str | None) -> ToolSpec | None:
        """How to call ``tool``: its registry spec, or for a tool only a client announced,
        that client's announcement."""
        spec = self.registry.tools.get(tool)
        if client_id is None or (spec is not None and spec.location is not Location.SERVER):
            return spec
        # Sent to a client: its own announcement describes the tool, never a server-only
        # registry entry that happens to share the name (it would lend its schema). Routed
        # from a view, the sessions that view was made of say it (the same announcement).
        sessions: Mapping[str, ClientSession] | None = getattr(self._local, "sessions", None)
        session = sessions.get(client_id) if sessions is not None else self.presence.session(client_id)
        descriptor = session.tool(tool) if session else None
        return spec_from_descriptor(descriptor, Location.CLIENT) if descriptor else None

    def call(
        self, spec: TaskSpec, rec: TaskRecord, tool: ToolSpec, args: dict[str, Any], client_id: str | None
    ) -> ToolCall:
        return ToolCall(
            run_id=rec.run_id or "",
            tree_id=rec.tree_id,
            task_id=rec.task_id,
            tool=name_on_server(tool.name, tool.mcp_server) if tool.type is ToolType.MCP else tool.name,
            tool_type=tool.type,
            mcp_server=tool.mcp_server,
            args=args,
            timeout_s=spec.timeout_s or tool.timeout_s or self.settings.default_timeout_s,
            max_result_bytes=self.settings.max_result_bytes,
            max_deliveries=self.settings.max_deliveries,
            client_id=client_id,
            interactive=self._gateway_call(rec.tree_id),
        )

    def _gateway_call(self, tree_id: str) -> bool:
        tree_rec = self.tree(tree_id)
        return tree_rec is not None and tree_rec.gateway_call

    def publish_queued(self, tree_id: str, task_id: str, run_id: str, client_id: str) -> bool:
        """Send the call of a run another process recorded as queued for a client. The call is
        rebuilt from the store and the tree, and only if the store says this very run is
        queued for that client: a message naming anything else is stale (or forged)."""
        rec = self.store.get_task(tree_id, task_id)
        tree_rec = self.tree(tree_id)
        if (
            rec is None
            or tree_rec is None
            or rec.state is not TaskState.QUEUED_CLIENT
            or rec.run_id != run_id
            or rec.client_id != client_id
        ):
            log.warning(
                "not publishing run %s of task %s for client %s: the store does not have it queued for that client",
                run_id,
                task_id,
                client_id,
            )
            return False
        call = self.call_for(tree_rec, rec)
        if call is None:
            return False
        self.publish(call)
        return True

    def call_for(self, tree_rec: TreeRecord, rec: TaskRecord) -> ToolCall | None:
        """The message for ``rec``'s current run, rebuilt from the record and the tree (its
        arguments resolved again from the upstream results); None, with the task failed,
        when its tool is no longer known."""
        spec = self.spec_of(tree_rec, rec)
        tool = self.tool_spec(rec.tool, rec.client_id)
        if tool is None:
            self.finish_without_run(rec, TaskState.FAILED, f"Tool unknown: {rec.tool}", {rec.state})
            return None
        args = self.resolved_args(rec.tree_id, spec)
        return self.call(spec, rec, tool, args, rec.client_id)

    def lane(self, call: ToolCall, pool: str | None) -> Lane | None:
        """The gate lane of a server call bounded by limits, or of every server call with fair
        share on (``queue_window``); None (the fast path: straight to its pool's queue) for a
        client's call, or a call with no limit while fair share is off."""
        registry = self.registry
        if call.client_id is not None:
            return None
        gate = self.publisher.gate
        fair = self.settings.fairness
        # Servers paused by a 429 (read from Redis at most once a second, not once a call).
        paused = gate.paused() if gate is not None else frozenset()
        if not (fair.on or registry.limited or registry.server_limits or registry.pool_limits or paused):
            return None
        name = qualified(call.mcp_server, call.tool) if call.mcp_server else call.tool
        tool = registry.tools.get(name)
        if tool is None:
            return None
        origin = call_origin(call.args) if paused else None
        limits = applied_limits(tool, pool, registry.server_limits, registry.pool_limits, paused, origin)
        if not (limits or fair.on):
            return None
        tree_rec = self.tree(call.tree_id)
        user = tree_rec.user if tree_rec is not None else None
        if not fair.on or tree_rec is None:
            return Lane(lane_id(pool, user, limits), pool, user, limits)
        if fair.max_in_flight_per_user is not None:
            limits = (*limits, user_limit(pool, user, fair.max_in_flight_per_user))
        priority = self._priority(tree_rec, call.task_id)
        return Lane(
            lane_id(pool, user, limits, tree=call.tree_id, priority=priority),
            pool,
            user,
            limits,
            priority=priority,
            weight=fair.weight(user),
            window=fair.queue_window,
        )

    def _queue_priority(self, call: ToolCall) -> int:
        """``call``'s place in its pool's queue with fair share off (``queue_priority``)."""
        tree_rec = self.tree(call.tree_id)
        if tree_rec is None:
            return DEFAULT_PRIORITY
        task = self._task_priority(tree_rec, call.task_id)
        return queue_priority(task, tree_rec.tree.priority, tree_rec.session, tree_rec.gateway_call)

    def _priority(self, tree_rec: TreeRecord, task_id: str) -> int:
        """The priority of ``task_id``'s runs (an item of a for_each task has its task's)."""
        task = self._task_priority(tree_rec, task_id)
        return call_priority(task, tree_rec.tree.priority, tree_rec.session, tree_rec.gateway_call)

    @staticmethod
    def _task_priority(tree_rec: TreeRecord, task_id: str) -> int | None:
        """The priority ``task_id``'s spec writes, if any (an item of a for_each task's is its task's)."""
        try:
            return tree_rec.tree.task(parent_of(task_id) or task_id).priority
        except KeyError:
            return None

    def publish(self, call: ToolCall, pool: str | None = None) -> None:
        """Send ``call`` to its client's queue, or to ``pool``'s (None: the default pool's),
        through the gate when limits bound it."""
        try:
            lane = self.lane(call, pool)
            if lane is not None:
                self.publisher.send(call, pool, lane)
            elif call.client_id is None and not self.settings.fairness.on:
                # Straight to the pool's queue, where a person's call goes ahead of a batch
                # with fair share off. (On, the gate orders the calls, and its window counts
                # the queue's first list only.)
                self.publisher.send(call, pool, priority=self._queue_priority(call))
            else:
                self.publisher.send(call, pool)
        except Exception:
            log.exception(
                "could not publish task %s (run %s); the reconciler will re-send it",
                call.task_id,
                call.run_id,
            )
            return
        if self.events is not None:
            self.events.task_sent(call)

    def finish_without_run(
        self,
        rec: TaskRecord,
        state: TaskState,
        reason: str,
        from_states: Collection[TaskState],
        error: ErrorInfo | None = None,
    ) -> bool:
        return self._end(rec.tree_id, rec.task_id, state, reason, from_states, error)

    def cancel_tasks(
        self,
        tree_id: str,
        task_id: str | None = None,
        on_unreadable: Callable[[ClientKeyUnreadable], None] | None = None,
        reason: str = CANCELLED_BY_USER,
    ) -> list[str]:
        """Cancel a tree's unfinished tasks (or only ``task_id``): two store calls end them all
        ``skipped`` (``_skip``), one Redis call per client (and one for the server) adds their runs to the
        cancelled set workers check before starting, and a client's calls still in its queue
        are taken out of it (a workstation coming back or freeing up never pops them); then
        the tree is advanced once. A
        100,000-task tree is a few round trips, not 100,000 compare-and-sets. A client whose own
        cancelled set is broken goes to ``on_unreadable`` (raised without one) and stops no other
        client's marks; its tasks are cancelled in the store all the same. Flower is told the calls
        sent and not begun were revoked (``revoke_unrun``). The ids cancelled."""
        check_move(NOT_FINAL, TaskState.SKIPPED)
        now = self.clock()
        unrun, ended = self._skip(tree_id, task_id, reason, now)
        parent = self.store.get_task(tree_id, task_id) if task_id is not None and ended else None
        if parent is not None and parent.fan_out:
            # A for_each task cancelled alone takes its items with it: they are its calls. Two
            # statements for all of them (a chunk each), not two per item.
            items_unrun, items = self._skip(
                tree_id, None, reason, now, among=list(ItemIds(parent.task_id, parent.fan_out))
            )
            unrun += items_unrun
            ended += items
        runs: dict[str | None, list[str]] = {}
        for task in ended:
            if task.run_id:
                runs.setdefault(task.client_id, []).append(task.run_id)
        not_begun = {task.run_id for task in unrun}
        for client_id, run_ids in runs.items():
            try:
                # The runs a worker may have begun are stopped where they run, too.
                begun = [run for run in run_ids if may_be_running(client_id, ended_unrun=run in not_begun)]
                unqueued = self.hot.cancel_runs(
                    run_ids, client_id, stop=begun, kept_s=self.settings.cancelled_kept_s
                )
            except ClientKeyUnreadable as exc:
                if on_unreadable is None:
                    raise
                on_unreadable(exc)
                continue
            if unqueued:
                log.info(
                    "tree %s: took %d cancelled call(s) out of client %s's queue",
                    tree_id,
                    len(unqueued),
                    client_id,
                )
        # After the cancelled sets are written: a worker that pops one now never begins it.
        self.revoke_unrun(((task.run_id, task.client_id) for task in unrun), expired=False)
        self._drop_queued([task.run_id for task in unrun if task.client_id is None and task.run_id])
        if ended:
            self._local.ended = self._ended_here() + len(ended)
        self.advance(tree_id)
        return [task.task_id for task in ended]

    def _skip(
        self, tree_id: str, task_id: str | None, reason: str, now: float, among: list[str] | None = None
    ) -> tuple[list[Ended], list[Ended]]:
        """End the tree's unfinished tasks (or ``task_id``, or those of ``among``) ``skipped``:
        (those no worker will speak of again: sent and not begun, or waiting to retry; every one
        ended). Two statements, those first, so Flower can be told which to show revoked; one
        sent meanwhile is ended by the second, and only shown as sent."""
        unrun, rest = (
            self.store.end_tasks(
                tree_id,
                from_states=states,
                state=TaskState.SKIPPED,
                reason=reason,
                finished_at=now,
                task_id=task_id,
                among=among,
            )
            for states in (REVOKED_IF_ENDED, NOT_FINAL)
        )
        return unrun, unrun + rest

    def _drop_queued(self, run_ids: list[str]) -> None:
        """The server pools drop these cancelled runs' messages on receipt (``Publisher.drop_queued``).
        Only speed: each would be refused at its begin anyway, so a failure is logged."""
        if not run_ids:
            return
        try:
            self.publisher.drop_queued(run_ids)
        except Exception as exc:  # noqa: BLE001 - the begin check still refuses every one
            log.warning("could not ask the pools to drop %d cancelled call(s): %s", len(run_ids), exc)

    def revoke_unrun(self, runs: Iterable[tuple[str | None, str | None]], *, expired: bool) -> None:
        """Tell Flower the ``(run id, client id)`` runs were ended before a worker or agent
        began them, or while it showed their failed attempt RETRY (``brain.runtime.revoked``),
        if it is wired. Watching is not correctness: a failure is logged, and the cancel, expiry
        or take-back that ended them goes on."""
        self._tell_flower("calls ended before a worker began them", lambda r: r.unrun(runs, expired=expired))

    def tell_lost(self, runs: Iterable[tuple[str | None, str | None]], why: str) -> None:
        """Tell Flower the ``(run id, client id)`` runs, begun by a worker or agent that went
        away (``why``), are over: sent again as new runs, or given up (``brain.runtime.revoked``).
        Best effort, as ``revoke_unrun``."""
        self._tell_flower("runs whose worker went away", lambda r: r.lost(runs, why))

    def _tell_flower(self, what: str, tell: Callable[[RevokedEvents], None]) -> None:
        if self.revoked is None:
            return
        try:
            tell(self.revoked)
        except Exception:
            log.warning("could not tell Flower of %s", what, exc_info=True)

    def move(
        self,
        tree_id: str,
        task_id: str,
        state: TaskState,
        from_states: Collection[TaskState],
        **changes: Any,
    ) -> TaskRecord | None:
        """The one way a task's state is written: a move ``MOVES`` allows, as a compare-and-set
        on ``from_states`` (and on ``expect_run_id`` when given). The record written, or None."""
        check_move(from_states, state)
        return self.store.transition(tree_id, task_id, from_states=from_states, state=state, **changes)

    def _end(
        self,
        tree_id: str,
        task_id: str,
        state: TaskState,
        reason: str,
        from_states: Collection[TaskState],
        error: ErrorInfo | None = None,
    ) -> bool:
        """Give a task a final state without running it, if it is still in ``from_states``."""
        now = self.clock()
        moved = self.move(
            tree_id, task_id, state, from_states, reason=reason, error=error, finished_at=now, updated_at=now
        )
        if moved is None:
            return False
        self._local.ended = self._ended_here() + 1
        return True
