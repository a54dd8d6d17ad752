"""A question about a few named tasks costs the same in a tree of ten tasks or of ten thousand
(brain/store/sqlite.py ``first_task_in``). Each item's result of a fan-out, each member's of a
fan-in, asks whether one of a few siblings is unfinished; SQLite once answered it through the
(tree_id, state) index, reading every unfinished task of the tree: O(N²) per fan-out. Counted
in SQLite's own virtual-machine steps (a progress handler), not timed."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

from brain.core.models import TaskState
from brain.core.transitions import NOT_FINAL
from brain.store import SQLiteStore
from tests.unit.brain.store.test_store_contract import put


def steps_of(store: SQLiteStore, statement: Callable[[], object]) -> int:
    steps = 0

    def count() -> int:
        nonlocal steps
        steps += 1
        return 0  # go on

    conn = store._conn()
    conn.set_progress_handler(count, 1)
    try:
        statement()
    finally:
        conn.set_progress_handler(None, 1)
    return steps


def steps_of_a_probe(store: SQLiteStore, tree_id: str, among: list[str]) -> int:
    found: list[object] = []
    steps = steps_of(store, lambda: found.append(store.first_task_in(tree_id, NOT_FINAL, among=among)))
    assert found[0] is not None and found[0][1] is TaskState.PENDING  # type: ignore[index]
    return steps


def test_asking_about_32_tasks_reads_those_not_every_unfinished_task_of_the_tree(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "store.db")
    try:
        put(store, "small", task_ids=tuple(f"t{i}" for i in range(40)))
        put(store, "big", task_ids=tuple(f"t{i}" for i in range(10_000)))
        # The last listed, as a fan-out's item asks about its siblings (the last sent are the
        # last to end): the tree's other unfinished tasks come before them in every index.
        small = steps_of_a_probe(store, "small", [f"t{i}" for i in range(39, 7, -1)])
        big = steps_of_a_probe(store, "big", [f"t{i}" for i in range(9_999, 9_967, -1)])
        # The same 32 lookups in both (the old plan: ~400 times more steps in the big tree).
        assert big <= 2 * small, (small, big)
    finally:
        store.close()


def test_ending_32_named_tasks_reads_those_not_every_unfinished_task_of_the_tree(tmp_path: Path) -> None:
    """The same for ``end_tasks(among=...)``: a for_each task cancelled alone ends its items."""
    store = SQLiteStore(tmp_path / "store.db")
    try:
        put(store, "small", task_ids=tuple(f"t{i}" for i in range(40)))
        put(store, "big", task_ids=tuple(f"t{i}" for i in range(10_000)))

        def end(tree_id: str, among: list[str]) -> int:
            ended: list[object] = []
            steps = steps_of(
                store,
                lambda: ended.extend(
                    store.end_tasks(
                        tree_id, from_states=NOT_FINAL, state=TaskState.SKIPPED, reason="x", finished_at=1.0,
                        among=among,
                    )
                ),
            )  # fmt: skip
            assert len(ended) == 32
            return steps

        small = end("small", [f"t{i}" for i in range(39, 7, -1)])
        big = end("big", [f"t{i}" for i in range(9_999, 9_967, -1)])
        assert big <= 2 * small, (small, big)
    finally:
        store.close()


def test_the_expiry_sweep_reads_the_tasks_past_their_deadline_not_every_unfinished_task(
    tmp_path: Path,
) -> None:
    """``tasks_expired`` goes through the index of the tasks that have a deadline: 10,000 queued
    tasks without one cost it nothing (before, the sweep read and parsed the 1,000 stalest
    unfinished tasks every time, and never saw a task behind them)."""
    store = SQLiteStore(tmp_path / "store.db")
    try:
        for tree_id, n in (("small", 10), ("big", 10_000)):
            put(store, tree_id, task_ids=tuple(f"t{i}" for i in range(n)))
            with store.batch():
                for i in range(n):
                    deadline = 5.0 if i == n - 1 else None  # the last one sent: behind all the others
                    store.transition(
                        tree_id, f"t{i}", from_states={TaskState.PENDING}, state=TaskState.QUEUED_SERVER,
                        expires_at=deadline,
                    )  # fmt: skip
        found: list[list[object]] = []
        steps = steps_of(
            store, lambda: found.append([(t.tree_id, t.task_id) for t in store.tasks_expired(9.0)])
        )
        assert found == [[("small", "t9"), ("big", "t9999")]]
        assert steps < 500, steps  # two rows of an index, whatever else is unfinished
    finally:
        store.close()


def test_a_store_file_from_before_the_deadline_column_gets_it_and_keeps_its_tasks(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    store = SQLiteStore(path)
    put(store, "old", task_ids=("a", "b"))
    store.close()
    with sqlite3.connect(path) as conn:  # the file as version 1 wrote it
        conn.execute("DROP INDEX tasks_by_expiry")
        conn.execute("ALTER TABLE tasks DROP COLUMN expires_at")
    store = SQLiteStore(path)
    try:
        assert [t.task_id for t in store.get_tasks("old")] == ["a", "b"]
        store.transition(
            "old", "a", from_states={TaskState.PENDING}, state=TaskState.QUEUED_SERVER, expires_at=1.0
        )
        assert [t.task_id for t in store.tasks_expired(2.0)] == ["a"]
    finally:
        store.close()
