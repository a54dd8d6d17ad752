"""Who has work waiting, and is anyone taking it (layer: brain/hot; pure report, then Redis glue).

The operator's first question about a stuck run: is work waiting on a queue nobody
consumes? For each server pool: the messages on its queue and the live workers serving it
(``workers.pool_presence``). For each enrolled client: the calls on its queue, those it
took and has not finished, the work parked for it, and whether it is connected. For each
user with parked work: whether any client of that user is connected to take it.
``vancetope status`` shows it; ``vancetope status --queues --json`` prints ``QueuesReport``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

import redis
from pydantic import BaseModel, ConfigDict, computed_field

from brain.config import Settings
from brain.core.client_health import reply_cause, typed_keys
from brain.core.fairshare import AppliedLimit, user_limit, written_limits
from brain.core.snapshot import RegistrySnapshot
from brain.hot.boundary import unreachable
from brain.hot.gate import Gate, KeyView, LaneView
from brain.hot.misbehaving import MisbehavingBook
from brain.hot.parked import ParkedWork
from brain.hot.presence import PresenceBook
from brain.hot.state import HotState
from brain.store import open_store
from workers.contracts import (
    DEFAULT_POOL,
    KOMBU_UNACKED,
    client_key,
    client_queue,
    pool_queue,
    queue_keys,
)
from workers.pool_presence import live_pool_workers


class PoolQueue(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    pool: str
    queue: str
    waiting: int  # messages on the queue that no worker has taken yet
    workers: list[str]  # live workers serving it (Celery node names)
    throttled: int = 0  # calls for this pool waiting at the gate (brain.hot.gate), not on the queue

    @computed_field  # type: ignore[prop-decorator]
    @property
    def nobody_consuming(self) -> bool:
        return self.waiting > 0 and not self.workers


class ClientQueue(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    client_id: str
    user: str
    connected: bool
    queue: str
    waiting: int  # calls on its queue
    taken: int  # calls its agent took and has not finished
    parked: int  # blocked / pending_client work waiting for this very client
    # Why the brain suspended it (brain.hot.misbehaving), or why its queue could not be read.
    misbehaving: str | None = None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def nobody_consuming(self) -> bool:
        return self.waiting + self.parked > 0 and not self.connected


class UserQueue(BaseModel):
    """Work parked for any client of a user (autonomous runs)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    user: str
    parked: int
    connected_clients: list[str]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def nobody_consuming(self) -> bool:
        return self.parked > 0 and not self.connected_clients


