"""The relay's pure helpers: who is served first each poll, and in what order."""

from __future__ import annotations

import pytest

from brain.runtime.relay import interleaved, rotated


@pytest.mark.parametrize(
    ("turn", "order"),
    [
        (0, ["a", "b", "c"]),
        (1, ["b", "c", "a"]),
        (2, ["c", "a", "b"]),
        (3, ["a", "b", "c"]),
        (7, ["b", "c", "a"]),
    ],
)
def test_every_client_takes_its_turn_at_the_front(turn: int, order: list[str]) -> None:
    assert rotated(["a", "b", "c"], turn) == order


def test_no_clients_means_no_order() -> None:
    assert rotated([], 5) == []


def test_batches_are_served_one_message_per_client_in_turn_keeping_each_clients_order() -> None:
    batches = [("flood", [b"f1", b"f2", b"f3"]), ("quiet", [b"q1"]), ("two", [b"t1", b"t2"])]
    assert interleaved(batches) == [
        ("flood", b"f1"), ("quiet", b"q1"), ("two", b"t1"),
        ("flood", b"f2"), ("two", b"t2"),
        ("flood", b"f3"),
    ]  # fmt: skip
