"""Contract tests of the store (layer: brain, store): one suite, every backend.

Runs against SQLite always, against mongomock always (it checks the pymongo query
shapes, not a server), and against a real MongoDB when VANCETOPE_TEST_MONGO_URL is set.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mongomock
import pymongo
import pytest

from brain.core.models import (
    Enrollment,
    SessionKind,
    TaskRecord,
    TaskSpec,
    TaskState,
    TaskTree,
    TreeRecord,
    TreeStatus,
)
from brain.errors import StoreError
from brain.store import ANY, MongoStore, SQLiteStore, Store, open_store
from workers.contracts import ErrorInfo

MONGO_URL = os.environ.get("VANCETOPE_TEST_MONGO_URL")
MONGOMOCK = "mongomock-checks-query-shapes-not-a-server"
S = TaskState


@pytest.fixture(
    params=[
        "sqlite",
        MONGOMOCK,
        pytest.param(
            "mongodb",
            marks=pytest.mark.skipif(
                not MONGO_URL, reason="real MongoDB: set VANCETOPE_TEST_MONGO_URL (compose.yaml starts one)"
            ),
        ),
    ]
)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "sqlite":
        s: Store = SQLiteStore(tmp_path / "store.db")
        yield s
        s.close()
    elif request.param == MONGOMOCK:
        client = mongomock.MongoClient()
        yield MongoStore(client=client)
        client.close()
    else:
        client = pymongo.MongoClient(MONGO_URL)
        database = f"vancetope_test_{uuid.uuid4().hex[:12]}"
        try:
            yield MongoStore(client=client, database=database)
        finally:
            client.drop_database(database)
            client.close()


def make_tree(
    tree_id: str = "t1", task_ids: tuple[str, ...] = ("a", "b", "c"), submitted_at: float = 100.0
) -> tuple[TreeRecord, list[TaskRecord]]:
    # Arguments hold keys MongoDB cannot take as field names and an int BSON cannot hold.
    tree = TaskTree.model_validate(
        {
            "id": tree_id,
            "goal": "contract",
            "tasks": [
                {"id": tid, "tool": "echo", "args": {"$schema": "x", "a.b": [1, {"n": 2**70}]}}
                for tid in task_ids
            ],
        }
    )
    record = TreeRecord(
        tree_id=tree_id, tree=tree, session=SessionKind.INTERACTIVE, submitted_at=submitted_at
    )
    tasks = [
        TaskRecord(tree_id=tree_id, task_id=tid, tool="echo", updated_at=submitted_at) for tid in task_ids
    ]
    return record, tasks


def put(store: Store, tree_id: str = "t1", **kw: Any) -> tuple[TreeRecord, list[TaskRecord]]:
    record, tasks = make_tree(tree_id, **kw)
    store.put_tree(record, tasks)
    return record, tasks


# --- trees ------------------------------------------------------------------------------


def test_put_then_get_returns_equal_records_with_nested_tree_and_error(store: Store) -> None:
    record, tasks = make_tree()
    tasks[1] = tasks[1].model_copy(
        update={
            "state": S.FAILED,
            "run_id": "r9",
            "error": ErrorInfo(type="ToolError", message="boom", data={"$code": 7, "a.b": None}),
            "result": {"rows": [1, 2.5, "x", None, {"k": True}], "big": 2**70},
            "finished_at": 101.5,
        }
    )
    store.put_tree(record, tasks)
    assert store.get_tree("t1") == record
    assert store.get_task("t1", "b") == tasks[1]
    assert store.get_tasks("t1") == tasks


def test_a_lazy_read_of_a_tree_is_the_same_record_its_tasks_validated_as_asked_for(store: Store) -> None:
    record, _ = put(store, task_ids=("a", "b", "c"))
    lazy = store.get_tree("t1", lazy=True)
    assert lazy is not None
    assert lazy.tree.task("b") == record.tree.task("b")
    assert lazy == record and lazy.model_dump_json() == record.model_dump_json()
    assert store.get_tree("no-such-tree", lazy=True) is None


def test_missing_tree_and_task_read_as_none(store: Store) -> None:
    assert store.get_tree("nope") is None
    assert store.get_task("nope", "a") is None
    assert store.get_tasks("nope") == []


def test_putting_a_known_tree_id_again_is_refused_and_writes_nothing(store: Store) -> None:
    put(store)
    record, tasks = make_tree(task_ids=("x",))
    with pytest.raises(StoreError) as err:
        store.put_tree(record, tasks)
    assert str(err.value) == "tree 't1' already exists in the store; give the run a new id"
    assert [t.task_id for t in store.get_tasks("t1")] == ["a", "b", "c"]


def test_put_tree_refuses_tasks_of_another_tree_or_twice_the_same_task(store: Store) -> None:
    record, tasks = make_tree()
    with pytest.raises(StoreError, match="has tree_id 'other'"):
        store.put_tree(record, [*tasks, tasks[0].model_copy(update={"tree_id": "other", "task_id": "z"})])
    with pytest.raises(StoreError, match="lists task 'a' twice"):
        store.put_tree(record, [*tasks, tasks[0]])
    assert store.get_tree("t1") is None


def test_get_tasks_keeps_put_tree_order(store: Store) -> None:
    put(store, task_ids=("zeta", "alpha", "mid", "beta"))
    assert [t.task_id for t in store.get_tasks("t1")] == ["zeta", "alpha", "mid", "beta"]


def test_get_tasks_of_some_ids_reads_only_those_in_put_tree_order(store: Store) -> None:
    put(store, task_ids=("zeta", "alpha", "mid", "beta"))
    assert [t.task_id for t in store.get_tasks("t1", ["beta", "zeta", "nope"])] == ["zeta", "beta"]
    assert store.get_tasks("t1", []) == []
    many = tuple(f"t{i}" for i in range(2000))  # past SQLite's bound-parameter chunk
    put(store, "big", task_ids=many)
    assert len(store.get_tasks("big", many[::-1])) == 2000


def test_first_task_in_finds_one_task_in_the_states_asked_among_the_ids_given(store: Store) -> None:
    put(store, task_ids=("a", "b", "c"))
    store.transition("t1", "b", from_states={S.PENDING}, state=S.FAILED)
    assert store.first_task_in("t1", {S.FAILED}) == ("b", S.FAILED)
    assert store.first_task_in("t1", {S.FAILED}, among=["a", "c"]) is None
    assert store.first_task_in("t1", {S.PENDING}, among=["c"]) == ("c", S.PENDING)
    assert store.first_task_in("t1", {S.DONE}) is None
    assert store.first_task_in("t1", set()) is None
    assert store.first_task_in("nope", {S.PENDING}) is None
    many = tuple(f"t{i}" for i in range(2000))
    put(store, "big", task_ids=many)
    store.transition("big", "t1999", from_states={S.PENDING}, state=S.SKIPPED)
    assert store.first_task_in("big", {S.SKIPPED}, among=many) == ("t1999", S.SKIPPED)


def test_writes_in_a_batch_answer_at_once_and_are_kept_together(store: Store) -> None:
    put(store, task_ids=("a", "b"))
    with store.batch():
        assert store.transition("t1", "a", from_states={S.PENDING}, state=S.DONE) is not None
        assert store.transition("t1", "a", from_states={S.PENDING}, state=S.FAILED) is None
        with store.batch():  # nested: joins the outer one
            store.transition("t1", "b", from_states={S.PENDING}, state=S.DONE)
    assert store.task_states("t1") == {"a": S.DONE, "b": S.DONE}


def test_sqlite_batch_that_raises_writes_nothing(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "store.db")
    put(store, task_ids=("a", "b"))
    with pytest.raises(RuntimeError), store.batch():
        store.transition("t1", "a", from_states={S.PENDING}, state=S.DONE)
        raise RuntimeError("half-way")
    assert store.task_states("t1") == {"a": S.PENDING, "b": S.PENDING}
    store.close()


def test_task_states_reads_every_tasks_state_and_follows_transitions(store: Store) -> None:
    store.put_tree(*make_tree())
    assert store.task_states("t1") == {"a": TaskState.PENDING, "b": TaskState.PENDING, "c": TaskState.PENDING}
    store.transition("t1", "b", from_states={TaskState.PENDING}, state=TaskState.DONE)
    assert store.task_states("t1")["b"] is TaskState.DONE
    assert store.task_states("nope") == {}


def test_list_trees_is_newest_first_and_honours_limit(store: Store) -> None:
    for tree_id, at in [("old", 10.0), ("new", 30.0), ("middle", 20.0)]:
        put(store, tree_id, submitted_at=at)
    assert [t.tree_id for t in store.list_trees()] == ["new", "middle", "old"]
    assert [t.tree_id for t in store.list_trees(limit=2)] == ["new", "middle"]
    assert store.list_trees(limit=0) == []


def test_list_trees_and_schedule_runs_keep_a_window_of_submission_times(store: Store) -> None:
    for tree_id, at in [("old", 10.0), ("new", 30.0), ("middle", 20.0)]:
        put(store, tree_id, submitted_at=at)
    assert [t.tree_id for t in store.list_trees(since=20.0)] == ["new", "middle"]
    assert [t.tree_id for t in store.list_trees(until=20.0)] == ["old"]  # until is exclusive
    assert [t.tree_id for t in store.list_trees(since=15.0, until=30.0)] == ["middle"]
    assert [t.tree_id for t in store.list_trees(since=15.0, limit=1)] == ["new"]
    assert store.list_trees(since=31.0) == []
    _scheduled(store, "n1", "nightly", 100.0)
    _scheduled(store, "n2", "nightly", 200.0)
    _scheduled(store, "w1", "weekly", 150.0)
    assert [t.tree_id for t in store.schedule_runs("nightly", since=150.0)] == ["n2"]
    assert [t.tree_id for t in store.schedule_runs("nightly", until=150.0)] == ["n1"]
    assert [t.tree_id for t in store.schedule_runs("nightly", since=100.0, until=200.0)] == ["n1"]
    assert store.schedule_runs("weekly", since=0.0, until=100.0) == []


def test_finish_tree_changes_a_running_tree_only_once(store: Store) -> None:
    put(store)
    assert store.finish_tree("t1", TreeStatus.DONE, 200.0) is True
    assert store.finish_tree("t1", TreeStatus.FAILED, 300.0) is False
    tree = store.get_tree("t1")
    assert tree is not None and (tree.status, tree.finished_at) == (TreeStatus.DONE, 200.0)
    assert store.finish_tree("missing", TreeStatus.DONE, 1.0) is False


def test_finish_tree_refuses_running_as_a_final_status(store: Store) -> None:
    put(store)
    with pytest.raises(StoreError, match="needs a final status"):
        store.finish_tree("t1", TreeStatus.RUNNING, 1.0)


# --- transitions ------------------------------------------------------------------------------


def test_transition_applies_changes_when_state_matches(store: Store) -> None:
    put(store)
    got = store.transition(
        "t1", "a", from_states={S.PENDING}, state=S.QUEUED_SERVER, run_id="r1", attempt=1,
        route="server", queued_at=150.0, updated_at=150.0,
    )  # fmt: skip
    assert got is not None
    assert (got.state, got.run_id, got.attempt, got.route, got.queued_at, got.updated_at) == (
        S.QUEUED_SERVER, "r1", 1, "server", 150.0, 150.0,
    )  # fmt: skip
    assert store.get_task("t1", "a") == got


def test_transition_compares_the_client_a_run_was_sent_to(store: Store) -> None:
    """What lets a result be authorised by its compare-and-set alone: the source must be the
    client (or None: the server) the record says the run went to."""
    put(store, task_ids=("a", "b"))
    store.transition(
        "t1", "a", from_states={S.PENDING}, state=S.QUEUED_CLIENT, run_id="r1", client_id="alice"
    )
    store.transition("t1", "b", from_states={S.PENDING}, state=S.QUEUED_SERVER, run_id="r2")
    queued = {S.QUEUED_CLIENT, S.QUEUED_SERVER}
    assert store.transition("t1", "a", from_states=queued, expect_client_id="bob", state=S.DONE) is None
    assert store.transition("t1", "a", from_states=queued, expect_client_id=None, state=S.DONE) is None
    assert store.transition("t1", "b", from_states=queued, expect_client_id="alice", state=S.DONE) is None
    assert store.transition("t1", "a", from_states=queued, expect_client_id="alice", state=S.DONE) is not None
    assert store.transition("t1", "b", from_states=queued, expect_client_id=None, state=S.DONE) is not None


def test_the_client_a_run_was_sent_to_is_kept_until_a_transition_changes_it(store: Store) -> None:
    put(store)
    sent = store.transition(
        "t1", "a", from_states={S.PENDING}, state=S.QUEUED_CLIENT, run_id="r1", client_id="alice"
    )
    assert sent is not None and sent.client_id == "alice"
    parked = store.transition("t1", "a", from_states={S.QUEUED_CLIENT}, state=S.PENDING_CLIENT)
    assert parked is not None and parked.client_id == "alice"
    assert store.get_task("t1", "a") == parked
    assert store.tasks_in_states({S.PENDING_CLIENT}) == [parked]
    to_server = store.transition(
        "t1", "a", from_states={S.PENDING_CLIENT}, state=S.QUEUED_SERVER, run_id="r2", client_id=None
    )
    assert to_server is not None and to_server.client_id is None
    assert store.get_task("t1", "a") == to_server


def test_transition_does_nothing_when_state_does_not_match(store: Store) -> None:
    put(store)
    assert store.transition("t1", "a", from_states={S.RUNNING, S.QUEUED_SERVER}, state=S.DONE) is None
    assert store.transition("t1", "a", from_states=(), state=S.DONE) is None
    assert store.transition("t1", "nope", from_states={S.PENDING}, state=S.DONE) is None
    task = store.get_task("t1", "a")
    assert task is not None and task.state is S.PENDING


def test_transition_compares_run_id(store: Store) -> None:
    put(store)
    store.transition("t1", "a", from_states={S.PENDING}, state=S.QUEUED_SERVER, run_id="r2")
    assert (
        store.transition("t1", "a", from_states={S.QUEUED_SERVER}, expect_run_id="r1", state=S.DONE) is None
    )
    done = store.transition(
        "t1", "a", from_states={S.QUEUED_SERVER}, expect_run_id="r2", state=S.DONE, result={"ok": 1}
    )
    assert done is not None and done.state is S.DONE and done.result == {"ok": 1}


def test_transition_with_expect_run_id_none_matches_only_a_null_run_id(store: Store) -> None:
    put(store)
    assert store.transition("t1", "a", from_states={S.PENDING}, expect_run_id=None, run_id="r1") is not None
    assert store.transition("t1", "a", from_states={S.PENDING}, expect_run_id=None, run_id="r2") is None
    got = store.transition("t1", "a", from_states={S.PENDING}, expect_run_id=ANY, run_id=None)
    assert got is not None and got.run_id is None


def test_transition_stores_models_and_enums_as_json_and_reads_them_back(store: Store) -> None:
    put(store)
    error = ErrorInfo(type="Timeout", message="took too long", data={"after_s": 60, "$x": [2**70]})
    got = store.transition("t1", "c", from_states={S.PENDING}, state=S.FAILED, error=error, result=None)
    assert got is not None and got.error == error and got.state is S.FAILED
    assert store.get_task("t1", "c") == got
    assert store.tasks_in_states({S.FAILED}) == [got]


def test_begin_run_counts_deliveries_of_the_current_server_run_only(store: Store) -> None:
    put(store)
    assert store.begin_run("t1", "a", "r1", "w1", 5.0) is None  # never dispatched
    store.transition("t1", "a", from_states={S.PENDING}, state=S.QUEUED_SERVER, run_id="r1", attempt=1)
    assert store.begin_run("t1", "a", "r0", "w1", 5.0) is None  # a stale message of another run
    assert store.get_task("t1", "a").state is S.QUEUED_SERVER  # ... which moves nothing
    assert store.begin_run("t1", "a", "r1", "w1", 5.0) == 1
    assert store.begin_run("t1", "a", "r1", "w2", 6.0) == 2  # its worker died; delivered again
    got = store.get_task("t1", "a")
    assert got is not None and (got.deliveries, got.worker, got.started_at, got.state) == (
        2,
        "w2",
        6.0,
        S.RUNNING,
    )
    # a new run (the reconciler's re-send: queued again) starts counting afresh
    store.transition(
        "t1", "a", from_states={S.RUNNING}, state=S.QUEUED_SERVER, run_id="r2", attempt=2, deliveries=0
    )
    assert store.begin_run("t1", "a", "r1", "w1", 6.5) is None  # the old run, delivered late
    assert store.begin_run("t1", "a", "r2", "w1", 7.0) == 1
    # recorded, cancelled or sent to a client: nothing to begin
    store.transition("t1", "a", from_states={S.RUNNING}, state=S.DONE, result=1)
    assert store.begin_run("t1", "a", "r2", "w1", 8.0) is None
    assert store.get_task("t1", "a").state is S.DONE
    store.transition("t1", "b", from_states={S.PENDING}, state=S.QUEUED_CLIENT, run_id="rb", client_id="c")
    assert store.begin_run("t1", "b", "rb", "w1", 8.0) is None
    assert store.get_task("t1", "b").deliveries == 0


def test_begin_run_moves_the_task_to_running_in_the_same_write(store: Store) -> None:
    put(store)
    store.transition("t1", "a", from_states={S.PENDING}, state=S.QUEUED_SERVER, run_id="r1", updated_at=1.0)
    assert store.tasks_in_states({S.QUEUED_SERVER}, updated_before=2.0)[0].task_id == "a"
    assert store.begin_run("t1", "a", "r1", "w1", 5.0) == 1
    got = store.get_task("t1", "a")
    assert got is not None and (got.state, got.run_id, got.updated_at) == (S.RUNNING, "r1", 5.0)
    # the columns queries read agree with the record (SQLite keeps state and updated_at twice)
    assert store.tasks_in_states({S.QUEUED_SERVER}) == []
    assert [r.task_id for r in store.tasks_in_states({S.RUNNING}, updated_before=6.0)] == ["a"]
    assert store.tasks_in_states({S.RUNNING}, updated_before=5.0) == []
    assert store.task_states("t1")["a"] is S.RUNNING
    assert store.first_task_in("t1", {S.RUNNING}) == ("a", S.RUNNING)
    # running is in flight: its result, a cancel and a re-send take it from there
    done = store.transition("t1", "a", from_states={S.RUNNING}, expect_run_id="r1", state=S.DONE)
    assert done is not None and done.state is S.DONE


def test_a_redelivery_of_the_same_run_begins_again_and_another_run_does_not(store: Store) -> None:
    put(store)
    store.transition("t1", "a", from_states={S.PENDING}, state=S.QUEUED_SERVER, run_id="r1")
    assert store.begin_run("t1", "a", "r1", "w1", 5.0) == 1
    assert store.begin_run("t1", "a", "r2", "w2", 6.0) is None  # running, but not this run
    assert store.begin_run("t1", "a", "r1", "w2", 7.0) == 2  # acks_late: the same run, again
    got = store.get_task("t1", "a")
    assert got is not None and (got.state, got.deliveries, got.worker) == (S.RUNNING, 2, "w2")
    # taken off the run (cancelled while it ran): a redelivery begins nothing
    store.end_tasks("t1", from_states={S.RUNNING}, state=S.SKIPPED, reason="cancelled", finished_at=8.0)
    assert store.begin_run("t1", "a", "r1", "w3", 9.0) is None
    assert store.get_task("t1", "a").state is S.SKIPPED


def test_taken_back_is_counted_on_the_task_and_outlives_its_runs(store: Store) -> None:
    """The client route's poison count (brain.core.client_poison): written as a compare-and-set
    on the run it counts, kept when the call is re-sent as a new run (whose deliveries start
    afresh), and ended with the task."""
    put(store)
    assert store.get_task("t1", "a").taken_back == 0  # type: ignore[union-attr]
    store.transition("t1", "a", from_states={S.PENDING}, state=S.QUEUED_CLIENT, run_id="r1", client_id="c")
    assert (
        store.transition("t1", "a", from_states={S.QUEUED_CLIENT}, expect_run_id="r0", taken_back=1) is None
    )
    got = store.transition("t1", "a", from_states={S.QUEUED_CLIENT}, expect_run_id="r1", taken_back=1)
    assert got is not None and (got.taken_back, got.state, got.run_id) == (1, S.QUEUED_CLIENT, "r1")
    store.transition(
        "t1", "a", from_states={S.QUEUED_CLIENT}, state=S.QUEUED_CLIENT, run_id="r2", attempt=2, deliveries=0
    )
    ended = store.transition("t1", "a", from_states={S.QUEUED_CLIENT}, state=S.FAILED, taken_back=2)
    assert ended is not None and store.get_task("t1", "a") == ended and ended.taken_back == 2


def test_transition_refuses_unknown_fields_and_bad_values(store: Store) -> None:
    put(store)
    with pytest.raises(StoreError, match=r"unknown TaskRecord field\(s\) \['colour'\]"):
        store.transition("t1", "a", from_states={S.PENDING}, colour="red")
    with pytest.raises(StoreError, match="invalid value"):
        store.transition("t1", "a", from_states={S.PENDING}, state="finished!")
    assert store.get_task("t1", "a") == make_tree()[1][0]


def test_transition_without_changes_only_checks(store: Store) -> None:
    put(store)
    assert store.transition("t1", "a", from_states={S.PENDING}) == make_tree()[1][0]
    assert store.transition("t1", "a", from_states={S.DONE}) is None


def test_tasks_in_states_spans_trees_and_filters_on_updated_before(store: Store) -> None:
    put(store, "t1")
    put(store, "t2", task_ids=("x", "y"))
    store.transition("t1", "b", from_states={S.PENDING}, state=S.QUEUED_SERVER, updated_at=50.0)
    store.transition("t2", "y", from_states={S.PENDING}, state=S.QUEUED_CLIENT, updated_at=40.0)
    store.transition("t2", "x", from_states={S.PENDING}, state=S.QUEUED_SERVER, updated_at=500.0)
    queued = {S.QUEUED_SERVER, S.QUEUED_CLIENT}
    assert [(t.tree_id, t.task_id) for t in store.tasks_in_states(queued)] == [
        ("t2", "y"), ("t1", "b"), ("t2", "x"),
    ]  # fmt: skip
    assert [t.task_id for t in store.tasks_in_states(queued, updated_before=50.0)] == ["y"]
    assert [t.task_id for t in store.tasks_in_states(queued, limit=1)] == ["y"]
    assert [t.task_id for t in store.tasks_in_states({S.PENDING})] == ["a", "c"]
    assert store.tasks_in_states([]) == []


def test_tasks_in_states_of_one_client_only(store: Store) -> None:
    put(store, "t1")
    for task_id, cid in (("a", "laptop"), ("b", "desktop"), ("c", "laptop")):
        store.transition("t1", task_id, from_states={S.PENDING}, state=S.QUEUED_CLIENT, client_id=cid)
    sent = {S.QUEUED_CLIENT, S.RUNNING}
    assert sorted(t.task_id for t in store.tasks_in_states(sent, client_id="laptop")) == ["a", "c"]
    assert [t.task_id for t in store.tasks_in_states(sent, client_id="desktop")] == ["b"]
    assert store.tasks_in_states(sent, client_id="nobody") == []
    assert len(store.tasks_in_states(sent)) == 3


def test_transition_applies_only_once_under_concurrency_in_threads(
    store: Store, request: pytest.FixtureRequest
) -> None:
    if MONGOMOCK in request.node.callspec.id:
        pytest.skip("mongomock is not a server: it promises nothing about concurrent writers")
    put(store)
    store.transition("t1", "a", from_states={S.PENDING}, state=S.QUEUED_SERVER, run_id="r1")
    n = 12
    barrier = threading.Barrier(n)
    wins: list[bool] = []

    def finish() -> None:
        barrier.wait()
        got = store.transition(
            "t1", "a", from_states={S.QUEUED_SERVER}, expect_run_id="r1", state=S.DONE, updated_at=9.0
        )
        wins.append(got is not None)

    threads = [threading.Thread(target=finish) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(wins) == [False] * (n - 1) + [True]


# --- SQLite only ------------------------------------------------------------------------------


def _finish_in_another_process(path: str, barrier: Any, results: Any) -> None:
    store = SQLiteStore(path)
    try:
        barrier.wait()
        got = store.transition(
            "t1",
            "a",
            from_states={S.QUEUED_SERVER},
            expect_run_id="r1",
            state=S.DONE,
            worker=str(os.getpid()),
        )
        results.put(got is not None)
    finally:
        store.close()


def test_sqlite_transition_applies_only_once_across_processes(tmp_path: Path) -> None:
    path = str(tmp_path / "shared" / "store.db")
    store = SQLiteStore(path)
    put(store)
    store.transition("t1", "a", from_states={S.PENDING}, state=S.QUEUED_SERVER, run_id="r1")
    ctx = multiprocessing.get_context("spawn")
    n = 4
    barrier, results = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_finish_in_another_process, args=(path, barrier, results)) for _ in range(n)]
    for p in procs:
        p.start()
    wins = sorted(results.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=30)
    results.close()
    results.join_thread()
    assert [p.exitcode for p in procs] == [0] * n
    assert wins == [False] * (n - 1) + [True]
    task = store.get_task("t1", "a")
    assert task is not None and task.state is S.DONE and task.worker in {str(p.pid) for p in procs}
    store.close()


def test_sqlite_data_persists_across_reopen(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / "store.db"
    first = SQLiteStore(path)
    record, _ = put(first)
    first.transition("t1", "a", from_states={S.PENDING}, state=S.DONE, result=[1, 2])
    first.close()
    second = SQLiteStore(path)
    assert second.get_tree("t1") == record
    got = second.get_task("t1", "a")
    assert got is not None and got.state is S.DONE and got.result == [1, 2]
    second.close()


def test_sqlite_refuses_use_after_close(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "store.db")
    store.close()
    with pytest.raises(StoreError, match="is closed"):
        store.get_tree("t1")


# --- open_store ------------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["sqlite-relative", "sqlite-absolute", "bare-path"])
def test_open_store_accepts_sqlite_url_forms(
    form: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    url, expected = {
        "sqlite-relative": ("sqlite:///rel/x.db", tmp_path / "rel" / "x.db"),
        "sqlite-absolute": (f"sqlite:///{tmp_path / 'abs.db'}", tmp_path / "abs.db"),
        "bare-path": (str(tmp_path / "bare.db"), tmp_path / "bare.db"),
    }[form]
    store = open_store(url)
    try:
        assert isinstance(store, SQLiteStore) and isinstance(store, Store)
        assert store.path.resolve() == expected and expected.is_file()
    finally:
        store.close()


@pytest.mark.parametrize(
    ("url", "database"),
    [("mongodb://localhost:1/", "vancetope"), ("mongodb://u:p@h1:1,h2:1/prod?replicaSet=rs", "prod")],
)
def test_open_store_accepts_mongodb_urls_and_takes_the_database_from_the_path(
    url: str, database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Only the parsing is under test: a real MongoStore would wait for a server to make indexes.
    calls: list[tuple[str, str, bool]] = []
    monkeypatch.setattr(
        "brain.store.mongo.MongoStore",
        lambda url, *, database, read_only: calls.append((url, database, read_only)),
    )
    open_store(url)
    open_store(url, read_only=True)
    assert calls == [(url, database, False), (url, database, True)]


@pytest.mark.parametrize(
    "url",
    ["postgres://u:secret@h/db", "sqlite://", "sqlite:///", "sqlite:///:memory:", "notes.txt", "redis://x"],
)
def test_open_store_names_the_url_and_the_accepted_forms_for_a_bad_url(url: str) -> None:
    with pytest.raises(StoreError) as err:
        open_store(url)
    message = str(err.value)
    assert "sqlite:///relative/path.db, sqlite:////absolute/path.db, a file path ending in .db" in message
    assert "mongodb://host[:port]/database" in message
    assert "secret" not in message
    if url == "postgres://u:secret@h/db":
        assert message.startswith("unsupported store URL 'postgres://u:***@h/db'; accepted forms: ")
    elif url == "notes.txt":
        assert message.startswith("unsupported store URL 'notes.txt'")


def test_mongo_store_needs_exactly_one_of_url_and_client() -> None:
    with pytest.raises(StoreError, match="exactly one of url"):
        MongoStore()


# --- enrollments -------------------------------------------------------------------------


def test_an_enrollment_is_stored_replaced_listed_and_deleted(store: Store) -> None:
    first = Enrollment(client_id="laptop", user="ada", enrolled_at=1.0, secret_sha256="a" * 64)
    store.put_enrollment(first)
    store.put_enrollment(Enrollment(client_id="desk", user="bob", enrolled_at=2.0))
    assert store.get_enrollment("laptop") == first
    again = first.model_copy(update={"secret_sha256": "b" * 64, "enrolled_at": 3.0})
    store.put_enrollment(again)  # re-enrolling replaces: the old secret stops counting
    assert store.get_enrollment("laptop") == again
    assert [e.client_id for e in store.list_enrollments()] == ["desk", "laptop"]
    assert store.delete_enrollment("laptop") is True
    assert store.delete_enrollment("laptop") is False
    assert store.get_enrollment("laptop") is None
    assert [e.client_id for e in store.list_enrollments()] == ["desk"]


# --- schedules and summaries -------------------------------------------------------------


def _scheduled(store: Store, tree_id: str, schedule: str | None, submitted_at: float) -> TreeRecord:
    record, tasks = make_tree(tree_id, submitted_at=submitted_at)
    record = record.model_copy(update={"schedule": schedule})
    store.put_tree(record, tasks)
    return record


def test_schedule_runs_lists_a_schedules_runs_newest_first_and_can_keep_only_unfinished_ones(
    store: Store,
) -> None:
    _scheduled(store, "n1", "nightly", 100.0)
    _scheduled(store, "n2", "nightly", 200.0)
    _scheduled(store, "w1", "weekly", 150.0)
    _scheduled(store, "hand", None, 300.0)
    got = store.get_tree("n1")
    assert got is not None and got.schedule == "nightly"
    assert [t.tree_id for t in store.schedule_runs("nightly")] == ["n2", "n1"]
    assert [t.tree_id for t in store.schedule_runs("nightly", limit=1)] == ["n2"]
    assert store.finish_tree("n2", TreeStatus.DONE, 250.0)
    assert [t.tree_id for t in store.schedule_runs("nightly", running_only=True)] == ["n1"]
    assert store.schedule_runs("nobody") == []


def test_the_last_fire_of_each_schedule_is_kept_and_replaced(store: Store) -> None:
    assert store.last_fires() == {}
    store.record_fire("nightly", 10.0)
    store.record_fire("weekly", 20.0)
    store.record_fire("nightly", 30.5)
    assert store.last_fires() == {"nightly": 30.5, "weekly": 20.0}


def test_a_summary_is_stored_once_per_tree_and_kind_and_read_back_oldest_first(store: Store) -> None:
    from brain.core.summary import SummaryKind, summarise

    record = _scheduled(store, "n1", "nightly", 100.0)
    tasks = store.get_tasks("n1")
    deadline = summarise(record, tasks, SummaryKind.DEADLINE, at=110.0)
    final = summarise(record, tasks, SummaryKind.FINAL, at=120.0)
    assert store.put_summary(deadline) is True
    assert store.put_summary(deadline.model_copy(update={"at": 111.0})) is False  # another process lost
    assert store.put_summary(final) is True
    assert store.get_summaries("n1") == [deadline, final]
    assert store.get_summaries("other") == []


# --- secrets (ciphertexts only; brain.runtime.vault encrypts) -------------------------------------


def test_a_secret_is_stored_replaced_listed_and_deleted(store: Store) -> None:
    from brain.core.models import SecretRecord

    first = SecretRecord(name="API_TOKEN", ciphertext="gAAAA-one", created_at=1.0, updated_at=1.0)
    store.put_secret(first)
    store.put_secret(SecretRecord(name="A_KEY", ciphertext="gAAAA-two", created_at=2.0, updated_at=2.0))
    assert store.get_secret("API_TOKEN") == first
    again = first.model_copy(update={"ciphertext": "gAAAA-three", "updated_at": 3.0})
    store.put_secret(again)
    assert store.get_secret("API_TOKEN") == again
    assert [s.name for s in store.list_secrets()] == ["API_TOKEN", "A_KEY"]
    assert store.delete_secret("API_TOKEN") is True
    assert store.delete_secret("API_TOKEN") is False
    assert store.get_secret("API_TOKEN") is None
    assert "gAAAA" not in repr(store.list_secrets())  # ciphertexts stay out of reprs and logs


# --- gateway tokens (only their SHA-256; brain.gateway) -----------------------------------


def test_a_gateway_token_is_found_by_its_hash_replaced_per_user_and_revoked(store: Store) -> None:
    from brain.core.models import GatewayToken

    first = GatewayToken(user="demo", token_sha256="a" * 64, created_at=1.0)
    store.put_gateway_token(first)
    store.put_gateway_token(GatewayToken(user="bob", token_sha256="b" * 64, created_at=2.0))
    assert store.find_gateway_token("a" * 64) == first
    assert store.find_gateway_token("c" * 64) is None
    again = GatewayToken(user="demo", token_sha256="c" * 64, created_at=3.0)
    store.put_gateway_token(again)  # a new token replaces the old: the old stops counting
    assert store.find_gateway_token("a" * 64) is None
    assert store.find_gateway_token("c" * 64) == again
    assert store.delete_gateway_token("demo") is True
    assert store.delete_gateway_token("demo") is False
    assert store.find_gateway_token("c" * 64) is None
    assert store.find_gateway_token("b" * 64) is not None


# --- ending many tasks at once (cancel) and the per-user count (quota) --------------------


def test_end_tasks_ends_every_unfinished_task_of_a_tree_in_one_call(store: Store) -> None:
    put(store, "t1", task_ids=("a", "b", "c", "d"))
    put(store, "t2", task_ids=("a",))
    store.transition("t1", "a", from_states={S.PENDING}, state=S.DONE)
    store.transition("t1", "b", from_states={S.PENDING}, state=S.QUEUED_CLIENT, run_id="r-b", client_id="lap")
    store.transition("t1", "c", from_states={S.PENDING}, state=S.QUEUED_SERVER, run_id="r-c")
    unfinished = {S.PENDING, S.QUEUED_CLIENT, S.QUEUED_SERVER, S.RUNNING, S.BLOCKED}
    ended = store.end_tasks(
        "t1", from_states=unfinished, state=S.SKIPPED, reason="cancelled by user", finished_at=500.0
    )
    assert sorted(ended) == [("b", "r-b", "lap"), ("c", "r-c", None), ("d", None, None)]
    by_id = {t.task_id: t for t in store.get_tasks("t1")}
    assert by_id["a"].state is S.DONE
    for tid in "bcd":
        rec = by_id[tid]
        assert (rec.state, rec.reason, rec.finished_at, rec.updated_at, rec.error) == (
            S.SKIPPED, "cancelled by user", 500.0, 500.0, None,
        )  # fmt: skip
    assert store.task_states("t1")["b"] is S.SKIPPED  # the state column follows the doc
    assert [t.state for t in store.get_tasks("t2")] == [S.PENDING]  # another tree is untouched
    # a second call finds nothing left to end; one task alone may be ended too
    assert store.end_tasks("t1", from_states=unfinished, state=S.SKIPPED, reason="x", finished_at=1.0) == []
    assert store.end_tasks(
        "t2", from_states=unfinished, state=S.SKIPPED, reason="x", finished_at=1.0, task_id="a"
    ) == [("a", None, None)]
    assert store.tasks_in_states({S.SKIPPED}, limit=10)[0].state is S.SKIPPED


def test_end_tasks_among_ends_only_the_named_tasks_in_those_states(store: Store) -> None:
    many = tuple(f"t{i}" for i in range(2000))  # past SQLite's bound-parameter chunk
    put(store, "big", task_ids=many)
    store.transition("big", "t5", from_states={S.PENDING}, state=S.DONE)
    named = [f"t{i}" for i in range(1999, 2, -2)]  # odd ones from t3, in any order
    ended = store.end_tasks(
        "big", from_states={S.PENDING}, state=S.SKIPPED, reason="cancelled", finished_at=2.0, among=named
    )
    odd = [f"t{i}" for i in range(3, 2000, 2) if i != 5]  # t5 was done already
    assert [e.task_id for e in ended] == odd  # in put_tree's order
    assert store.get_task("big", "t5").state is S.DONE and store.get_task("big", "t4").state is S.PENDING
    assert all(t.state is S.SKIPPED for t in store.get_tasks("big", odd))
    assert (
        store.end_tasks(
            "big", from_states={S.PENDING}, state=S.SKIPPED, reason="x", finished_at=3.0, among=[]
        )
        == []
    )
    both = store.end_tasks(
        "big",
        from_states={S.PENDING},
        state=S.SKIPPED,
        reason="x",
        finished_at=3.0,
        task_id="t2",
        among=["t4"],
    )
    assert both == [] and store.get_task("big", "t2").state is S.PENDING  # task_id and among: both must hold


def test_count_unfinished_counts_the_running_trees_of_one_user(store: Store) -> None:
    for tree_id, user in (("t1", "alice"), ("t2", "alice"), ("t3", "bob")):
        record, tasks = make_tree(tree_id)
        store.put_tree(record.model_copy(update={"user": user}), tasks)
    store.transition("t1", "a", from_states={S.PENDING}, state=S.DONE)
    unfinished = {S.PENDING, S.QUEUED_SERVER}
    assert store.count_unfinished("alice", unfinished) == 5
    assert store.count_unfinished("bob", unfinished) == 3
    assert store.count_unfinished("carol", unfinished) == 0
    store.finish_tree("t2", TreeStatus.FAILED, 9.0)  # a finished tree's tasks no longer count
    assert store.count_unfinished("alice", unfinished) == 2


def test_a_submit_credential_is_stored_replaced_listed_and_deleted(store: Store) -> None:
    from brain.core.models import SubmitCredential

    store.put_submitter(SubmitCredential(user="bob", secret_sha256="b" * 64, created_at=1.0))
    store.put_submitter(SubmitCredential(user="alice", secret_sha256="a" * 64, created_at=2.0))
    again = SubmitCredential(user="bob", secret_sha256="c" * 64, created_at=3.0)
    store.put_submitter(again)
    assert [c.user for c in store.list_submitters()] == ["alice", "bob"]
    assert store.list_submitters()[1] == again
    assert store.delete_submitter("bob") is True
    assert store.delete_submitter("bob") is False
    assert [c.user for c in store.list_submitters()] == ["alice"]


def test_a_read_only_sqlite_store_reads_and_refuses_every_write(tmp_path: Path) -> None:
    writer = SQLiteStore(tmp_path / "store.db")
    put(writer, "t1")
    reader = open_store(f"sqlite:///{tmp_path / 'store.db'}", read_only=True)
    try:
        assert reader.get_tree("t1") is not None and len(reader.get_tasks("t1")) == 3
        with pytest.raises(StoreError, match="readonly"):
            reader.transition("t1", "a", from_states={S.PENDING}, state=S.DONE)
        with pytest.raises(StoreError, match="readonly"):
            put(reader, "t2")
        assert writer.get_task("t1", "a").state is S.PENDING
    finally:
        reader.close()
        writer.close()
    with pytest.raises(StoreError, match="does not exist"):
        SQLiteStore(tmp_path / "absent.db", read_only=True)


def test_a_read_only_mongodb_store_creates_no_index() -> None:
    """The gateway's MongoDB user has the read role only: createIndex would fail on its open."""
    client = mongomock.MongoClient()
    try:
        MongoStore(client=client, read_only=True)
        assert client["vancetope"].list_collection_names() == []
        MongoStore(client=client)  # a writer makes them
        assert "tree_id_1" in client["vancetope"]["trees"].index_information()
    finally:
        client.close()


