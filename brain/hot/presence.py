"""Who is connected, with which tools (layer: brain/hot; Redis glue).

Enrolled clients (the store's record: clients cannot write it, and it survives a Redis
flush) are the only ones the brain listens to; a client's
announcement is checked here (``check_announcement``, pure) and, once accepted,
kept in ``vt:presence`` until a graceful disconnect or a missed heartbeat.
"""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Iterable, Mapping
from typing import cast

import redis
from pydantic import ValidationError

from brain.core.models import Enrollment, ToolSpec
from brain.core.routing import ClientView, Presence
from brain.core.sessions import ClientSession
from brain.hot.client_keys import KeyReading, read_client_keys
from brain.hot.state import as_text, is_wrong_type
from brain.hot.toolpins import ToolPins
from brain.store import Store
from workers.contracts import (
    CLIENT_ROUND_TRIP,
    KOMBU_UNACKED,
    MAX_ROUND_TRIP_BYTES,
    ClientConnected,
    client_key,
    client_queue,
    key_last_seen,
    key_presence,
    key_user_clients,
)
from workers.scripts import lua

log = logging.getLogger("vancetope.brain")

# How often the heartbeat sweep checks the type of each connected client's keys (``inspect``).
# The check is there for a client that turns its own queue, outbox, unacked hash or cancelled
# set into another type: every read of those keys already survives that (each reply is checked
# on its own), so this check only makes the brain suspend it sooner. Its heartbeat is read at
# every sweep; five TYPEs per client per sweep were most of the sweep's commands.
TYPES_EVERY_S = 10.0
# How often the heartbeat sweep puts a connected client in its user's index again (``index``):
# a connect puts it there; this repairs an index written by an older brain, or lost.
INDEX_AGAIN_S = 30.0


