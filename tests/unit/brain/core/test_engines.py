"""Think-process tool configuration (seed 000 §8): a tree under an engine calls only its tools."""

from __future__ import annotations

import pytest

from brain.core.models import Location, TaskTree, ToolSpec
from brain.core.routing import Engine
from brain.core.validation import check_tree, engine_problems
from brain.errors import InvalidTaskTree

ENGINES = {
    "review": Engine(
        id="review", server=("web_search",), client=("read_local_file", "notes"), auto_fallback=True
    )
}
REGISTRY = {
    "notes": ToolSpec(name="notes", location=Location.CLIENT, fallback_tool="cloud_notes"),
    "cloud_notes": ToolSpec(name="cloud_notes", location=Location.SERVER),
}


def tree(engine: str | None, *tools: str) -> TaskTree:
    return TaskTree.model_validate(
        {
            "id": "t",
            "engine": engine,
            "tasks": [{"id": f"t{i}", "tool": tool} for i, tool in enumerate(tools)],
        }
    )


@pytest.mark.parametrize(
    ("engine", "tools", "problems"),
    [
        (None, ["shell_execute"], []),
        ("review", ["web_search", "read_local_file"], []),
        ("review", ["shell_execute"], ["task 't0': tool 'shell_execute' is not allowed by engine 'review'"]),
        ("nope", ["web_search"], ["engine: 'nope' is not an engine of the registry (review)"]),
        (
            "review",
            ["notes"],
            [
                (
                    "task 't0': tool 'notes' falls back to fallback_tool 'cloud_notes', which engine "
                    "'review' does not allow; list 'cloud_notes' under the engine's server tools or "
                    "remove the fallback_tool"
                )
            ],
        ),
        (None, ["notes"], []),
    ],
    ids=[
        "no engine allows any tool",
        "the engine's own tools are allowed",
        "another tool is refused",
        "an unknown engine is refused",
        "a fallback_tool the engine does not allow is refused",
        "without an engine any fallback_tool is allowed",
    ],
)
def test_engine_problems(engine: str | None, tools: list[str], problems: list[str]) -> None:
    assert engine_problems(tree(engine, *tools), ENGINES, REGISTRY) == problems


def test_check_tree_refuses_a_tool_outside_the_engine_naming_the_file() -> None:
    with pytest.raises(InvalidTaskTree) as err:
        check_tree(tree("review", "shell_execute"), {}, source="night.yaml", engines=ENGINES)
    assert str(err.value).startswith("night.yaml: invalid task tree (1 problem(s))")


def test_check_tree_refuses_a_fallback_tool_outside_the_engine() -> None:
    with pytest.raises(InvalidTaskTree) as err:
        check_tree(tree("review", "notes"), REGISTRY, source="night.yaml", engines=ENGINES)
    assert "fallback_tool 'cloud_notes', which engine 'review' does not allow" in str(err.value)