def test_tasks_expired_finds_the_unfinished_tasks_past_their_deadline_and_only_those(store: Store) -> None:
    put(store, "t1", task_ids=tuple(f"t{i}" for i in range(6)))
    for task_id, deadline in (("t0", 50.0), ("t1", 10.0), ("t2", None), ("t3", 30.0), ("t4", 20.0)):
        store.transition("t1", task_id, from_states={S.PENDING}, state=S.QUEUED_SERVER, expires_at=deadline)
    assert [t.task_id for t in store.tasks_expired(30.0)] == ["t1", "t4", "t3"]  # soonest first
    assert [t.task_id for t in store.tasks_expired(30.0, limit=2)] == ["t1", "t4"]
    assert store.tasks_expired(9.0) == [] and store.tasks_expired(100.0, limit=0) == []
    # A later move that says nothing of the deadline keeps it; one that ends the task drops it.
    store.transition("t1", "t1", from_states={S.QUEUED_SERVER}, state=S.RUNNING)
    store.transition("t1", "t4", from_states={S.QUEUED_SERVER}, state=S.DONE)
    store.end_tasks(
        "t1", from_states={S.QUEUED_SERVER}, state=S.SKIPPED, reason="x", finished_at=1.0, task_id="t3"
    )
    assert [(t.task_id, t.state) for t in store.tasks_expired(100.0)] == [
        ("t1", S.RUNNING),
        ("t0", S.QUEUED_SERVER),
    ]
    # The deadline is kept beside the record, not in it (a TaskRecord forbids unknown fields).
    assert "expires_at" not in store.get_task("t1", "t0").model_dump()
    # None takes a deadline away.
    store.transition("t1", "t0", from_states={S.QUEUED_SERVER}, state=S.QUEUED_SERVER, expires_at=None)
    assert [t.task_id for t in store.tasks_expired(100.0)] == ["t1"]


