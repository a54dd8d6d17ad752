"""Routing a tree reads the sessions of its user's clients only, through the user's index
(``PresenceBook.sessions_for``, brain/hot/lua/user_sessions.lua), not every connected client's:
with 1,000 clients connected, reading them all cost a brain ~5 ms of CPU per tree step. The
index is kept with the sessions (a connect writes both in one MULTI, a disconnect drops both
in one script) and repaired by the heartbeat sweep (``index``). Real redis-server."""

from __future__ import annotations

from pathlib import Path

import redis

from brain.core.models import Enrollment
from brain.core.sessions import ClientSession
from brain.hot.presence import INDEX_AGAIN_S, PresenceBook
from brain.store.sqlite import SQLiteStore
from workers.contracts import ClientConnected, ClientType, key_presence, key_user_clients


def announce(book: PresenceBook, enrollment: Enrollment, session_id: str = "s1") -> None:
    msg = ClientConnected(
        client_id=enrollment.client_id,
        session_id=session_id,
        client_type=ClientType.CLI,
        available_tools=[],
        sent_at=0.0,
    )
    book.connect(msg, enrollment, 0.0)


def hgetalls(r: redis.Redis) -> int:
    return int(r.info("commandstats").get("cmdstat_hgetall", {}).get("calls", 0))


def test_a_users_sessions_are_read_without_reading_every_clients(
    tmp_path: Path, redis_client: redis.Redis
) -> None:
    book = PresenceBook(redis_client, SQLiteStore(tmp_path / "store.db"))
    for i in range(50):
        announce(book, book.enroll(f"other-{i}", f"user-{i}"))
    for cid in ("laptop", "desk"):
        announce(book, book.enroll(cid, "ada"))
    before = hgetalls(redis_client)
    assert set(book.sessions_for("ada")) == {"laptop", "desk"}
    # A tree bound to a client of someone else (an admin's run --client) sees that client too.
    assert set(book.sessions_for("ada", "other-7")) == {"laptop", "desk", "other-7"}
    assert set(book.sessions_for(None, "other-7")) == {"other-7"}
    assert book.sessions_for("nobody") == {}
    assert book.sessions_for(None) == {}
    assert hgetalls(redis_client) == before


def test_a_client_that_goes_away_leaves_its_users_index(tmp_path: Path, redis_client: redis.Redis) -> None:
    book = PresenceBook(redis_client, SQLiteStore(tmp_path / "store.db"))
    announce(book, book.enroll("laptop", "ada"))
    announce(book, book.enroll("desk", "ada"))
    assert book.disconnect("laptop", "s1") is not None
    assert set(book.sessions_for("ada")) == {"desk"}
    assert redis_client.smembers(key_user_clients("ada")) == {b"desk"}
    # A session that vanished some other way (an older brain forgot it): dropped from the index
    # by the read that found it gone.
    redis_client.hdel(key_presence(), "desk")
    assert book.sessions_for("ada") == {}
    assert redis_client.exists(key_user_clients("ada")) == 0


def test_a_session_written_without_its_index_entry_is_found_after_a_sweep_indexes_it(
    tmp_path: Path, redis_client: redis.Redis
) -> None:
    # Announced through a brain older than the index (or an index Redis lost): the session is
    # there, its index entry is not, so routing would not see it until the sweep puts it there.
    book = PresenceBook(redis_client, SQLiteStore(tmp_path / "store.db"))
    announce(book, book.enroll("laptop", "ada"))
    redis_client.delete(key_user_clients("ada"))
    assert book.sessions_for("ada") == {}
    sweeping = PresenceBook(redis_client, SQLiteStore(tmp_path / "store.db"))  # another brain
    assert sweeping.index(sweeping.sessions(), now=100.0) == 1
    assert set(book.sessions_for("ada")) == {"laptop"}
    # The brain that announced it puts it there again too, once INDEX_AGAIN_S has passed.
    redis_client.delete(key_user_clients("ada"))
    assert book.index(book.sessions(), now=100.0 + INDEX_AGAIN_S + 1e6) == 1
    assert book.index(book.sessions(), now=100.0 + INDEX_AGAIN_S + 1e6) == 0, "not again at once"
    assert set(book.sessions_for("ada")) == {"laptop"}


def test_a_client_re_enrolled_to_another_user_is_shown_as_the_new_users_only(
    tmp_path: Path, redis_client: redis.Redis
) -> None:
    book = PresenceBook(redis_client, SQLiteStore(tmp_path / "store.db"))
    announce(book, book.enroll("laptop", "ada"))
    announce(book, book.enroll("laptop", "bob"), session_id="s2")  # re-enrolled, reconnected
    assert book.sessions_for("ada") == {}
    assert set(book.sessions_for("bob")) == {"laptop"}


def test_a_presence_key_another_party_made_a_list_reads_as_no_sessions(
    tmp_path: Path, redis_client: redis.Redis
) -> None:
    book = PresenceBook(redis_client, SQLiteStore(tmp_path / "store.db"))
    redis_client.sadd(key_user_clients("ada"), "laptop")
    redis_client.rpush(key_presence(), "x")
    assert book.sessions_for("ada") == {}
    announce(book, book.enroll("laptop", "ada"))  # a connect replaces the key
    assert set(book.sessions_for("ada")) == {"laptop"}


def test_a_user_with_more_clients_than_lua_can_unpack_still_has_its_sessions_read(
    tmp_path: Path, redis_client: redis.Redis
) -> None:
    # Lua's unpack stops at ~8,000 values: one HMGET of them all failed the script, and every
    # tree of that user failed to route. 10,000 clients of one user (a fleet of runners, say).
    book = PresenceBook(redis_client, SQLiteStore(tmp_path / "store.db"))
    n = 10_000
    sessions = {
        f"r{i}": ClientSession(
            client_id=f"r{i}", user="ci", session_id="s1", client_type=ClientType.CLI, connected_at=0.0
        )
        for i in range(n)
    }
    pipe = redis_client.pipeline(transaction=False)
    pipe.hset(key_presence(), mapping={cid: s.model_dump_json() for cid, s in sessions.items()})
    pipe.sadd(key_user_clients("ci"), *sessions, "gone")
    pipe.execute()
    found = book.sessions_for("ci", "r7")
    assert set(found) == set(sessions)
    assert not redis_client.sismember(key_user_clients("ci"), "gone")  # the index is still repaired
