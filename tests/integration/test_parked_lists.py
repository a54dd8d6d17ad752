"""Parked lists in a real Redis (brain.hot.parked): order, chunked requeue, crashes and
concurrent requeues. The brain-level behaviour is in test_parking.py."""

from __future__ import annotations

import json
import threading

import pytest
import redis

from brain.hot import parked as parked_mod
from brain.hot.parked import CHUNK, ParkedRef, ParkedWork, decode_chunk, key_requeue_lock
from workers.contracts import key_parked, key_requeueing

pytestmark = pytest.mark.integration

CID = "laptop"
OWNERS = [f"client:{CID}", "user:ada"]


def ref(i: int, owner: str = "user:ada", at: float | None = None) -> ParkedRef:
    return ParkedRef(tree_id="t", task_id=f"r{i}", owner=owner, parked_at=1000.0 + i if at is None else at)


def task_ids(refs: list[ParkedRef]) -> list[str]:
    return [r.task_id for r in refs]


class Recorder:
    def __init__(self) -> None:
        self.chunks: list[list[ParkedRef]] = []

    def __call__(self, refs: list[ParkedRef]) -> None:
        self.chunks.append(list(refs))

    @property
    def ids(self) -> list[str]:
        return [r.task_id for chunk in self.chunks for r in chunk]


def test_a_ref_round_trips_compactly_and_identical_reparks_stay_distinct() -> None:
    a, b = ref(1), ref(1)
    assert a.encode() != b.encode()  # the nonce: same task, same parked_at, two refs
    assert decode_chunk(a.encode(), "user:ada") == [a]
    assert len(a.encode()) < 40
    odd = ParkedRef(tree_id="t", task_id="has space", owner="user:ada", parked_at=5.0)
    assert decode_chunk(odd.encode(), "user:ada") == [odd]  # not a single word: stored as JSON


def test_a_list_stays_in_parked_order_and_a_taken_back_task_goes_back_to_its_place(
    redis_client: redis.Redis,
) -> None:
    work = ParkedWork(redis_client)
    for i in (1, 2, 4, 5):
        work.park(ref(i))
    work.park(ref(3))  # taken back from a vanished client: keeps its old parked_at
    work.park(ref(0))
    work.park(ref(6))
    got = Recorder()
    work.requeue(CID, OWNERS, got)
    assert got.ids == ["r0", "r1", "r2", "r3", "r4", "r5", "r6"]
    assert redis_client.llen(key_parked("user:ada")) == 0


def test_a_connect_requeues_the_clients_own_list_then_its_users(redis_client: redis.Redis) -> None:
    work = ParkedWork(redis_client)
    work.park(ref(0, "user:ada"))
    work.park(ref(1, f"client:{CID}"))
    got = Recorder()
    assert work.requeue(CID, OWNERS, got) == 2
    assert got.ids == ["r1", "r0"]
    assert got.chunks[0][0].owner == f"client:{CID}"


def test_a_long_list_is_handed_out_a_chunk_at_a_time_each_dropped_only_after_it_was_placed(
    redis_client: redis.Redis,
) -> None:
    work = ParkedWork(redis_client)
    n = 2 * CHUNK + 500
    pipe = redis_client.pipeline(transaction=False)
    for i in range(n):
        pipe.rpush(key_parked("user:ada"), ref(i).encode())
    pipe.execute()
    seen_lengths: list[int] = []

    def place(refs: list[ParkedRef]) -> None:
        seen_lengths.append(int(redis_client.llen(key_parked("user:ada"))))

    assert work.requeue(CID, OWNERS, place) == n
    # while a chunk is being placed, it and everything after it are still listed
    assert seen_lengths == [n, n - CHUNK, n - 2 * CHUNK]
    assert redis_client.llen(key_parked("user:ada")) == 0


def test_a_pass_takes_only_what_was_listed_when_it_began_so_reparking_does_not_loop(
    redis_client: redis.Redis,
) -> None:
    work = ParkedWork(redis_client)
    for i in range(5):
        work.park(ref(i))
    calls = Recorder()

    def place(refs: list[ParkedRef]) -> None:
        calls(refs)
        for r in refs:  # this client cannot take them: parked again with their old parked_at
            work.park(ParkedRef(tree_id=r.tree_id, task_id=r.task_id, owner=r.owner, parked_at=r.parked_at))

    assert work.requeue(CID, OWNERS, place) == 5
    assert calls.ids == ["r0", "r1", "r2", "r3", "r4"]
    assert task_ids(decode_chunk(b"\n".join(redis_client.lrange(key_parked("user:ada"), 0, -1)))) == calls.ids


