"""brain.core.submission: one check for every way in. Invalid trees and run ids raise
InvalidTaskTree naming the source; tools nobody offers yet are warnings, not refusals, and
tools the run's clients announced are not even that."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from brain.core.models import Location, SessionKind, TaskTree
from brain.core.snapshot import RegistrySnapshot
from brain.core.submission import SubmitRequest, check_submission
from brain.core.treefile import load_registry, merge_registry, spec_from_descriptor
from brain.errors import InvalidTaskTree
from workers.tools.builtin import builtin_descriptors

EXAMPLES = Path(__file__).resolve().parents[4] / "examples"


@pytest.fixture(scope="module")
def registry() -> RegistrySnapshot:
    builtins = {d.name: spec_from_descriptor(d, Location.SERVER) for d in builtin_descriptors()}
    return RegistrySnapshot(tools=merge_registry(builtins, load_registry(EXAMPLES / "registry.yaml")))


def tree(*tasks: dict[str, Any], **fields: Any) -> TaskTree:
    return TaskTree.model_validate({"id": "t", "tasks": list(tasks), **fields})


@pytest.mark.parametrize(
    "tree_id",
    [None, "nightly-2026.01.01", "a", "A_b.c-d", "x" * 128],
)
def test_a_well_formed_run_id_is_accepted(registry: RegistrySnapshot, tree_id: str | None) -> None:
    assert (
        check_submission(
            tree({"id": "a", "tool": "echo", "args": {"value": 1}}), registry, source="s", tree_id=tree_id
        )
        == []
    )


@pytest.mark.parametrize("tree_id", ["", "-starts-with-dash", "has space", "has:colon", "x" * 129, "ü"])
def test_a_malformed_run_id_is_refused_naming_the_source(registry: RegistrySnapshot, tree_id: str) -> None:
    with pytest.raises(InvalidTaskTree) as caught:
        check_submission(
            tree({"id": "a", "tool": "echo", "args": {"value": 1}}),
            registry,
            source="nightly.yaml",
            tree_id=tree_id,
        )
    assert caught.value.path == "nightly.yaml"
    assert caught.value.problems == [
        f"tree_id {tree_id!r}: use letters, digits, '_', '.', '-' (max 128, starting with a letter or digit)"
    ]


def test_an_invalid_tree_is_refused_naming_every_problem(registry: RegistrySnapshot) -> None:
    bad = tree(
        {"id": "a", "tool": "echo", "args": {"value": "${tasks.nope.result}"}},
        {"id": "b", "tool": "echo", "pool": "no-such-pool"},
    )
    with pytest.raises(InvalidTaskTree) as caught:
        check_submission(bad, registry, source="run.yaml")
    assert caught.value.path == "run.yaml"
    assert len(caught.value.problems) >= 2
    assert any("nope" in p for p in caught.value.problems)
    assert any("no-such-pool" in p for p in caught.value.problems)


@pytest.mark.parametrize(
    ("announced", "warned"),
    [
        (frozenset(), True),  # nobody offers it yet: a warning, the tree is still accepted
        (frozenset({"laptop_only_tool"}), False),  # a client of the run announced it
    ],
)
def test_an_unknown_tool_is_a_warning_unless_announced(
    registry: RegistrySnapshot, announced: frozenset[str], warned: bool
) -> None:
    warnings = check_submission(
        tree({"id": "x", "tool": "laptop_only_tool"}), registry, source="s", announced=announced
    )
    assert warnings == (
        [
            (
                "task 'x': tool 'laptop_only_tool' is not in the registry and no connected client of this run "
                "announces it; the task will fail at run time"
            )
        ]
        if warned
        else []
    )


def test_a_submit_request_is_frozen_and_refuses_unknown_fields() -> None:
    request = SubmitRequest(tree=tree({"id": "a", "tool": "echo"}), source="s")
    assert request.session is SessionKind.AUTONOMOUS and request.user is None and request.tree_id is None
    with pytest.raises(ValidationError):
        SubmitRequest(tree=request.tree, source="s", priority=1)  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        request.user = "ada"  # type: ignore[misc]
