"""Clients coming and going (layer: brain/runtime; glue around the scheduler).

Connect: accept the announcement into the active registry, then requeue the work
parked for that client, then for its user, in chunks (brain.hot.parked: oldest parked
first within a list; the lists are not interleaved). Disconnect (graceful, or a
missed heartbeat): pull that client's unstarted calls back out of its queue as
pending_client, and let calls it was running follow their offline strategy; both
run again on a later connect. A running call taken back is counted on its task, and its
attempt fails as a poison task at ``max_deliveries`` (brain.core.client_poison), retried as
its retry policy says. Every move is a compare-and-set on the task, and
the Redis side answers whether *we* took a message, so nothing runs in two
places or disappears.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable
from typing import Protocol

import redis

from brain.config import Settings
from brain.core.client_health import QUOTA_KIND, Cause
from brain.core.client_poison import poison_error, running_take_back
from brain.core.models import TaskRecord, TaskState, TreeRecord, TreeStatus
from brain.core.routing import Presence
from brain.core.sessions import ClientSession, check_announcement
from brain.core.snapshot import RegistrySnapshot
from brain.core.toolnames import clash_lines
from brain.core.transitions import NOT_BEGUN, PARKED, SENT_TO_CLIENT
from brain.hot.client_keys import read_client_keys
from brain.hot.collector import collector_held
from brain.hot.misbehaving import MisbehavingBook
from brain.hot.parked import ParkedRef, ParkedWork
from brain.hot.presence import PresenceBook
from brain.hot.state import ClientKeyUnreadable, HotState
from brain.hot.turns import holder_name, keep_turn
from brain.runtime.events import HEARTBEAT_S, ClientEvents
from brain.store import Store
from workers.contracts import CLIENT_ACK, KEY_NS, AnnouncementAck, ClientConnected, ErrorInfo, client_key

log = logging.getLogger("vancetope.brain")

# Flower expects an agent's heartbeat every HEARTBEAT_S and lists it offline after two missed;
# the relay sweeps every 1-2 s, so the next round of heartbeats is due this long after the last
# (gaps of 1.5 to about 3 s), never at every sweep.
BEAT_DUE_S = 0.75 * HEARTBEAT_S
# One brain of several tells Flower the clients are alive (two would double its heartbeats); it
# keeps the turn while it sweeps (every HEARTBEAT_S / 2), another takes it this long after it stops.
BEATS_TURN_KEY = f"{KEY_NS}flower:heartbeats"
BEATS_LEASE_S = HEARTBEAT_S


class ClientScheduling(Protocol):
    """What ClientWork asks of the scheduler (brain.runtime.scheduler.Scheduler): the scheduler's
    operations on tasks and trees, the registry in use (which names a client's tools answer
    to depends on it) and the settings (``max_deliveries``), nothing else of its state."""

    @property
    def registry(self) -> RegistrySnapshot: ...

    @property
    def settings(self) -> Settings: ...

    def tree(self, tree_id: str) -> TreeRecord | None: ...

    def start(
        self,
        tree_rec: TreeRecord,
        rec: TaskRecord,
        presence: Presence,
        from_states: Collection[TaskState],
        parked_at: float | None = None,
    ) -> bool: ...

    def park(
        self,
        tree_rec: TreeRecord,
        rec: TaskRecord,
        state: TaskState,
        reason: str,
        from_states: Collection[TaskState],
        parked_at: float | None = None,
    ) -> bool: ...

    def finish_without_run(
        self,
        rec: TaskRecord,
        state: TaskState,
        reason: str,
        from_states: Collection[TaskState],
        error: ErrorInfo | None = None,
    ) -> bool: ...

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
    ) -> float | None: ...

    def advance(self, tree_id: str) -> TreeStatus | None: ...

    def revoke_unrun(self, runs: Iterable[tuple[str | None, str | None]], *, expired: bool) -> None: ...

    def tell_lost(self, runs: Iterable[tuple[str | None, str | None]], why: str) -> None: ...


class ClientWork:
    def __init__(
        self,
        scheduler: ClientScheduling,
        *,
        store: Store,
        hot: HotState,
        presence: PresenceBook,
        parked: ParkedWork,
        clock: Callable[[], float],
        events: ClientEvents | None = None,
    ) -> None:
        """``clock`` must be the scheduler's: both stamp the same records."""
        self.scheduler = scheduler
        self.store = store
        self.hot = hot
        self.presence = presence
        self.parked = parked
        self.clock = clock
        self.events = events  # Flower's view of client agents, when wired
        # Clients suspended for what they wrote (brain.hot.misbehaving), in the brain's own key.
        self.misbehaving = MisbehavingBook(hot.r)
        self._sweep_failing: set[str] = set()
        self._beats_sent: float | None = None  # when the last round of Flower heartbeats went
        self._holder = holder_name()

    # --- connect -------------------------------------------------------------------------
    def on_connected(self, msg: ClientConnected, owner: str) -> AnnouncementAck:
        """Check and record an announcement (``owner``: whose outbox it came through), ack it,
        and requeue parked work when accepted."""
        enrollment = self.presence.enrollment(owner)
        refusal = check_announcement(msg, owner, enrollment)
        suspended = None if refusal is not None else self._still_misbehaving(owner)
        if suspended is not None:
            # Its cause was logged once when found; each refused retry is not worth a line.
            log.debug("refused announcement of suspended client %r: %s", owner, suspended)
            ack = AnnouncementAck(session_id=msg.session_id, accepted=False, reason=suspended)
        elif refusal is not None or enrollment is None:
            log.warning("refused announcement of client %r (session %s): %s", owner, msg.session_id, refusal)
            ack = AnnouncementAck(session_id=msg.session_id, accepted=False, reason=refusal or "not enrolled")
        else:
            previous = self.presence.session(owner)
            session = self.presence.connect(msg, enrollment, self.clock())
            if session.held_tools:
                log.warning(
                    "client %s announced changed definitions of %s: not routed to until "
                    "`vancetope clients approve-tools %s`",
                    owner,
                    ", ".join(t.name for t in session.held_tools),
                    owner,
                )
            for line in clash_lines(session.clashes(self.scheduler.registry.tools)):
                log.warning("client %s: %s", owner, line)
            if previous is not None and previous.session_id != msg.session_id:
                # The agent restarted (a session id lives as long as its process): what the old
                # process had reserved or was running will never be answered, so take it back
                # now, with the new session already routable, instead of waiting for its lease.
                log.warning("client %s came back as a new session; taking back the old one's calls", owner)
                self._take_back(previous)
            log.info(
                "client %s connected (%s, %d tools)", owner, msg.client_type.value, len(msg.available_tools)
            )
            ack = AnnouncementAck(session_id=msg.session_id, accepted=True, tools=len(msg.available_tools))
        self.hot.r.set(client_key(owner, CLIENT_ACK), ack.model_dump_json())
        if ack.accepted:
            if self.events is not None:
                self.events.online(owner)
            self.requeue(owner)
        return ack

    def _still_misbehaving(self, client_id: str) -> str | None:
        """Why an otherwise valid announcement is refused: a key of the client's is still
        malformed, or it is still over its quota; None when it announces cleanly, which
        clears the rest of its mark (a malformed message it sent before)."""
        reading = read_client_keys(self.hot.r, [client_id])[client_id]
        for cause in reading.all_causes():
            self.misbehaving.mark(client_id, cause, self.clock())
        mark = self.misbehaving.get(client_id)
        if mark is None:
            return None
        if reading.all_causes() or QUOTA_KIND in mark.causes:
            return suspension_reason(mark.shown())
        self.misbehaving.clear(client_id)
        log.info("client %r announced cleanly: no longer suspended (it was for: %s)", client_id, mark.shown())
        return None

    def suspend(self, client_id: str, cause: Cause) -> None:
        """Mark the client misbehaving for ``cause``: its session ends (nothing more is routed
        to it, its unstarted calls come back as for a disconnect) and its ack says why, until
        it announces cleanly. The cause is logged once (brain.hot.misbehaving)."""
        new = self.misbehaving.mark(client_id, cause, self.clock())
        session = self.presence.session(client_id)
        if session is not None:
            self.on_disconnected(client_id, session.session_id, f"suspended: {cause.detail}")
        if new or session is not None:
            mark = self.misbehaving.get(client_id)
            reason = suspension_reason(mark.shown() if mark else cause.detail)
            sid = session.session_id if session is not None else ""
            self.hot.r.set(
                client_key(client_id, CLIENT_ACK),
                AnnouncementAck(session_id=sid, accepted=False, reason=reason).model_dump_json(),
            )

    def requeue(self, client_id: str) -> int:
        """Route every parked task this client may take again: its own list, then its user's,
        each oldest parked first. A list another requeue is working on is left to that one (it
        makes another pass, and routes by presence, which already shows this client)."""
        session = self.presence.session(client_id)
        if session is None:
            return 0
        owners = [f"client:{client_id}", f"user:{session.user}"]
        placed = 0
        touched: set[str] = set()

        # A tree bound to this client routes to it alone (brain.core.routing): its session is
        # all the view needs. Another tree's view needs its user's clients: their sessions are
        # read once per chunk of refs (up to 1,000) through the user's index. Both used to read
        # every session per requeued task, so 1,000 clients reconnecting at once cost O(N²).
        own = {client_id: session}

        def place(refs: list[ParkedRef]) -> None:
            nonlocal placed
            by_user: dict[tuple[str | None, str | None], dict[str, ClientSession]] = {}
            for ref in refs:
                rec = self.store.get_task(ref.tree_id, ref.task_id)
                tree_rec = self.scheduler.tree(ref.tree_id)
                # A ref whose task moved on (cancelled, expired, requeued elsewhere) is just dropped.
                if rec is None or tree_rec is None or rec.state not in PARKED:
                    continue
                if tree_rec.client_id == client_id:
                    sessions = own
                else:
                    whose = (tree_rec.user, tree_rec.client_id)
                    if whose not in by_user:
                        by_user[whose] = self.presence.sessions_for(*whose)
                    sessions = by_user[whose]
                presence = self.presence.view(
                    user=tree_rec.user,
                    session_client=tree_rec.client_id,
                    sessions=sessions,
                    registry=self.scheduler.registry.tools,
                )
                if self.scheduler.start(tree_rec, rec, presence, {rec.state}, parked_at=ref.parked_at):
                    placed += 1
                    touched.add(ref.tree_id)

        self.parked.requeue(client_id, owners, place)
        for tree_id in touched:
            self.scheduler.advance(tree_id)
        if placed:
            log.info("requeued %d parked task(s) for client %s", placed, client_id)
        return placed

    # --- disconnect ----------------------------------------------------------------------
    def on_disconnected(self, client_id: str, session_id: str | None, why: str) -> int:
        """Forget the session and take back its unfinished calls. Returns how many were taken."""
        session = self.presence.disconnect(client_id, session_id)
        if session is None:
            return 0
        # An agent that is in fact still alive sees its ack gone and announces again.
        self.hot.r.delete(client_key(client_id, CLIENT_ACK))
        log.warning("client %s disconnected: %s", client_id, why)
        if self.events is not None:
            self.events.offline(client_id)
        return self._take_back(session)

    def _take_back(self, session: ClientSession) -> int:
        cid = session.client_id
        # Every call sent to this client must be looked at, not the first thousand.
        # Queued, begun or held for approval there; a running server task has no client id.
        mine = self.store.tasks_in_states(SENT_TO_CLIENT, client_id=cid, limit=1_000_000)
        # The queue and unacked hash are read once for all of them, not once per run.
        where_by_run = self.hot.take_client_runs(cid, [rec.run_id or "" for rec in mine])
        try:
            self.hot.cancel_runs(where_by_run, cid, unqueue=False)  # just taken out of its queue
        except ClientKeyUnreadable as exc:
            # Its own cancelled set, replaced by the client: the calls still come back here.
            self.misbehaving.mark(cid, Cause(kind="cancelled set type", detail=exc.detail), self.clock())
        taken = 0
        touched: set[str] = set()
        # Each tree's view needs the sessions of its user's clients: read once per user (and
        # bound client) for every call re-routed, not every connected client's.
        by_user: dict[tuple[str | None, str | None], dict[str, ClientSession]] = {}
        unrun: list[tuple[str | None, str | None]] = []  # taken back before the agent began them
        lost: list[tuple[str | None, str | None]] = []  # taken back after it began them
        for rec in mine:
            where = where_by_run.get(rec.run_id or "")
            if where is None:
                continue  # the agent had taken or finished it; its result is on the way
            tree_rec = self.scheduler.tree(rec.tree_id)
            if tree_rec is None:
                continue
            if where == "queued":
                # Never started: it keeps its place and waits for a client (seed: pending-client).
                reason = f"Queued for Client: {rec.tool} (client {cid} went offline before starting it)"
                moved = self.scheduler.park(
                    tree_rec,
                    rec,
                    TaskState.PENDING_CLIENT,
                    reason,
                    {rec.state},
                    parked_at=rec.queued_at,
                )
            else:
                whose = (tree_rec.user, tree_rec.client_id)
                if whose not in by_user:
                    by_user[whose] = self.presence.sessions_for(*whose)
                moved = self._take_back_running(tree_rec, rec, by_user[whose])
            if moved:
                taken += 1
                touched.add(rec.tree_id)
                (unrun if rec.state in NOT_BEGUN else lost).append((rec.run_id, cid))
        # Their runs are over (each runs again as a new run, or is given up): Flower would show
        # them received, or started, for ever.
        self.scheduler.revoke_unrun(unrun, expired=False)
        self.scheduler.tell_lost(lost, f"client agent {cid} went away mid-call")
        for tree_id in touched:
            self.scheduler.advance(tree_id)
        return taken

    def _take_back_running(
        self, tree_rec: TreeRecord, rec: TaskRecord, sessions: dict[str, ClientSession]
    ) -> bool:
        """A call its agent was running when it went away: counted on the task
        (``taken_back``), then routed again as a new run, or, once its tool has lost its agent
        ``max_deliveries`` times in this attempt (brain.core.client_poison), a failed attempt
        with a ``PoisonTask``: retried as its retry policy says (``on: [unavailable]``), as a
        server run's ``PoisonTask`` result is, else failed. Its old run is already in the
        client's cancelled set (``_take_back``)."""
        cid = rec.client_id or ""
        limit = self.scheduler.settings.max_deliveries
        decision = running_take_back(rec.taken_back, limit)
        # Counted first, on its own compare-and-set: a crash before the re-route leaves a call
        # the reconciler finds lost and sends again, its count kept (never one lost).
        counted = self.store.transition(
            rec.tree_id,
            rec.task_id,
            from_states={rec.state},
            expect_run_id=rec.run_id,
            taken_back=decision.taken_back,
        )
        if counted is None:
            return False  # moved on meanwhile (its result, a cancel): nothing to take back
        if decision.poison:
            error = poison_error(rec.task_id, rec.tool, cid, decision.taken_back, limit)
            log.warning("tree %s: %s", rec.tree_id, error.message)
            retried = self.scheduler.retry_later(
                tree_rec,
                counted,
                error,
                {counted.state},
                started_at=counted.started_at,
                finished_at=self.clock(),
            )
            if retried is not None:
                return True
            return self.scheduler.finish_without_run(
                counted, TaskState.FAILED, error.message, {counted.state}, error=error
            )
        presence = self.presence.view(
            user=tree_rec.user,
            session_client=tree_rec.client_id,
            sessions=sessions,
            registry=self.scheduler.registry.tools,
        )
        return self.scheduler.start(tree_rec, counted, presence, {counted.state}, parked_at=counted.queued_at)

    def sweep_heartbeats(self) -> None:
        """Drop clients whose heartbeat stopped, suspend those whose keys are malformed, tell
        Flower the others are alive (all in one round, every ``BEAT_DUE_S`` at most). One
        client's failure is logged (once until it recovers) and the others are still swept.

        The garbage collector is held off while the readings live (``brain.hot.collector``):
        with 1,000 clients they are thousands of tracked objects at once (readings, tuples,
        dicts: ~16 young collections a sweep), and the collections they set off made a client
        cost the brain a third more at 1,000 than at 100. Only the read and the sorting are
        held: suspending a client and taking a gone one's calls back (store and Redis round
        trips) come after."""
        alive: list[str] = []
        # (client, its causes) to suspend, or (client, no cause, its session) gone silent
        trouble: list[tuple[str, list[Cause], str]] = []
        with collector_held():
            inspected = self.presence.inspect()
            try:
                self.presence.index({cid: session for cid, (session, _) in inspected.items()})
            except redis.RedisError as exc:  # the next sweep puts them there
                log.warning("could not index the connected clients by user: %s", exc)
            for cid, (session, reading) in inspected.items():
                causes = reading.all_causes()
                if causes or reading.beat.session_id != session.session_id:
                    trouble.append((cid, causes, session.session_id))
                else:
                    alive.append(cid)
            del inspected  # freed here, by its reference counts
        self._sweep_failing.difference_update(alive)
        for cid, causes, session_id in trouble:
            try:
                for cause in causes:
                    self.suspend(cid, cause)
                if not causes:
                    self.on_disconnected(cid, session_id, "missed heartbeat")
                    self._sweep_failing.discard(cid)
            except Exception:
                if cid not in self._sweep_failing:
                    log.exception("heartbeat sweep of client %r failed; going on with the others", cid)
                self._sweep_failing.add(cid)
        now = self.clock()
        last = self._beats_sent
        # (A clock set back makes the gap negative: beat then too, rather than fall silent.)
        if self.events is None or not keep_turn(self.hot.r, BEATS_TURN_KEY, self._holder, BEATS_LEASE_S):
            return  # another brain's turn to tell Flower
        if alive and (last is None or not 0 <= now - last < BEAT_DUE_S):
            self.events.heartbeats(alive)
            self._beats_sent = now


def suspension_reason(causes: str) -> str:
    """What a suspended client's agent is told (its ack's reason)."""
    return (
        f"suspended by the brain: {causes}. Fix it (or ask the operator); "
        "the next clean announcement is accepted"
    )
