"""Periodic repairs and user cancels (layer: brain/runtime; glue around the scheduler).

The store is the record (docs/reliability.md, "The reconciler"); these sweeps make Redis agree with it:
re-send queued work no queue holds, expire work parked past its ``max_wait``,
re-list parked tasks a crash left unlisted, and advance trees a crash left idle. They
also suspend a client that keeps more than its quota in Redis. A client whose keys
cannot be read is suspended and skipped; every other client is still swept.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterable
from typing import Any, Protocol, TypeVar

from brain.config import Settings
from brain.core.client_health import QUOTA_KIND, Cause, quota_cause
from brain.core.models import TaskRecord, TaskState, TreeRecord
from brain.core.second_look import SecondLook
from brain.core.snapshot import RegistrySnapshot
from brain.core.transitions import (
    IN_FLIGHT,
    PARKED,
    QUEUED,
    RETRY_WAIT,
    REVOKED_IF_ENDED,
    may_be_running,
    queued_state,
)
from brain.hot import cancelled
from brain.hot.client_quota import QUOTA_EVERY_S, UsageMeter, free_client_keys, my_turn_to_measure
from brain.hot.gate import Gate
from brain.hot.parked import ParkedRef, ParkedWork, owner_of
from brain.hot.presence import PresenceBook
from brain.hot.retries import RetryTimers
from brain.hot.state import ClientKeyUnreadable, HotState
from brain.hot.turns import holder_name, my_turn
from brain.runtime.clientwork import ClientScheduling, ClientWork
from brain.runtime.scheduler import new_run_id
from brain.store import Store
from workers.contracts import (
    BRAIN_QUEUE,
    CLIENT_ACK,
    ErrorInfo,
    ToolCall,
    client_key,
    client_queue,
    pool_queue,
    queue_keys,
)

log = logging.getLogger("vancetope.brain")
_T = TypeVar("_T")


def server_queues(records: Iterable[TaskRecord], pools: Iterable[str]) -> list[str]:
    """Where a server run's message can be: the brain's queue (a result on its way), the
    default pool's, every configured pool's, and the pool each record names (one that was
    configured when the run was sent may not be any more); each pool's queue as the list of
    each priority step (a run missed there would be taken for lost and sent again)."""
    named = {*pools, *(r.pool for r in records if r.client_id is None and r.pool is not None)}
    queues = [pool_queue(None), *(pool_queue(p) for p in sorted(named))]
    return [BRAIN_QUEUE, *(key for queue in queues for key in queue_keys(queue))]


class SweepScheduling(ClientScheduling, Protocol):
    """What Sweeps asks of the scheduler (brain.runtime.scheduler.Scheduler): what ClientWork
    asks (``ClientScheduling``: trees, routing, parking, ending a task without a run), and
    moving, cancelling, re-sending tasks; nothing else of its state."""

    def move(
        self, tree_id: str, task_id: str, state: TaskState, from_states: Collection[TaskState], **changes: Any
    ) -> TaskRecord | None: ...

    def cancel_tasks(
        self,
        tree_id: str,
        task_id: str | None = None,
        on_unreadable: Callable[[ClientKeyUnreadable], None] | None = None,
        reason: str = ...,
    ) -> list[str]: ...

    def call_for(self, tree_rec: TreeRecord, rec: TaskRecord) -> ToolCall | None: ...

    def publish(self, call: ToolCall, pool: str | None = None) -> None: ...


class Sweeps:
    def __init__(
        self,
        scheduler: SweepScheduling,
        clients: ClientWork,
        *,
        store: Store,
        hot: HotState,
        presence: PresenceBook,
        parked: ParkedWork,
        settings: Settings,
        registry: Callable[[], RegistrySnapshot],
        clock: Callable[[], float],
    ) -> None:
        """``registry`` returns the registry in use (a reload replaces it while the brain
        runs); ``clock`` must be the scheduler's: both stamp the same records."""
        self.scheduler = scheduler
        self.clients = clients
        self.store = store
        self.hot = hot
        self.presence = presence
        self.parked = parked
        self.settings = settings
        self.registry = registry
        self.clock = clock
        self._quota_checked = -QUOTA_EVERY_S
        self._trimmed_at = -cancelled.TRIM_EVERY_S
        self._backfilled = False
        self._usage = UsageMeter()
        self._holder = holder_name()  # who measures, for a person reading Redis
        self._second_look = SecondLook(settings.reconcile_grace_s)
        self._suspended: set[str] = set()
        # Runs ended unrun this step, by ``expired``: Flower is told when it is over.
        self._unrun: dict[bool, list[tuple[str | None, str | None]]] = {False: [], True: []}
        # Runs begun whose worker or agent was lost, ended this step: Flower is told with them.
        self._lost: list[tuple[str | None, str | None]] = []

    def run_once(self) -> list[str]:
        """One full sweep. Returns the ids of tasks re-sent. A step that fails is logged and
        the next one still runs: one bad record must not stop every repair."""
        resent = self._guarded("re-sending lost tasks", self.resend_lost) or []
        for what, step in (
            ("measuring what clients keep in Redis", self.check_quotas),
            ("giving tasks an older version queued their deadline", self.backfill_deadlines),
            ("expiring parked tasks", self.expire_parked),
            ("expiring overdue tasks", self.expire_overdue),
            ("re-listing parked tasks", self.relist_parked),
            ("re-arming retry timers", self.rearm_retries),
            ("finishing requeues", self.finish_requeues),
            ("advancing idle trees", self.advance_idle),
            ("trimming the cancelled sets", self.trim_cancelled),
        ):
            self._guarded(what, step)
        return resent

    def advance_idle(self) -> None:
        cutoff = self.clock() - self.settings.reconcile_grace_s
        for tree_id in {
            r.tree_id for r in self.store.tasks_in_states({TaskState.PENDING}, updated_before=cutoff)
        }:
            self._guarded(f"advancing tree {tree_id}", self.scheduler.advance, tree_id)

    def _guarded(self, what: str, step: Callable[..., _T], *args: Any) -> _T | None:
        """``step(*args)``, or None after logging why it failed (the sweep goes on)."""
        try:
            return step(*args)
        except Exception:  # a sweep outlives any one record; the log says which
            log.exception("reconciler: %s failed; going on with the rest of the sweep", what)
            return None

    # --- lost messages -----------------------------------------------------------------
    def resend_lost(self) -> list[str]:
        """Queued or running tasks no queue, worker or outbox holds get a new run id and are
        sent again (queued, not running: nothing has begun the new run), and the old run is
        added to the cancelled set, so a late original is refused at begin_run rather than run
        beside the new one (and its result, if it ran, is ignored rather than recorded twice). A running task's message stays in kombu's unacked
        hash while its worker runs it, and after its worker died until it is delivered again;
        only a run nothing holds any more is lost. A call held for approval is the agent's."""
        cutoff = self.clock() - self.settings.reconcile_grace_s
        stale = self.store.tasks_in_states(QUEUED, updated_before=cutoff)
        # None: could not be read (Redis refused): nothing of that owner is called lost this
        # sweep, and the other owners are still looked at.
        held: dict[str | None, set[str] | None] = {}
        # A client run is called lost on a second look only (brain.core.second_look): one
        # round trip for every client's measured round trip; unreadable ones keep one look.
        clients = sorted({rec.client_id for rec in stale if rec.client_id is not None})
        round_trips = self._guarded("reading clients' round trips", self.presence.round_trips, clients) or {}
        now = self.clock()
        missed: list[str] = []
        resent: list[str] = []
        for rec in stale:
            cid = rec.client_id
            if cid not in held:
                owner = "the server queues" if cid is None else f"client {cid!r}'s queues"
                held[cid] = self._guarded(f"reading {owner}", self._held, cid, stale)
            ids = held[cid]
            if ids is None or rec.run_id in ids:
                continue
            run = rec.run_id or f"{rec.tree_id}.{rec.task_id}"
            missed.append(run)
            rtt = round_trips.get(cid) if cid is not None and cid not in self._suspended else None
            if not self._second_look.lost(run, rtt, now):
                continue
            what = f"re-sending task {rec.task_id!r} of tree {rec.tree_id}"
            if self._guarded(what, self._resend, rec, cid):
                resent.append(rec.task_id)
        self._second_look.keep_only(missed)
        self._suspended.clear()
        self._tell_flower()
        return resent

    def _held(self, client_id: str | None, stale: list[TaskRecord]) -> set[str]:
        """Run ids the server queues (None) or a client's keys hold. A client whose keys
        cannot be read is suspended (its session ends, its calls are taken back) and holds
        nothing: what the take-back left queued is parked like any lost call of a client
        gone. Every other client's are still looked at."""
        if client_id is None:
            # A run waiting at the gate is held (re-sent, it would run twice). Its wait list is
            # read first: the gate moves a message from there to its pool queue, never back.
            gate = Gate(self.hot.r)
            return self.hot.message_ids_held(gate.wait_keys() + server_queues(stale, self.registry().pools))
        try:
            return self.hot.message_ids_held([client_queue(client_id)], client_id=client_id)
        except ClientKeyUnreadable as exc:
            # Its calls were just taken back: what is left queued needs no second look.
            self._suspended.add(client_id)
            cause = Cause(kind=f"{exc.name} type", detail=exc.detail)
            self._guarded(f"suspending client {client_id!r}", self.clients.suspend, client_id, cause)
            return set()

    # --- quotas ----------------------------------------------------------------------------
    def check_quotas(self) -> dict[str, int]:
        """Suspend each enrolled client keeping more than ``client_quota_bytes`` in Redis, and
        lift that cause from one back under it. At most every ``QUOTA_EVERY_S``, and by one brain
        of several (``my_turn_to_measure``); returns what was measured (empty when it was not
        time, or another brain's turn)."""
        now = time.monotonic()
        if now - self._quota_checked < QUOTA_EVERY_S:
            return {}
        self._quota_checked = now
        # The lease outlasts two sweeps of the holder, so it keeps the turn while it sweeps.
        lease_s = 3 * max(QUOTA_EVERY_S, self.settings.reconcile_interval_s)
        if not my_turn_to_measure(self.hot.r, self._holder, lease_s):
            return {}  # another brain measures
        quota = self.settings.client_quota_bytes
        used = self._usage.measure(self.hot.r, now, quota)
        # One read of every mark, not one per enrolled client: only a client marked over its
        # quota can have that mark lifted (``clear`` reads it again before it writes).
        marked = {cid for cid, mark in self.clients.misbehaving.all().items() if QUOTA_KIND in mark.causes}
        for cid in self.presence.enrolled():
            cause = quota_cause(used.get(cid, 0), quota)
            if cause is not None:
                self._guarded(f"suspending client {cid!r}", self.clients.suspend, cid, cause)
                freed = self._guarded(
                    f"freeing client {cid!r}'s keys", free_client_keys, self.hot.r, cid, self._ack_only(cid)
                )
                log.warning("client %r was over its quota: deleted %s of its keys in Redis", cid, freed)
            elif cid in marked and self.clients.misbehaving.clear(cid, {QUOTA_KIND}) is not None:
                log.info(
                    "client %r keeps %d bytes, back under its quota of %d: its next announcement is accepted",
                    cid,
                    used.get(cid, 0),
                    quota,
                )
        return used

    # --- the cancelled sets ------------------------------------------------------------------
    def trim_cancelled(self) -> cancelled.Trimmed | None:
        """Take out of the cancelled sets what has been there its time (``cancelled_kept_s``,
        a take-back's longer: ``brain.hot.cancelled``): at most every ``TRIM_EVERY_S``, by one
        brain of several; None when it was not time or another brain's turn. The batches' time
        is Redis's, not the scheduler's clock."""
        if time.monotonic() - self._trimmed_at < cancelled.TRIM_EVERY_S:
            return None
        self._trimmed_at = time.monotonic()
        if not my_turn(self.hot.r, cancelled.TRIM_TURN_KEY, self._holder, cancelled.TRIM_EVERY_S):
            return None
        kept_s = self.settings.cancelled_kept_s
        gate = Gate(self.hot.r)
        done = cancelled.trim(self.hot.r, again_s=kept_s, client_holds=self._holds, waiting=gate.waiting)
        if done.removed or done.kept:
            log.info(
                "cancelled sets: took out %d runs past their time; kept %d that a client still holds "
                "or that wait at the gate, for another %.0f s",
                done.removed,
                done.kept,
                kept_s,
            )
        return done

    def _holds(self, client_id: str) -> set[str] | None:
        """Run ids a client's keys hold; None when they cannot be read (the lost-call sweep
        suspends such a client: here its runs are only kept, for a later look)."""
        try:
            return self.hot.message_ids_held([client_queue(client_id)], client_id=client_id, both_ways=True)
        except ClientKeyUnreadable:
            return None

    @staticmethod
    def _ack_only(client_id: str) -> frozenset[str]:
        # The ack says why it was suspended: the one key the agent is told to read.
        return frozenset({client_key(client_id, CLIENT_ACK)})

    def _resend(self, rec: TaskRecord, client_id: str | None) -> bool:
        """Send ``rec`` again as a new run; True only when it was sent (not given up, not parked).
        Whichever it is, the lost run is cancelled: it is no longer the task's run."""
        tree_rec = self.scheduler.tree(rec.tree_id)
        if tree_rec is None:
            return False
        if rec.resent >= self.settings.max_deliveries + 1:
            self._lost_too_often(tree_rec, rec)
            return False  # given up, not re-sent
        if client_id is not None and self.presence.session(client_id) is None:
            # Its client is gone: treat it like work taken back on disconnect (parked, not re-sent).
            reason = f"Queued for Client: {rec.tool} (its message to client {client_id} was lost)"
            if self.scheduler.park(
                tree_rec, rec, TaskState.PENDING_CLIENT, reason, {rec.state}, parked_at=rec.queued_at
            ):
                self._cancel_run(rec, lost=True)  # it runs again as a new run when its client is back
            return False
        if client_id is None and rec.run_id:
            # A lost server run gives back any gate slot it held, and its waiting entry.
            Gate(self.hot.r).admit(release=[rec.run_id])
            Gate(self.hot.r).forget([rec.run_id])
        attempt = rec.attempt + 1
        now = self.clock()
        moved = self.scheduler.move(  # queued where it was sent, as a new run
            rec.tree_id,
            rec.task_id,
            queued_state(client_id),
            {rec.state},
            expect_run_id=rec.run_id,
            run_id=new_run_id(rec.tree_id, rec.task_id, attempt),
            attempt=attempt,
            resent=rec.resent + 1,
            deliveries=0,
            queued_at=now,
            updated_at=now,
        )
        if moved is None:
            return False
        # The old run is superseded before the new one is sent: its message, if it surfaces
        # late (an agent that popped it before its link was cut, kombu restoring it after the
        # agent died), is refused at begin_run, so the two never both start.
        self._cancel_run(rec, lost=True)
        call = self.scheduler.call_for(tree_rec, moved)
        if call is None:
            return False
        log.warning(
            "task %s of tree %s was queued but nothing held run %s: re-sent as run %s",
            rec.task_id,
            rec.tree_id,
            rec.run_id,
            moved.run_id,
        )
        self.scheduler.publish(call, moved.pool)
        self.hot.notify(rec.tree_id)
        return True

    def _lost_too_often(self, tree_rec: TreeRecord, rec: TaskRecord) -> None:
        """The attempt whose runs were lost ``max_deliveries + 2`` times fails ``LostTooOften``:
        retried as its retry policy says (the error is ``unavailable``, brain.core.retry), as
        any failed attempt is, else the task fails."""
        error = ErrorInfo(
            type="LostTooOften",
            data={"task": rec.task_id, "tool": rec.tool},
            message=f"task {rec.task_id!r} (tool {rec.tool!r}) was lost {rec.resent + 1} times "
            "between the brain and its worker; gave up. Check the worker logs.",
        )
        retried = self.scheduler.retry_later(
            tree_rec, rec, error, IN_FLIGHT, started_at=rec.started_at, finished_at=self.clock()
        )
        if retried is None and not self.scheduler.finish_without_run(
            rec, TaskState.FAILED, error.message, IN_FLIGHT, error=error
        ):
            return  # moved on meanwhile (its result came, a cancel)
        self._cancel_run(rec, lost=True)
        if retried is None:
            log.error("task %s of tree %s: %s", rec.task_id, rec.tree_id, error.message)
            self.scheduler.advance(rec.tree_id)
        else:  # retry_later logged the attempt and when the next one starts
            log.warning(
                "task %s of tree %s: its run was lost too often; retried as its policy says",
                rec.task_id,
                rec.tree_id,
            )

    # --- parked work ----------------------------------------------------------------------
    def expire_parked(self) -> list[str]:
        """Parked past ``max_wait_s`` (the tree's, else the tool's, else the default): a clear final state."""
        now = self.clock()
        return [
            rec.task_id
            for rec in self.store.tasks_in_states(PARKED)
            if self._guarded(
                f"expiring task {rec.task_id!r} of tree {rec.tree_id}", self._expire_parked, rec, now
            )
        ]

    def _expire_parked(self, rec: TaskRecord, now: float) -> bool:
        spec = self.registry().tools.get(rec.tool)
        tree_rec = self.scheduler.tree(rec.tree_id)
        max_wait = (
            (tree_rec.tree.max_wait_s if tree_rec else None)
            or (spec.max_wait_s if spec else None)
            or self.settings.max_wait_s
        )
        if max_wait is None or rec.queued_at is None or now - rec.queued_at < max_wait:
            return False
        reason = (
            f"expired: waited {now - rec.queued_at:.0f}s for a client with tool {rec.tool!r} "
            f"(max_wait_s {max_wait:g})"
        )
        if not self.scheduler.finish_without_run(rec, TaskState.EXPIRED, reason, {rec.state}):
            return False
        self._guarded(f"advancing tree {rec.tree_id}", self.scheduler.advance, rec.tree_id)
        return True

    def backfill_deadlines(self) -> int:
        """Once per brain process, at its first sweep: the deadlines of tasks an older version
        queued without one (``Store.backfill_deadlines``), so that ``expire_overdue`` sees them."""
        if self._backfilled:
            return 0
        given = self.store.backfill_deadlines()
        self._backfilled = True
        if given:
            log.info(
                "gave %d unfinished tasks an older version queued the deadline of their max_total_s", given
            )
        return given

    def expire_overdue(self) -> list[str]:
        """Tasks past their ``max_total_s`` end ``expired`` wherever they are; a run in flight
        is cancelled so a worker that has not started it never will, and one no worker began
        (at the gate, in its queue) is shown revoked in Flower, all in one go."""
        now = self.clock()
        # Only the tasks past their deadline, through the store's index of those that have one:
        # before, the 1,000 stalest unfinished tasks were read and their specs parsed every
        # sweep, and a task behind a bigger backlog of other trees' was never expired.
        expired = [
            rec.task_id
            for rec in self.store.tasks_expired(now)
            if self._guarded(
                f"expiring task {rec.task_id!r} of tree {rec.tree_id}", self._expire_overdue, rec, now
            )
        ]
        self._tell_flower()
        return expired

    def _expire_overdue(self, rec: TaskRecord, now: float) -> bool:
        tree_rec = self.scheduler.tree(rec.tree_id)  # cached while the tree runs
        if tree_rec is None or rec.first_queued_at is None:
            return False
        limit = (rec.spec or tree_rec.tree.task(rec.task_id)).max_total_s
        if limit is None or now - rec.first_queued_at < limit:
            return False
        reason = f"expired: not finished within max_total_s {limit:g} (state was {rec.state.value})"
        if not self.scheduler.finish_without_run(rec, TaskState.EXPIRED, reason, {rec.state}):
            return False
        if rec.run_id:
            self._cancel_run(rec, expired=True)
        self._guarded(f"advancing tree {rec.tree_id}", self.scheduler.advance, rec.tree_id)
        return True

    def rearm_retries(self) -> int:
        """Tasks the store says wait to retry whose timer Redis lost (restarted without its
        data, or a brain died between taking a timer and starting the attempt) get it back;
        one past due starts at the retry timer's next poll. How many were missing."""
        timers = [
            (rec.tree_id, rec.task_id, rec.retry_at or self.clock())
            for rec in self.store.tasks_in_states(RETRY_WAIT)
        ]
        missing = RetryTimers(self.hot.r).ensure(timers)
        if missing:
            log.warning("reconciler: set %d lost retry timer(s) again", missing)
        return missing

    def relist_parked(self) -> int:
        """Parked tasks that no parked list names (a crash between the store write and the
        list push) are listed again; then clients get their requeue. Lists are read a chunk
        at a time."""
        cutoff = self.clock() - self.settings.reconcile_grace_s
        parked = self.store.tasks_in_states(PARKED, updated_before=cutoff)
        if not parked:
            return 0
        listed = self._listed_refs()
        relisted = 0
        for rec in parked:
            if (rec.tree_id, rec.task_id) in listed:
                continue
            if self._guarded(f"re-listing task {rec.task_id!r} of tree {rec.tree_id}", self._relist, rec):
                relisted += 1
        return relisted

    def _relist(self, rec: TaskRecord) -> bool:
        tree_rec = self.scheduler.tree(rec.tree_id)
        if tree_rec is None:
            return False
        owner = owner_of(tree_rec.user, tree_rec.client_id)
        self.parked.park(
            ParkedRef(
                tree_id=rec.tree_id,
                task_id=rec.task_id,
                owner=owner,
                parked_at=rec.queued_at or self.clock(),
            )
        )
        return True

    def _listed_refs(self) -> set[tuple[str, str]]:
        parked = self.parked
        return {(ref.tree_id, ref.task_id) for key in parked.listed_keys() for ref in parked.refs_in(key)}

    def finish_requeues(self) -> None:
        """Finish requeues a crash (or an error midway) interrupted, for clients still connected."""
        for cid in self.parked.requeueing_clients():
            if self.presence.session(cid) is not None:
                self.clients.requeue(cid)

    # --- cancel ----------------------------------------------------------------------------
    def _cancel_run(self, rec: TaskRecord, *, expired: bool = False, lost: bool = False) -> None:
        """Add the task's run to the cancelled set its worker checks (a client's message still
        in its queue is taken out); an ``expired`` run a worker may have begun is stopped. A
        client that replaced its own set is suspended; the task is cancelled in the store
        regardless. A run no worker or agent began (``rec`` as it was read: queued), or a
        failed attempt waiting to retry, is shown revoked in Flower, ``expired`` if its time
        ran out; one begun by a worker or agent that is ``lost``, failed (``WorkerLostError``);
        once the step is over (``_tell_flower``: one message for them all)."""
        # An expired run is stopped where it runs too; a lost one is left to end (it may be
        # running on a live agent, and its new run is answered from its result).
        begun = expired and may_be_running(rec.client_id, ended_unrun=rec.state in REVOKED_IF_ENDED)
        # A lost run is kept in the set as long as one taken back (brain.hot.cancelled).
        kept_s = self.settings.cancelled_kept_s if expired else cancelled.TAKEN_BACK_KEPT_S
        run = rec.run_id or ""
        try:
            self.hot.cancel_runs([run], rec.client_id, stop=[run] if begun else (), kept_s=kept_s)
        except ClientKeyUnreadable as exc:
            self._suspend_unreadable(exc)
        if rec.state in REVOKED_IF_ENDED:
            self._unrun[expired].append((rec.run_id, rec.client_id))
        elif lost:
            self._lost.append((rec.run_id, rec.client_id))

    def _tell_flower(self) -> None:
        """Tell Flower of the runs ``_cancel_run`` ended before a worker began them, and of
        those whose worker was lost."""
        unrun, self._unrun = self._unrun, {False: [], True: []}
        lost, self._lost = self._lost, []
        for expired, runs in unrun.items():
            if runs:
                self._guarded("telling Flower of calls ended unrun", self._revoke, runs, expired)
        if lost:
            self._guarded("telling Flower of runs whose worker was lost", self._tell_lost, lost)

    def _revoke(self, runs: list[tuple[str | None, str | None]], expired: bool) -> None:
        self.scheduler.revoke_unrun(runs, expired=expired)

    def _tell_lost(self, runs: list[tuple[str | None, str | None]]) -> None:
        self.scheduler.tell_lost(runs, "its worker or client agent was lost mid-call (nothing held its run)")

    def _suspend_unreadable(self, exc: ClientKeyUnreadable) -> None:
        cause = Cause(kind=f"{exc.name} type", detail=exc.detail)
        self._guarded(f"suspending client {exc.client_id!r}", self.clients.suspend, exc.client_id, cause)

    def cancel(self, tree_id: str, task_id: str | None = None, reason: str | None = None) -> list[str]:
        """Cancel a whole tree or one task: every unfinished task becomes ``skipped`` (cancelled,
        by default "cancelled by user", else ``reason``); runs in flight are added to the
        cancelled set their worker checks before starting, which an offline client reads when
        it comes back."""
        if reason is None:
            return self.scheduler.cancel_tasks(tree_id, task_id, on_unreadable=self._suspend_unreadable)
        return self.scheduler.cancel_tasks(
            tree_id, task_id, on_unreadable=self._suspend_unreadable, reason=reason
        )
