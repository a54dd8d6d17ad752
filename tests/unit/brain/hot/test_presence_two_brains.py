"""Two brains on one Redis see the same client's heartbeat lapse: ``PresenceBook.disconnect`` is
a compare-and-delete (brain/hot/lua/forget_session.lua), so exactly one of them forgets the
session and takes its calls back (real redis-server, two connections racing)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import redis

from brain.core.models import Enrollment
from brain.hot.presence import PresenceBook
from brain.stack.redis_server import RedisServer
from brain.store.sqlite import SQLiteStore
from workers.contracts import ClientConnected, ClientType, key_presence

ROUNDS = 100


def announce(book: PresenceBook, enrollment: Enrollment, session_id: str) -> None:
    msg = ClientConnected(
        client_id="laptop", session_id=session_id, client_type=ClientType.CLI, available_tools=[], sent_at=0.0
    )
    book.connect(msg, enrollment, 0.0)


def test_of_two_brains_racing_to_forget_one_session_exactly_one_does(
    tmp_path: Path, redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    store = SQLiteStore(tmp_path / "store.db")
    books = [PresenceBook(redis.Redis.from_url(redis_server.url), store) for _ in range(2)]
    enrollment = books[0].enroll("laptop", "ada")
    barrier = threading.Barrier(2)

    def forget(book: PresenceBook, session_id: str) -> bool:
        barrier.wait(10)
        return book.disconnect("laptop", session_id) is not None

    with ThreadPoolExecutor(2) as pool:
        for i in range(ROUNDS):
            announce(books[0], enrollment, f"s{i}")
            won = list(pool.map(forget, books, [f"s{i}"] * 2))
            assert won.count(True) == 1, f"round {i}: {won}"
    assert redis_client.hget(key_presence(), "laptop") is None
    assert "laptop" in books[1].last_seen()


def test_a_brain_that_read_the_old_session_never_forgets_the_new_one(
    tmp_path: Path, redis_client: redis.Redis
) -> None:
    book = PresenceBook(redis_client, SQLiteStore(tmp_path / "store.db"))
    enrollment = book.enroll("laptop", "ada")
    announce(book, enrollment, "old")
    announce(book, enrollment, "new")  # through another brain, after this one saw "old" lapse
    assert book.disconnect("laptop", "old") is None
    session = book.session("laptop")
    assert session is not None and session.session_id == "new"