def test_a_requeue_that_fails_midway_loses_nothing_and_the_reconciler_finishes_it(
    redis_client: redis.Redis,
) -> None:
    work = ParkedWork(redis_client)
    for i in range(CHUNK + 10):
        work.park(ref(i))

    def crash_on_second_chunk(refs: list[ParkedRef]) -> None:
        if refs[0].task_id != "r0":
            raise RuntimeError("brain died")

    with pytest.raises(RuntimeError):
        work.requeue(CID, OWNERS, crash_on_second_chunk)
    # the first chunk was placed and dropped; the one being placed when it failed is still listed
    assert redis_client.llen(key_parked("user:ada")) == 10
    assert not redis_client.exists(key_requeue_lock(key_parked("user:ada")))
    assert work.requeueing_clients() == [CID]
    got = Recorder()
    assert work.requeue(CID, OWNERS, got) == 10
    assert work.requeueing_clients() == []


def test_a_crashed_holder_keeps_the_list_until_its_lock_expires(redis_client: redis.Redis) -> None:
    work = ParkedWork(redis_client)
    work.park(ref(0))
    lock = key_requeue_lock(key_parked("user:ada"))
    redis_client.set(lock, "a brain that died", px=60_000)
    redis_client.hset(parked_mod.key_requeues(), key_parked("user:ada"), CID)
    assert work.requeueing_clients() == []  # someone holds it: not the reconciler's yet
    assert work.requeue(CID, OWNERS, Recorder()) == 0
    redis_client.delete(lock)  # expired
    assert work.requeueing_clients() == [CID]
    got = Recorder()
    assert work.requeue(CID, OWNERS, got) == 1 and got.ids == ["r0"]


def test_a_requeue_asked_for_while_another_runs_becomes_one_more_pass_of_the_holder(
    redis_client: redis.Redis,
) -> None:
    work = ParkedWork(redis_client)
    work.park(ref(0))
    got = Recorder()

    def place(refs: list[ParkedRef]) -> None:
        got(refs)
        if len(got.chunks) == 1:
            work.park(ref(1))  # parked while the pass runs: behind it
            assert work.requeue("desk", ["user:ada"], Recorder()) == 0  # another client connects

    assert work.requeue(CID, OWNERS, place) == 2
    assert got.ids == ["r0", "r1"]


def test_a_holder_that_lost_its_lock_drops_nothing(redis_client: redis.Redis) -> None:
    work = ParkedWork(redis_client)
    for i in range(CHUNK + 1):
        work.park(ref(i))
    lock = key_requeue_lock(key_parked("user:ada"))

    def stall(refs: list[ParkedRef]) -> None:
        redis_client.set(lock, "the next holder", px=60_000)  # ours expired meanwhile

    assert work.requeue(CID, OWNERS, stall) == CHUNK
    assert redis_client.llen(key_parked("user:ada")) == CHUNK + 1


def test_concurrent_requeues_of_one_list_place_every_ref_and_drop_each_once(
    redis_client: redis.Redis,
) -> None:
    work = ParkedWork(redis_client)
    n = 3 * CHUNK
    for i in range(n):
        work.park(ref(i))
    placed: list[str] = []
    lock = threading.Lock()

    def place(refs: list[ParkedRef]) -> None:
        with lock:
            placed.extend(r.task_id for r in refs)

    def connect(cid: str) -> None:
        ParkedWork(redis.Redis(connection_pool=redis_client.connection_pool)).requeue(
            cid, ["user:ada"], place
        )

    threads = [threading.Thread(target=connect, args=(f"c{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(placed) == sorted(f"r{i}" for i in range(n))  # each handed out once here
    assert redis_client.llen(key_parked("user:ada")) == 0


def test_refs_left_in_the_older_requeueing_list_or_as_json_are_still_requeued(
    redis_client: redis.Redis,
) -> None:
    work = ParkedWork(redis_client)
    old = {"tree_id": "t", "task_id": "old", "owner": "user:ada", "parked_at": 1.0, "nonce": "n"}
    redis_client.rpush(key_requeueing(CID), json.dumps(old))
    redis_client.rpush(key_parked("user:ada"), json.dumps({**old, "task_id": "older-json", "parked_at": 2.0}))
    work.park(ref(0, at=0.5))  # older than the JSON ref: goes before it
    assert work.requeueing_clients() == [CID]
    got = Recorder()
    assert work.requeue(CID, OWNERS, got) == 3
    assert got.ids == ["old", "r0", "older-json"]
    assert not redis_client.exists(key_requeueing(CID))


def test_reading_every_listed_ref_goes_a_chunk_at_a_time(redis_client: redis.Redis) -> None:
    work = ParkedWork(redis_client)
    for i in range(CHUNK * 2 + 3):
        work.park(ref(i, OWNERS[i % 2]))
    keys = sorted(work.listed_keys())
    assert keys == sorted(key_parked(o) for o in OWNERS)
    assert sorted(r.task_id for k in keys for r in work.refs_in(k)) == sorted(
        f"r{i}" for i in range(CHUNK * 2 + 3)
    )
