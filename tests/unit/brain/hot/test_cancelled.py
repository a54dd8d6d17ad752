"""brain.hot.cancelled on a real redis-server: the cancelled sets keep a run as long as a
worker may still meet it, then the reconciler takes it out, so they no longer grow for ever
(a client's counts against its quota)."""

from __future__ import annotations

import json
import time

import pytest
import redis

from brain.hot.cancelled import (
    BATCH_PREFIX,
    INDEX_KEY,
    TRIM_CHUNK,
    cancelled_set,
    index_entry,
    parse_entry,
    split_due,
    trim,
)
from brain.hot.client_quota import measure_client_usage
from brain.hot.state import HotState
from tests.unit.brain.runtime.rig import kombu_message
from workers.contracts import KOMBU_UNACKED, client_key, client_queue, stop_member

DAY = 86_400.0


def age(r: redis.Redis, seconds: float) -> None:
    """Every index entry added ``seconds`` earlier than it was: time passed."""
    for entry in r.zrange(INDEX_KEY, 0, -1):
        r.zincrby(INDEX_KEY, -seconds, entry)


def batched(r: redis.Redis) -> set[tuple[str | None, str]]:
    """(client id, member) of every member in a batch the trim will look at."""
    found: set[tuple[str | None, str]] = set()
    for entry in r.zrange(INDEX_KEY, 0, -1):
        client_id, batch_id = parse_entry(entry)
        found |= {(client_id, m.decode()) for m in r.lrange(BATCH_PREFIX + batch_id, 0, -1)}
    return found


def members(r: redis.Redis, client_id: str | None = None) -> set[str]:
    return {m.decode() for m in r.smembers(cancelled_set(client_id))}


def nothing_held(client_id: str) -> set[str] | None:
    return set()


# --- which members go, table ---------------------------------------------------------------------

HELD = {"laptop": {"run-held"}, "broken": None}


@pytest.mark.parametrize(
    ("client_id", "member", "taken_out"),
    [
        # A server run: the store refuses to begin a run it no longer has in flight.
        (None, "run-a", True),
        (None, stop_member("run-a"), True),
        # A client's run its keys no longer hold: no message of it can reach the agent.
        ("laptop", "run-gone", True),
        ("laptop", stop_member("run-gone"), True),
        # Its message still in the client's queue, unacked hash or outbox: kept.
        ("laptop", "run-held", False),
        ("laptop", stop_member("run-held"), False),
        # Keys that cannot be read: kept, looked at again later.
        ("broken", "run-x", False),
    ],
)
def test_a_member_past_its_time_is_taken_out_unless_its_client_still_holds_the_run(
    client_id: str | None, member: str, taken_out: bool
) -> None:
    drop, keep = split_due(client_id, [member], HELD.__getitem__)
    assert (drop, keep) == (([member], []) if taken_out else ([], [member]))


def test_an_index_entry_names_its_set_and_batch() -> None:
    for client_id, batch in [(None, "0a1b"), ("laptop-7", "ffee")]:
        assert parse_entry(index_entry(client_id, batch).encode()) == (client_id, batch)


# --- the trim, on Redis ---------------------------------------------------------------------------


def test_runs_cancelled_longer_ago_than_kept_are_taken_out_and_the_rest_stay(
    redis_client: redis.Redis,
) -> None:
    hot = HotState(redis_client)
    hot.cancel_runs(["old-a", "old-b"], stop=["old-b"])
    hot.cancel_runs(["c-held", "c-gone"], "laptop", unqueue=False, stop=["c-held", "c-gone"])
    # The agent still has c-held reserved (a laptop asleep with the call in kombu's unacked hash).
    redis_client.hset(
        client_key("laptop", KOMBU_UNACKED),
        "tag1",
        json.dumps([json.loads(kombu_message("c-held")), "", client_queue("laptop")]),
    )
    age(redis_client, 2 * DAY)
    hot.cancel_runs(["new-a"], stop=["new-a"])
    hot.cancel_runs(["c-new"], "laptop", unqueue=False)

    held = lambda cid: hot.message_ids_held([client_queue(cid)], client_id=cid)
    done = trim(redis_client, now=time.time(), kept_s=DAY, held=held)

    assert (done.removed, done.kept) == (5, 2)
    assert members(redis_client) == {"new-a", stop_member("new-a")}
    assert members(redis_client, "laptop") == {"c-held", stop_member("c-held"), "c-new"}
    assert batched(redis_client) == {
        (None, "new-a"),
        (None, stop_member("new-a")),
        ("laptop", "c-held"),
        ("laptop", stop_member("c-held")),
        ("laptop", "c-new"),
    }

    # The run it kept is looked at again only after another kept_s, then taken out once its
    # message is gone.
    assert trim(redis_client, now=time.time(), kept_s=DAY, held=held).removed == 0
    redis_client.delete(client_key("laptop", KOMBU_UNACKED))
    age(redis_client, 2 * DAY)
    assert trim(redis_client, now=time.time(), kept_s=DAY, held=held).removed == 5
    assert redis_client.exists(cancelled_set(None), cancelled_set("laptop"), INDEX_KEY) == 0
    assert redis_client.keys(BATCH_PREFIX + "*") == []


def test_what_the_trim_takes_out_no_longer_counts_against_the_clients_quota(
    redis_client: redis.Redis,
) -> None:
    hot = HotState(redis_client)
    runs = [f"night-batch.task-{i}.1.{i:012x}" for i in range(5000)]
    hot.cancel_runs(runs, "laptop", unqueue=False, stop=runs)
    before = measure_client_usage(redis_client)["laptop"]
    assert before > 500_000  # 10,000 members of ~40 bytes: what a cancelled batch left behind
    age(redis_client, 2 * DAY)

    done = trim(redis_client, now=time.time(), kept_s=DAY, held=nothing_held)

    assert done.removed == 10_000 > TRIM_CHUNK  # several chunks and batches in one trim
    assert measure_client_usage(redis_client).get("laptop", 0) == 0


def test_a_client_that_replaced_its_cancelled_set_stops_no_one_elses_trim(redis_client: redis.Redis) -> None:
    hot = HotState(redis_client)
    hot.cancel_runs(["mine"], "mallory", unqueue=False)
    hot.cancel_runs(["theirs"], "laptop", unqueue=False)
    hot.cancel_runs(["server-run"])
    redis_client.delete(cancelled_set("mallory"))
    redis_client.set(cancelled_set("mallory"), b"not a set")
    age(redis_client, 2 * DAY)

    done = trim(redis_client, now=time.time(), kept_s=DAY, held=nothing_held)

    assert done.removed == 3
    assert members(redis_client, "laptop") == members(redis_client) == set()
    assert redis_client.get(cancelled_set("mallory")) == b"not a set"
    assert redis_client.zcard(INDEX_KEY) == 0
