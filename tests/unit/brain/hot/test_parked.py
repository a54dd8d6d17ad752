"""brain.hot.parked: parked refs in Redis lists, kept in parked_at order, requeued in place in
chunks under a per-list lock; its Lua scripts run on a real redis-server (the conftest's)."""

from __future__ import annotations

import pytest
import redis

from brain.hot import parked as parked_module
from brain.hot.parked import (
    ParkedRef,
    ParkedWork,
    decode_chunk,
    decode_ref,
    key_requeue_again,
    key_requeue_lock,
    key_requeues,
    owner_of,
)
from workers.contracts import key_parked

USER = "user:ada"
CLIENT = "client:laptop"


@pytest.fixture
def work(redis_client: redis.Redis) -> ParkedWork:
    return ParkedWork(redis_client)


def ref(task_id: str, at: float, owner: str = USER, tree_id: str = "t1") -> ParkedRef:
    return ParkedRef(tree_id=tree_id, task_id=task_id, owner=owner, parked_at=at)


def listed(work: ParkedWork, owner: str = USER) -> list[str]:
    return [r.task_id for r in work.refs_in(key_parked(owner))]


# --- refs ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("user", "client_id", "owner"),
    [
        ("ada", "laptop", "client:laptop"),  # bound to the laptop: only it may take it
        ("ada", None, "user:ada"),  # unbound: any of the user's clients may take it
        (None, "laptop", "client:laptop"),  # only that client
        (None, None, "anyone"),
        ("", "laptop", "client:laptop"),
    ],
)
def test_owner_of(user: str | None, client_id: str | None, owner: str) -> None:
    assert owner_of(user, client_id) == owner


@pytest.mark.parametrize(
    ("tree_id", "task_id", "compact"),
    [
        ("t1", "a", True),
        ("tree.2026-01-01", "task_9", True),
        ("with space", "a", False),  # not a single word: stored as JSON
        ("t1", "{brace", False),
    ],
)
def test_a_ref_decodes_to_what_was_encoded(tree_id: str, task_id: str, compact: bool) -> None:
    original = ParkedRef(tree_id, task_id, USER, 1234.5)
    text = original.encode()
    assert text.startswith("{") is not compact
    assert decode_ref(text, USER) == original
    assert decode_ref(text.encode(), USER) == original


def test_every_park_makes_a_distinct_ref_even_with_the_same_fields() -> None:
    assert ref("a", 1.0).encode() != ref("a", 1.0).encode()


def test_a_chunk_decodes_compact_and_json_refs_alike() -> None:
    refs = [ref("a", 1.0), ParkedRef("odd tree", "b", USER, 2.0), ref("c", 3.0)]
    assert decode_chunk("\n".join(r.encode() for r in refs), USER) == refs
    assert decode_chunk("", USER) == []


# --- park ------------------------------------------------------------------------------------------


def test_a_list_is_kept_in_parked_at_order(work: ParkedWork) -> None:
    for task_id, at in [("c", 30.0), ("a", 10.0), ("d", 40.0), ("b", 20.0), ("b2", 20.0)]:
        work.park(ref(task_id, at))
    # An older park is inserted in its place; one as old as another goes behind it.
    assert listed(work) == ["a", "b", "b2", "c", "d"]


def test_while_a_requeue_holds_the_list_an_older_park_is_appended(
    work: ParkedWork, redis_client: redis.Redis
) -> None:
    work.park(ref("b", 20.0))
    redis_client.set(key_requeue_lock(key_parked(USER)), "someone")
    work.park(ref("a", 10.0))
    assert listed(work) == ["b", "a"]


def test_each_owner_has_its_own_list_and_waiting_counts_them(work: ParkedWork) -> None:
    work.park(ref("a", 1.0))
    work.park(ref("b", 2.0))
    work.park(ref("c", 3.0, owner=CLIENT))
    assert work.waiting() == {USER: 2, CLIENT: 1}
    assert sorted(work.listed_keys()) == sorted([key_parked(USER), key_parked(CLIENT)])


