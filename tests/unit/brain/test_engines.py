"""Think-process tool configuration (seed 000 §8): a tree under an engine calls only its tools."""

from __future__ import annotations

import pytest

from brain.errors import InvalidTaskTree
from brain.models import TaskTree
from brain.routing import Engine
from brain.validation import check_tree, engine_problems

ENGINES = {
    "review": Engine(id="review", server=("web_search",), client=("read_local_file",), auto_fallback=True)
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
    ],
    ids=[
        "no engine allows any tool",
        "the engine's own tools are allowed",
        "another tool is refused",
        "an unknown engine is refused",
    ],
)
def test_engine_problems(engine: str | None, tools: list[str], problems: list[str]) -> None:
    assert engine_problems(tree(engine, *tools), ENGINES) == problems


def test_check_tree_refuses_a_tool_outside_the_engine_naming_the_file() -> None:
    with pytest.raises(InvalidTaskTree) as err:
        check_tree(tree("review", "shell_execute"), {}, source="night.yaml", engines=ENGINES)
    assert str(err.value).startswith("night.yaml: invalid task tree (1 problem(s))")
