"""The agent's outbox writes: a big result gets a socket timeout that lets it cross a slow link."""

from __future__ import annotations

import redis

from client_agent.channel import BULK_BYTES, AgentChannel, bulk_timeout_s
from workers.contracts import CLIENT_OUTBOX, ClientToolResult, ToolResult, client_key, key_deliveries

CID = "laptop"


def test_the_timeout_of_a_big_write_lets_it_cross_a_128_kbit_link() -> None:
    assert bulk_timeout_s(0) == 10.0
    # 1 MB at 128 kbit/s (16 kB/s) takes 62.5 s; at 256 kbit/s half that.
    assert bulk_timeout_s(1_000_000) >= 1_000_000 / 16_000 + 10


def test_a_big_message_reaches_the_outbox_through_a_connection_of_its_own(redis_url: str) -> None:
    r = redis.Redis.from_url(redis_url)
    channel = AgentChannel(r, CID, broker_url=redis_url)
    before = r.info("stats")["total_connections_received"]
    channel.send(result("r1", "x" * (2 * BULK_BYTES)))
    channel.send(result("r2", "small"))
    assert r.llen(client_key(CID, CLIENT_OUTBOX)) == 2
    # the big one opened (and closed) a connection of its own; the small one used the channel's
    assert r.info("stats")["total_connections_received"] - before == 1


def result(run_id: str, value: str) -> ClientToolResult:
    done = ToolResult(
        run_id=run_id,
        tree_id="t",
        task_id="k",
        tool="read_local_file",
        ok=True,
        value=value,
        started_at=1.0,
        finished_at=2.0,
        client_id=CID,
    )
    return ClientToolResult(client_id=CID, result=done)


def test_a_heartbeat_says_the_round_trip_and_reads_the_ack_in_one_round_trip(redis_url: str) -> None:
    from brain.hot.presence import _round_trip
    from workers.contracts import CLIENT_HEARTBEAT, CLIENT_ROUND_TRIP

    r = redis.Redis.from_url(redis_url)
    channel = AgentChannel(r, CID)
    beat = channel.beat("s1", 5, round_trip_ms=212.34)
    assert beat.ack is None and beat.round_trip_s >= 0
    assert r.get(client_key(CID, CLIENT_HEARTBEAT)) == b"s1"
    assert r.get(client_key(CID, CLIENT_ROUND_TRIP)) == b"212.3"
    assert 0 < r.pttl(client_key(CID, CLIENT_ROUND_TRIP)) <= 5000
    # what the brain makes of what a client wrote there: a number, or nothing
    assert [_round_trip(v) for v in (b"212.3", b"", b"nan?", b"-1", None, ValueError())] == [
        212.3, None, None, None, None, None,
    ]  # fmt: skip


def test_a_result_shortens_its_runs_delivery_counter_in_the_same_round_trip(redis_url: str) -> None:
    # A busy workstation's counters (a key per call, 7 days each) piled up against its quota.
    r = redis.Redis.from_url(redis_url)
    channel = AgentChannel(r, CID, broker_url=redis_url)
    queued = r.llen(client_key(CID, CLIENT_OUTBOX))
    for run, value in (("r1", "small"), ("r2", "x" * (2 * BULK_BYTES))):  # both ways out
        counter = client_key(CID, key_deliveries(run))
        r.set(counter, 1, ex=7 * 24 * 3600)
        channel.send(result(run, value), expire=(key_deliveries(run), 3600))
        assert 3500 < r.ttl(counter) <= 3600
    channel.send(result("r3", "small"), expire=(key_deliveries("r3"), 3600))  # none: nothing made
    assert not r.exists(client_key(CID, key_deliveries("r3")))
    assert r.llen(client_key(CID, CLIENT_OUTBOX)) == queued + 3