class PresenceBook:
    """Who may connect (the store's enrollments) and who is connected (sessions in Redis)."""

    def __init__(self, r: redis.Redis, store: Store) -> None:
        self.r = r
        self.store = store
        # Each client's session as last read and parsed: routing a client's call reads them
        # all, and an announcement (with its tools' schemas) changes far less often than that.
        self._parsed: dict[str, tuple[bytes | str, ClientSession]] = {}
        self._bad: dict[str, bytes | str] = {}
        # Client id -> (session id, when this brain last put it in its user's index): ``index``.
        self._indexed: dict[str, tuple[str, float]] = {}
        # Per client, the TYPES_EVERY_S period in which its keys' types were last checked.
        self._types_checked: dict[str, int] = {}

    # enrollment ---------------------------------------------------------------------
    def enroll(
        self, client_id: str, user: str, now: float | None = None, secret_sha256: str = ""
    ) -> Enrollment:
        """Record that ``client_id`` belongs to ``user`` (re-enrolling replaces the record)."""
        client_key(client_id, "")  # validates the id
        enrollment = Enrollment(
            client_id=client_id, user=user, enrolled_at=now or time.time(), secret_sha256=secret_sha256
        )
        self.store.put_enrollment(enrollment)
        return enrollment

    def enrolled(self) -> dict[str, Enrollment]:
        return {e.client_id: e for e in self.store.list_enrollments()}

    def enrollment(self, client_id: str) -> Enrollment | None:
        return self.store.get_enrollment(client_id)

    # sessions -------------------------------------------------------------------------
    def connect(self, msg: ClientConnected, enrollment: Enrollment, now: float) -> ClientSession:
        pinned = ToolPins(self.r).check(msg.client_id, msg.available_tools)
        session = ClientSession(
            client_id=msg.client_id,
            user=enrollment.user,
            session_id=msg.session_id,
            client_type=msg.client_type,
            tools=pinned.accepted,
            connected_at=now,
            held_tools=pinned.held,
        )
        # The session and its place in its user's index, in one MULTI: a reader of the index
        # never finds the one without the other (``sessions_for``).
        pipe = self.r.pipeline(transaction=True)
        pipe.hset(key_presence(), msg.client_id, session.model_dump_json())
        pipe.sadd(key_user_clients(session.user), msg.client_id)
        written = pipe.execute(raise_on_error=False)[0]
        if isinstance(written, redis.ResponseError):
            if not is_wrong_type(written):
                raise written
            self._replace_wrong_type(msg.client_id, session)
        self._indexed[msg.client_id] = (session.session_id, time.monotonic())
        return session

    def _replace_wrong_type(self, client_id: str, session: ClientSession) -> None:
        """Delete a presence key that is not a hash. The gateway may reach the key (Redis 6.2 has
        no read-only key patterns) and could create it as a list while no client is connected, so
        that every session write failed; a key that is no hash holds no session, so nothing is
        lost. Delete and write happen in one MULTI: a hash with a field cannot be made a list."""
        log.error("%s was not a hash (another party wrote it): replaced by the sessions", key_presence())
        pipe = self.r.pipeline(transaction=True)
        pipe.delete(key_presence())
        pipe.hset(key_presence(), client_id, session.model_dump_json())
        pipe.sadd(key_user_clients(session.user), client_id)
        pipe.execute()

    def disconnect(
        self, client_id: str, session_id: str | None = None, now: float | None = None
    ) -> ClientSession | None:
        """Forget a client's session (only that session, when ``session_id`` is given), and
        record when it was last seen. The session forgotten, or None when there was none or
        another brain forgot it first: only one caller gets it, so one takes its calls back."""
        raw = self._raw_session(client_id)
        current = self._session_of(raw)
        if raw is None or current is None or (session_id is not None and current.session_id != session_id):
            return None
        seen = repr(time.time() if now is None else now)
        forgot = self.r.eval(
            lua("brain.hot", "forget_session"),
            3,
            key_presence(),
            key_last_seen(),
            key_user_clients(current.user),
            client_id,
            raw,
            seen,
        )
        return current if forgot else None

    def last_seen(self) -> dict[str, float]:
        """Client id -> when its last session ended (those recorded since this was added)."""
        seen: dict[str, float] = {}
        for k, v in self._hash(key_last_seen()).items():
            try:
                seen[as_text(k)] = float(v)
            except ValueError:
                continue  # the brain writes these; a value that is no number says nothing
        return seen

    def session(self, client_id: str) -> ClientSession | None:
        raw = self._raw_session(client_id)
        if raw is None:
            return None
        try:
            return self._parse(client_id, raw)  # the same bytes as last time: parsed then
        except ValidationError:
            return None  # as in ``sessions``: an entry that does not parse is no session

    def _raw_session(self, client_id: str) -> bytes | str | None:
        try:
            raw = self.r.hget(key_presence(), client_id)
        except redis.ResponseError as exc:
            if not is_wrong_type(exc):
                raise
            return None  # no hash, no session (``connect`` replaces the key)
        return raw if isinstance(raw, bytes | str) and raw else None

    @staticmethod
    def _session_of(raw: bytes | str | None) -> ClientSession | None:
        if raw is None:
            return None
        try:
            return ClientSession.model_validate_json(raw)
        except ValidationError:
            return None  # as in ``sessions``: an entry that does not parse is no session

    def sessions(self) -> dict[str, ClientSession]:
        raw = self._hash(key_presence())  # no hash, no session (``connect`` replaces the key)
        sessions: dict[str, ClientSession] = {}
        for k, v in raw.items():
            cid = as_text(k)
            try:
                sessions[cid] = self._parse(cid, v)
            except ValidationError:
                # The brain writes these; one that does not parse must not hide every other
                # client. Logged once per entry (the cache of bad ones).
                if self._bad.get(cid) != v:
                    log.error("ignoring client %r's session in %s: not a session", cid, key_presence())
                    self._bad[cid] = v
        parsed = self._parsed
        if len(parsed) > len(sessions):  # clients gone: their sessions go from the cache too
            self._parsed = {cid: parsed[cid] for cid in sessions if cid in parsed}
        return sessions

    def sessions_for(self, user: str | None, client_id: str | None = None) -> dict[str, ClientSession]:
        """The sessions ``view`` may show for a tree of ``user`` (None: nobody's) bound to
        ``client_id``: that user's clients and that one client, read through the user's index
        (``key_user_clients``) in one round trip, not every connected client's session."""
        if not user and not client_id:
            return {}
        reply = self.r.eval(
            lua("brain.hot", "user_sessions"),
            2,
            key_presence(),
            key_user_clients(user or ""),
            client_id or "",
        )
        found = cast(list[bytes | None], reply)
        sessions: dict[str, ClientSession] = {}
        for i in range(0, len(found), 2):
            cid, raw = as_text(cast(bytes, found[i])), found[i + 1]
            if not raw:
                continue
            try:
                session = self._parse(cid, raw)
            except ValidationError:
                continue  # as in ``sessions``: an entry that does not parse is no session
            # An id can stay in the index of a user its client no longer belongs to (re-enrolled
            # while connected) until that session ends: the session says whose it is.
            if cid == client_id or session.user == user:
                sessions[cid] = session
        return sessions

    def index(self, sessions: Mapping[str, ClientSession], now: float | None = None) -> int:
        """Put each of ``sessions`` in its user's index (sessions announced through a brain
        older than the index, or an index Redis lost): those this brain has not put there in
        the last ``INDEX_AGAIN_S``, all in one pipeline. How many were not there."""
        at = time.monotonic() if now is None else now
        indexed = self._indexed
        due = [
            s
            for cid, s in sessions.items()
            if (seen := indexed.get(cid)) is None or seen[0] != s.session_id or at - seen[1] > INDEX_AGAIN_S
        ]
        added = 0
        if due:
            pipe = self.r.pipeline(transaction=False)
            for s in due:
                pipe.sadd(key_user_clients(s.user), s.client_id)
            added = sum(int(n) for n in pipe.execute())
            for s in due:
                indexed[s.client_id] = (s.session_id, at)
        if len(indexed) > len(sessions):  # clients gone
            self._indexed = {cid: indexed[cid] for cid in sessions if cid in indexed}
        return added

    def _hash(self, key: str) -> dict[bytes, bytes]:
        """A hash's fields, or none when another party made the key something else."""
        try:
            return cast(dict[bytes, bytes], self.r.hgetall(key))
        except redis.ResponseError as exc:
            if not is_wrong_type(exc):
                raise
            return {}

    def _parse(self, client_id: str, raw: bytes | str) -> ClientSession:
        """``raw`` parsed, or the session parsed from the very same bytes last time."""
        cached = self._parsed.get(client_id)
        if cached is not None and cached[0] == raw:
            return cached[1]
        session = ClientSession.model_validate_json(raw)
        self._parsed[client_id] = (raw, session)
        return session

    def inspect(self, now: float | None = None) -> dict[str, tuple[ClientSession, KeyReading]]:
        """Each connected client's session with its heartbeat and the health of its keys
        (brain.hot.client_keys): one round trip, and no client's key can make it raise. The
        types of a client's keys are checked when it is first seen, then once every
        ``TYPES_EVERY_S`` (``now``: ``time.monotonic()`` by default), each client at a phase of
        its own so that the checks are spread over the period, not all in one sweep."""
        sessions = self.sessions()
        at = time.monotonic() if now is None else now
        due: list[str] = []
        periods: dict[str, int] = {}
        for cid in sessions:
            period = periods[cid] = int((at + _phase(cid)) // TYPES_EVERY_S)
            if self._types_checked.get(cid) != period:
                due.append(cid)
        readings = read_client_keys(self.r, sessions, typed=due)
        checked = self._types_checked
        for cid in due:
            checked[cid] = periods[cid]
        if len(checked) > len(sessions):  # clients gone
            self._types_checked = {cid: checked[cid] for cid in sessions if cid in checked}
        return {cid: (s, readings[cid]) for cid, s in sessions.items()}

    def silent(self) -> list[ClientSession]:
        """Connected clients whose heartbeat key expired or belongs to another session (a
        heartbeat that cannot be read counts as none)."""
        return [s for s, reading in self.inspect().values() if reading.beat.session_id != s.session_id]

    def view(
        self,
        user: str | None,
        session_client: str | None,
        sessions: Mapping[str, ClientSession] | None = None,
        registry: Mapping[str, ToolSpec] | None = None,
    ) -> Presence:
        """The router's view for one session, of ``sessions`` (default: read now); the load of
        each client it may choose among is read now. With the ``registry``, a client's MCP tool
        whose bare name the registry gives to another tool is offered under
        ``<server>.<tool>`` only (``ClientSession.tool_names``).

        The view holds only the clients the router may look at (brain.core.routing): the
        session's own client and the clients of ``user``. Every other client's view was built for
        nothing, and with 1,000 clients reconnecting at once, each requeued task built all 1,000
        (a storm was O(N²) in ``tool_names``)."""
        every = self.sessions() if sessions is None else sessions
        seen = [
            s
            for s in every.values()
            if s.client_id == session_client or (user is not None and s.user == user)
        ]
        # Load only chooses among several clients of the user (the session's own client is
        # taken first whatever its load): with fewer, it is not worth a round trip.
        same_user = [s.client_id for s in seen if user and s.user == user]
        loads = self.loads(same_user) if len(same_user) > 1 else {}
        clients = tuple(
            ClientView(
                client_id=s.client_id,
                user=s.user,
                tools=s.tool_names(registry),
                load=loads.get(s.client_id, 0),
            )
            for s in seen
        )
        return Presence(session_client=session_client, user=user, clients=clients)

    def round_trips(self, client_ids: Iterable[str]) -> dict[str, float | None]:
        """Each client's round trip to Redis in ms, as its agent last measured it (None: not
        said, or an older agent): one round trip for all of them."""
        ids = list(client_ids)
        pipe = self.r.pipeline(transaction=False)
        for cid in ids:
            pipe.getrange(client_key(cid, CLIENT_ROUND_TRIP), 0, MAX_ROUND_TRIP_BYTES - 1)
        replies = pipe.execute(raise_on_error=False) if ids else []
        return {cid: _round_trip(reply) for cid, reply in zip(ids, replies)}

    def loads(self, client_ids: list[str]) -> dict[str, int]:
        """Calls waiting in each client's queue plus those it has taken and not yet acked
        (kombu's unacked hash under its prefix): one round trip for all of them."""
        if not client_ids:
            return {}
        pipe = self.r.pipeline(transaction=False)
        for cid in client_ids:
            pipe.llen(client_key(cid, client_queue(cid)))
            pipe.hlen(client_key(cid, KOMBU_UNACKED))
        counts = pipe.execute(raise_on_error=False)
        return {cid: _load(counts[2 * i], counts[2 * i + 1]) for i, cid in enumerate(client_ids)}


# The load of a client whose queue or unacked hash cannot be read (its agent changed their
# type): chosen last. The heartbeat sweep suspends it (brain.runtime.clientwork).
UNREADABLE_LOAD = 1 << 30


def _phase(client_id: str) -> float:
    """Where in each ``TYPES_EVERY_S`` period ``client_id``'s types are checked (stable)."""
    return (zlib.crc32(client_id.encode()) % 1000) / 1000 * TYPES_EVERY_S


def _round_trip(reply: object) -> float | None:
    """A client's ``rtt`` key (``GETRANGE`` bounded: the client wrote it), in ms, or None when
    absent or not a plausible number."""
    if isinstance(reply, Exception) or not isinstance(reply, bytes | str) or not reply:
        return None
    try:
        ms = float(reply)
    except ValueError:
        return None
    return ms if 0 <= ms < 3_600_000 else None


def _load(queued: object, taken: object) -> int:
    if not isinstance(queued, int) or not isinstance(taken, int):
        return UNREADABLE_LOAD
    return queued + taken
