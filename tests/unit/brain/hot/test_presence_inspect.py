"""brain.hot.presence.PresenceBook.inspect on a real redis-server: each connected client's
heartbeat is read at every sweep, the types of its keys only once per ``TYPES_EVERY_S`` (they
were five TYPE commands per client per sweep, most of what 1,000 idle clients cost the brain),
and a key a client turned into another type is still found within that period."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from brain.hot.presence import TYPES_EVERY_S, PresenceBook
from brain.store.sqlite import SQLiteStore
from tests.redis_commands import command_counts, reset_counts
from workers.contracts import (
    CLIENT_HEARTBEAT,
    ClientConnected,
    ClientType,
    ToolDescriptor,
    ToolType,
    client_key,
    client_queue,
)

CLIENTS = 40
TYPED_KEYS = 5  # brain.core.client_health.typed_keys


@pytest.fixture
def book(tmp_path: Path, redis_client: redis.Redis) -> PresenceBook:
    book = PresenceBook(redis_client, SQLiteStore(tmp_path / "store.db"))
    for i in range(CLIENTS):
        cid = f"c{i:03d}"
        enrollment = book.enroll(cid, f"user-{i}")
        msg = ClientConnected(
            client_id=cid,
            session_id=f"s-{cid}",
            client_type=ClientType.CLI,
            available_tools=[ToolDescriptor(name="read_local_file", type=ToolType.NATIVE)],
            sent_at=0.0,
        )
        book.connect(msg, enrollment, 0.0)
        redis_client.set(client_key(cid, CLIENT_HEARTBEAT), f"s-{cid}")
    return book


def test_heartbeats_are_read_every_sweep_and_key_types_once_per_period(
    book: PresenceBook, redis_client: redis.Redis
) -> None:
    sweeps = int(2 * TYPES_EVERY_S)  # one a second for two periods, as the relay sweeps
    reset_counts(redis_client)
    for second in range(sweeps):
        seen = book.inspect(now=1_000.0 + second)
        assert {cid for cid, (s, reading) in seen.items() if reading.beat.session_id == s.session_id} == {
            f"c{i:03d}" for i in range(CLIENTS)
        }
    counts = command_counts(redis_client)
    assert counts["strlen"] == counts["getrange"] == sweeps * CLIENTS
    # Each client: once when first seen, then once in each period it enters (two at most here);
    # at every sweep it was 20 x 5 x 40 = 4,000.
    assert counts["type"] <= 3 * TYPED_KEYS * CLIENTS
    assert counts["type"] >= 2 * TYPED_KEYS * CLIENTS  # checked again, not only once


def test_a_key_turned_into_another_type_is_found_within_one_period(
    book: PresenceBook, redis_client: redis.Redis
) -> None:
    start = 1_000.0
    assert not any(reading.causes for _, reading in book.inspect(now=start).values())
    redis_client.set(client_key("c007", client_queue("c007")), "not a list")
    found_at = None
    for tenth in range(1, int(10 * TYPES_EVERY_S) + 1):
        now = start + tenth / 10
        causes = book.inspect(now=now)["c007"][1].causes
        if causes:
            found_at = now
            assert [c.kind for c in causes] == ["queue type"]
            assert "is a string, not a list" in causes[0].detail
            break
    assert found_at is not None and found_at - start <= TYPES_EVERY_S
