"""A question about a few named tasks costs the same in a tree of ten tasks or of ten thousand
(brain/store/sqlite.py ``first_task_in``). Each item's result of a fan-out, each member's of a
fan-in, asks whether one of a few siblings is unfinished; SQLite once answered it through the
(tree_id, state) index, reading every unfinished task of the tree: O(N²) per fan-out. Counted
in SQLite's own virtual-machine steps (a progress handler), not timed."""

from __future__ import annotations

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
