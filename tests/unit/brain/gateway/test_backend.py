"""The gateway backend's pure decisions (brain.gateway.backend): tables, no Redis."""

from __future__ import annotations

from brain.core.models import Location, ToolSpec
from brain.core.snapshot import RegistrySnapshot
from brain.gateway.backend import unknown_tool

REGISTRY = RegistrySnapshot(
    tools={"echo": ToolSpec(name="echo", location=Location.SERVER)},
    clashes={"add": ["demo.add", "other.add"]},
)


def test_a_name_the_registry_or_the_callers_clients_know_is_not_unknown() -> None:
    assert unknown_tool("echo", REGISTRY, frozenset()) is None
    assert unknown_tool("notes.add", REGISTRY, frozenset({"notes.add"})) is None
    # Ambiguous, not unknown: its call fails saying which qualified names to write.
    assert unknown_tool("add", REGISTRY, frozenset()) is None


def test_an_unknown_name_says_so_with_did_you_mean_over_the_callers_names_only() -> None:
    why = unknown_tool("ecko", REGISTRY, frozenset({"ecco"}))
    assert why is not None and why.startswith("Unknown tool: 'ecko'")
    assert "`echo`" in why and "`ecco`" in why