class LimitQueue(BaseModel):
    """One limit (or a paused server) at the gate: what it allows, what waits on it and who for,
    how fast calls go through it now (docs/output.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    limit: str  # its key: tool:<name>, server:<name>, pool:<name>
    scope: str
    name: str
    rate_limit: str | None
    max_concurrency: int | None
    waiting: int  # calls at the gate bounded by it
    throttled: int  # of those, calls whose lane this very limit holds now
    waiting_by_user: dict[str, int]  # waiting, per user ("" for runs without one)
    running: int  # slots held now (its max_concurrency's)
    rate_per_s: float  # calls admitted per second over the last RATE_WINDOW_S seconds
    paused_until: float | None  # a 429's Retry-After: no call before this (epoch s)
    paused_why: str | None


# The window `status --queues` measures a limit's current rate over (the gate keeps 12 s).
RATE_WINDOW_S = 10


class QueuesReport(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    pools: list[PoolQueue]
    clients: list[ClientQueue]
    users: list[UserQueue]
    limits: list[LimitQueue] = []

    def alarms(self) -> list[str]:
        """One line per queue with work waiting and nobody consuming it, saying what to start."""
        lines = [
            f"pool {p.pool!r}: {p.waiting} call(s) waiting on queue {p.queue!r}, no live worker; "
            f"start one: vancetope worker{'' if p.pool == DEFAULT_POOL else f' --pool {p.pool}'}"
            for p in self.pools
            if p.nobody_consuming
        ]
        lines += [
            f"client {c.client_id!r} (user {c.user!r}): {c.waiting} call(s) queued, {c.parked} parked, "
            "not connected; start its agent (vancetope-agent run)"
            for c in self.clients
            if c.nobody_consuming
        ]
        lines += [
            f"client {c.client_id!r} (user {c.user!r}) misbehaves, suspended: {c.misbehaving}"
            for c in self.clients
            if c.misbehaving
        ]
        lines += [
            f"user {u.user!r}: {u.parked} task(s) parked for any of the user's clients, none connected; "
            "start a client agent of this user"
            for u in self.users
            if u.nobody_consuming
        ]
        return lines


def pool_names(*named: Collection[str]) -> list[str]:
    """The default pool, then every named pool of ``named`` once, sorted."""
    return [DEFAULT_POOL, *sorted({n for names in named for n in names} - {DEFAULT_POOL})]


def user_queues(parked: Mapping[str, int], connected: Mapping[str, str]) -> list[UserQueue]:
    """Per ``user:<name>`` owner with parked work: who of that user is connected. ``connected``:
    client id -> user of each connected client. Pure."""
    users = sorted(
        owner.removeprefix("user:") for owner, n in parked.items() if owner.startswith("user:") and n
    )
    return [
        UserQueue(
            user=user,
            parked=parked[f"user:{user}"],
            connected_clients=sorted(cid for cid, u in connected.items() if u == user),
        )
        for user in users
    ]


def user_caps(lanes: Sequence[LaneView], cap: int) -> list[AppliedLimit]:
    """``max_in_flight_per_user`` as the caps of the users with calls at the gate under it, one
    per user and pool (the setting writes one cap for all; ``status --queues`` shows each). Pure."""
    capped = {
        (lane.pool, lane.user) for lane in lanes if user_limit(lane.pool, lane.user, cap).key in lane.keys
    }
    return [user_limit(pool, user, cap) for pool, user in sorted(capped)]


def limit_queues(
    written: Sequence[AppliedLimit], lanes: Sequence[LaneView], keys: Mapping[str, KeyView], now: float
) -> list[LimitQueue]:
    """Per limit written (and per budget paused with none written): the calls at the gate it
    bounds, those it holds, per user, and its budget now (``keys``, read at Redis time ``now``).
    Pure."""
    limits = {limit.key: limit for limit in written}
    for key, view in keys.items():
        if key not in limits and view.paused_until is not None:
            scope, _, name = key.partition(":")
            limits[key] = AppliedLimit(scope, name, None, None)
    second = int(now)
    rows = []
    for key, limit in limits.items():
        mine = [lane for lane in lanes if key in lane.keys and lane.waiting]
        by_user: dict[str, int] = {}
        for lane in mine:
            by_user[lane.user] = by_user.get(lane.user, 0) + lane.waiting
        view = keys.get(key, KeyView(0, {}, None, None))
        admitted = sum(n for s, n in view.admitted.items() if second - RATE_WINDOW_S <= s < second)
        rows.append(
            LimitQueue(
                limit=key,
                scope=limit.scope,
                name=limit.name,
                rate_limit=limit.rate_limit,
                max_concurrency=limit.max_concurrency,
                waiting=sum(by_user.values()),
                throttled=sum(lane.waiting for lane in mine if lane.why_key == key),
                waiting_by_user=dict(sorted(by_user.items())),
                running=view.running,
                rate_per_s=round(admitted / RATE_WINDOW_S, 2),
                paused_until=view.paused_until,
                paused_why=view.paused_why,
            )
        )
    return rows


def read_queues(
    r: redis.Redis,
    book: PresenceBook,
    parked: ParkedWork,
    pools: Collection[str],
    limits: Sequence[AppliedLimit] = (),
    user_cap: int | None = None,
) -> QueuesReport:
    """The report as Redis and the store have it now: a few pipelined reads, no scan of any queue.
    ``pools``: the named pools to show (the default pool is always shown); ``limits``: those
    written (the gate's lanes and budgets are read for them)."""
    names = pool_names(pools)
    pipe = r.pipeline(transaction=False)
    lists = [queue_keys(pool_queue(name)) for name in names]  # each priority step's
    for key in (key for keys in lists for key in keys):
        pipe.llen(key)
    replies = iter(pipe.execute())
    lengths = [sum(next(replies) for _ in keys) for keys in lists]
    gate = Gate(r)
    lanes = gate.lanes_view()
    at_gate: dict[str, int] = {}
    for lane in lanes:
        at_gate[lane.pool] = at_gate.get(lane.pool, 0) + lane.waiting
    pool_rows = [
        PoolQueue(
            pool=name,
            queue=pool_queue(name),
            waiting=int(n),
            workers=live_pool_workers(r, name),
            throttled=at_gate.get(name, 0),
        )
        for name, n in zip(names, lengths, strict=True)
    ]
    if user_cap is not None:
        limits = [*limits, *user_caps(lanes, user_cap)]
    keys, now = gate.keys_view([*(limit.key for limit in limits), *gate.pauses()])
    limit_rows = limit_queues(limits, lanes, keys, now)
    enrolled = book.enrolled()
    sessions = book.sessions()
    waiting = parked.waiting()
    ids = sorted(enrolled)
    pipe = r.pipeline(transaction=False)
    for cid in ids:
        pipe.llen(client_key(cid, client_queue(cid)))
        pipe.hlen(client_key(cid, KOMBU_UNACKED))
    # A client may have turned its queue or unacked hash into another type: its own row says
    # so, every other row is read as usual.
    counts = pipe.execute(raise_on_error=False)
    marks = MisbehavingBook(r).all()
    client_rows = []
    for i, cid in enumerate(ids):
        queued, taken = counts[2 * i], counts[2 * i + 1]
        mark = marks.get(cid)
        unreadable = [
            cause.detail
            for name, reply in (("queue", queued), ("unacked hash", taken))
            if (cause := reply_cause(name, typed_keys(cid)[name][0], [reply])) is not None
        ]
        # The mark, once the brain has found it; until then what this read found.
        why = mark.shown() if mark else "; ".join(unreadable) or None
        client_rows.append(
            ClientQueue(
                client_id=cid,
                user=enrolled[cid].user,
                connected=cid in sessions,
                queue=client_queue(cid),
                waiting=queued if isinstance(queued, int) else 0,
                taken=taken if isinstance(taken, int) else 0,
                parked=waiting.get(f"client:{cid}", 0),
                misbehaving=why,
            )
        )
    users = user_queues(waiting, {cid: s.user for cid, s in sessions.items()})
    return QueuesReport(pools=pool_rows, clients=client_rows, users=users, limits=limit_rows)


def queues_report(settings: Settings, redis_url: str) -> QueuesReport:
    """Read the report from the stack at ``redis_url``: the pools the brain routes to (its
    registry snapshot) and those configured here. Raises StackNotRunning when Redis refuses."""
    hot = HotState.from_url(redis_url)
    store = open_store(settings.store)
    try:
        snapshot = hot.get_registry() or {}
        pools = [*snapshot.get("pools", []), *(p.name for p in settings.pools)]
        registry = RegistrySnapshot.model_validate(snapshot)
        limits = written_limits(registry.tools.values(), registry.server_limits, registry.pool_limits)
        return read_queues(
            hot.r,
            PresenceBook(hot.r, store),
            ParkedWork(hot.r),
            pools,
            limits,
            user_cap=settings.max_in_flight_per_user if settings.queue_window else None,
        )
    except redis.RedisError as exc:
        raise unreachable(redis_url, exc) from exc
    finally:
        store.close()
        hot.close()