def test_backfill_gives_a_deadline_to_the_unfinished_tasks_an_older_version_queued_without_one(
    store: Store,
) -> None:
    # Before the deadline index, a dispatch wrote first_queued_at and no expires_at: such a task
    # was never expired until its next send. What each brain fills in as it starts.
    limited = {"tool": "echo", "args": {}, "max_total_s": 10}
    tree = TaskTree.model_validate(
        {
            "id": "old",
            "tasks": [
                {"id": "queued", **limited},
                {"id": "running", **limited},
                {"id": "free", "tool": "echo", "args": {}},
                {"id": "finished", **limited},
                {"id": "pending", **limited},
                {"id": "has", **limited},
                {"id": "each", "tool": "echo", "args": {}},
            ],
        }
    )
    record = TreeRecord(tree_id="old", tree=tree, session=SessionKind.AUTONOMOUS, submitted_at=1.0)
    ids = [t.id for t in tree.tasks]
    store.put_tree(record, [TaskRecord(tree_id="old", task_id=i, tool="echo", updated_at=1.0) for i in ids])
    # An item of a for_each task carries its own spec.
    item = TaskSpec.model_validate({"id": "each[0]", "tool": "echo", "args": {}, "max_total_s": 5})
    store.add_tasks(
        "old", [TaskRecord(tree_id="old", task_id="each[0]", tool="echo", updated_at=1.0, spec=item)]
    )
    for task_id in ("queued", "running", "free", "finished", "has", "each[0]"):
        store.transition(
            "old", task_id, from_states={S.PENDING}, state=S.QUEUED_SERVER, first_queued_at=100.0
        )
    store.transition("old", "running", from_states={S.QUEUED_SERVER}, state=S.RUNNING)
    store.transition("old", "finished", from_states={S.QUEUED_SERVER}, state=S.DONE)
    store.transition("old", "has", from_states={S.QUEUED_SERVER}, state=S.QUEUED_SERVER, expires_at=999.0)
    assert store.tasks_expired(500.0) == []

    # first_queued_at + max_total_s, of its tree's spec or its own: not a finished task, not one
    # never queued, not one without a max_total_s, not one that has a deadline already.
    assert store.backfill_deadlines() == 3
    assert [t.task_id for t in store.tasks_expired(105.0)] == ["each[0]"]
    assert {t.task_id for t in store.tasks_expired(110.0)} == {"each[0]", "queued", "running"}
    assert {t.task_id for t in store.tasks_expired(998.0)} == {"each[0]", "queued", "running"}
    assert [t.task_id for t in store.tasks_expired(1000.0)][-1] == "has"  # its own, kept
    # Once per store: a later call reads nothing (an older brain still dispatching beside this
    # version would write tasks it no longer looks at: stop the older brains first).
    store.transition("old", "pending", from_states={S.PENDING}, state=S.QUEUED_SERVER, first_queued_at=100.0)
    assert store.backfill_deadlines() == 0
    assert "pending" not in {t.task_id for t in store.tasks_expired(1000.0)}
