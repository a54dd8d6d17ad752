"""A second (third...) brain beside the stack's: the brain's argv under a node name of its own
(docs/reliability.md, "Two live brains")."""

from __future__ import annotations

import pytest

from brain.stack.embedded import BRAIN_NODE, brain_argv, extra_brain_node


@pytest.mark.parametrize(
    ("service", "node"),
    [("brain-2", "brain2@%h"), ("brain-3", "brain3@%h"), ("brain", None), ("brain-1", None), ("brain-x", None),
     ("server-pool", None), ("server-pool-2", None)],
)  # fmt: skip
def test_only_brain_n_from_2_up_names_a_further_brain(service: str, node: str | None) -> None:
    assert extra_brain_node(service) == node


def test_a_further_brain_runs_the_brains_argv_under_its_own_node_name() -> None:
    first, second = brain_argv(), brain_argv("brain2@%h")
    assert first[first.index("-n") + 1] == BRAIN_NODE == "brain@%h"
    assert second[second.index("-n") + 1] == "brain2@%h"
    assert [a for a in first if a != BRAIN_NODE] == [a for a in second if a != "brain2@%h"]