def test_refs_in_reads_a_long_list_a_chunk_at_a_time(
    work: ParkedWork, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(parked_module, "CHUNK", 2)
    for i in range(5):
        work.park(ref(f"x{i}", float(i)))
    assert listed(work) == ["x0", "x1", "x2", "x3", "x4"]


# --- requeue ---------------------------------------------------------------------------------------


class Placer:
    """``place``: records the task ids of each chunk handed out."""

    def __init__(self) -> None:
        self.chunks: list[list[str]] = []

    def __call__(self, refs: list[ParkedRef]) -> None:
        self.chunks.append([r.task_id for r in refs])


def test_requeue_hands_out_the_clients_list_then_the_users_in_chunks_and_empties_them(
    work: ParkedWork, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(parked_module, "CHUNK", 2)
    for task_id, at in [("u1", 1.0), ("u2", 2.0), ("u3", 3.0)]:
        work.park(ref(task_id, at))
    work.park(ref("c1", 9.0, owner=CLIENT))
    place = Placer()

    assert work.requeue("laptop", [CLIENT, USER], place) == 4
    assert place.chunks == [["c1"], ["u1", "u2"], ["u3"]]
    assert listed(work) == [] and listed(work, CLIENT) == []
    assert redis_client.hgetall(key_requeues()) == {}  # finished: nothing left for the reconciler
    assert redis_client.exists(key_requeue_lock(key_parked(USER))) == 0


def test_a_ref_parked_during_a_pass_is_not_handed_out_again_in_it(work: ParkedWork) -> None:
    work.park(ref("a", 1.0))
    work.park(ref("b", 2.0))
    seen: list[str] = []

    def place(refs: list[ParkedRef]) -> None:
        for r in refs:
            seen.append(r.task_id)
            work.park(ref(r.task_id, r.parked_at))  # no client could take it: parked again

    assert work.requeue("laptop", [USER], place) == 2
    assert seen == ["a", "b"]
    assert listed(work) == ["a", "b"]  # still waiting, in their order


def test_a_place_that_fails_drops_nothing_and_leaves_the_requeue_to_the_reconciler(work: ParkedWork) -> None:
    work.park(ref("a", 1.0))

    def place(refs: list[ParkedRef]) -> None:
        raise RuntimeError("store unreachable")

    with pytest.raises(RuntimeError):
        work.requeue("laptop", [USER], place)
    assert listed(work) == ["a"]
    assert work.requeueing_clients() == ["laptop"]  # its lock released, its entry kept

    place_ok = Placer()
    assert work.requeue("laptop", [USER], place_ok) == 1
    assert place_ok.chunks == [["a"]]
    assert work.requeueing_clients() == []


def test_a_requeue_of_a_list_another_holds_asks_the_holder_for_one_more_pass(
    work: ParkedWork, redis_client: redis.Redis
) -> None:
    work.park(ref("a", 1.0))
    handed: list[str] = []
    inner: list[int] = []

    def place(refs: list[ParkedRef]) -> None:
        handed.extend(r.task_id for r in refs)
        if not inner:  # a second client of the user connects meanwhile, with new work parked
            work.park(ref("b", 2.0))
            inner.append(work.requeue("desk", [USER], Placer()))

    assert work.requeue("laptop", [USER], place) == 2
    assert inner == [0]  # left to the holder
    assert handed == ["a", "b"]  # the holder's extra pass took the new ref
    assert listed(work) == []
    assert redis_client.exists(key_requeue_again(key_parked(USER))) == 0


def test_an_interrupted_requeue_whose_lock_is_still_held_is_not_called_unfinished(
    work: ParkedWork, redis_client: redis.Redis
) -> None:
    key = key_parked(USER)
    redis_client.hset(key_requeues(), key, "laptop")
    redis_client.set(key_requeue_lock(key), "holder", px=60_000)
    assert work.unfinished_requeues() == {}
    redis_client.delete(key_requeue_lock(key))
    assert work.unfinished_requeues() == {key: "laptop"}
    assert work.requeueing_clients() == ["laptop"]
