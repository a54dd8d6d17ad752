"""Loading task-tree and registry files, and layering registries (brain.core.treefile)."""

from __future__ import annotations

from pathlib import Path
from textwrap import dedent

import pytest

from brain.core.models import Location, OfflineStrategy, Side, ToolSpec
from brain.core.routing import Engine
from brain.core.treefile import (
    load_engines,
    load_registry,
    load_tree,
    merge_registry,
    spec_from_descriptor,
)
from brain.errors import ConfigError, InvalidFile, InvalidRegistry, InvalidTaskTree
from workers.contracts import ToolDescriptor, ToolType

EXAMPLES = Path(__file__).resolve().parents[4] / "examples"


def write(tmp_path: Path, text: str, name: str = "tree.yaml") -> Path:
    path = tmp_path / name
    path.write_text(dedent(text).lstrip("\n"), encoding="utf-8")
    return path


def tree_problems(path: Path, **kwargs: object) -> list[str]:
    with pytest.raises(InvalidTaskTree) as caught:
        load_tree(path, **kwargs)  # type: ignore[arg-type]
    assert caught.value.path == str(path)
    return caught.value.problems


def registry_problems(path: Path) -> list[str]:
    with pytest.raises(InvalidRegistry) as caught:
        load_registry(path)
    assert caught.value.path == str(path)
    return caught.value.problems


def file_problem(path: Path) -> str:
    with pytest.raises(InvalidFile) as caught:
        load_tree(path)
    assert str(caught.value) == f"{path}: {caught.value.problem}"
    return caught.value.problem


# --- task trees: reading ------------------------------------------------------------------


def test_load_yaml_tree(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        id: t
        goal: demo
        tasks:
          - {id: a, tool: echo, args: {text: hi}}
          - {id: b, tool: echo, depends_on: [a], args: {text: "${tasks.a.result}"}}
        """,
    )
    tree = load_tree(path)
    assert (tree.id, [t.id for t in tree.tasks], tree.task("b").depends_on) == ("t", ["a", "b"], ["a"])


def test_load_tab_indented_json_tree(tmp_path: Path) -> None:
    path = write(tmp_path, '{\n\t"id": "t",\n\t"tasks": [{"id": "a", "tool": "echo"}]\n}\n', "tree.json")
    assert load_tree(path).tasks[0].tool == "echo"


def test_load_tree_under_a_tree_key(tmp_path: Path) -> None:
    path = write(tmp_path, "tree:\n  id: t\n  tasks: [{id: a, tool: echo}]\n")
    assert load_tree(path).id == "t"


def test_tree_key_must_stand_alone(tmp_path: Path) -> None:
    path = write(tmp_path, "tree: {id: t, tasks: [{id: a, tool: echo}]}\nid: other\n")
    assert tree_problems(path) == ["top level: 'tree' must be the only key, found also 'id'"]


def test_malformed_yaml(tmp_path: Path) -> None:
    path = write(tmp_path, "id: t\ntasks:\n  - id: a\n    tool: echo: now\n")
    assert file_problem(path) == "YAML syntax error at line 4, column 15: mapping values are not allowed here"


def test_malformed_json(tmp_path: Path) -> None:
    path = write(tmp_path, '{"id": "t",\n "tasks": [{"id": "a" "tool": "echo"}]}', "tree.json")
    assert file_problem(path) == "JSON syntax error at line 2, column 23: Expecting ',' delimiter"


@pytest.mark.parametrize(
    ("text", "got"),
    [("- id: a\n", "a list"), ("", "nothing (empty document)"), ("just words\n", "a string")],
    ids=["a list", "an empty file", "a scalar"],
)
def test_tree_file_must_hold_a_mapping(tmp_path: Path, text: str, got: str) -> None:
    assert file_problem(write(tmp_path, text)) == (
        f"expected a mapping with 'id' and 'tasks' (or a single 'tree:' mapping), got {got}"
    )


def test_missing_file(tmp_path: Path) -> None:
    assert file_problem(tmp_path / "absent.yaml") == "no such file"


# --- task trees: model errors named by task ---------------------------------------------------


def test_bad_enum_names_the_task_and_field(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        id: t
        tasks:
          - {id: other, tool: echo}
          - {id: fetch, tool: echo, execution_target: cloud}
        """,
    )
    assert tree_problems(path) == [
        "task 'fetch': execution_target: Input should be 'auto', 'server', 'client' or 'any'"
    ]


def test_model_errors_without_an_id_name_the_task_by_number(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        id: t
        goal: [not, text]
        tasks:
          - {id: a, tool: echo, retries: 3, depends_on: [b, 7]}
          - {tool: echo}
        """,
    )
    assert tree_problems(path) == [
        "goal: Input should be a valid string",
        "task 'a': depends_on[1]: Input should be a valid string",
        "task 'a': retries: Extra inputs are not permitted",
        "task #2: id: Field required",
    ]


# --- task trees: whole-tree checks run on load ------------------------------------------------


def test_duplicate_ids(tmp_path: Path) -> None:
    path = write(tmp_path, "id: t\ntasks: [{id: a, tool: echo}, {id: a, tool: echo}]\n")
    assert tree_problems(path) == ["task 'a': id is used by more than one task (tasks #1 and #2)"]


def test_unknown_dependency(tmp_path: Path) -> None:
    path = write(tmp_path, "id: t\ntasks: [{id: a, tool: echo}, {id: b, tool: echo, depends_on: [zz]}]\n")
    assert tree_problems(path) == ["task 'b': depends_on names unknown task 'zz'"]


def test_cycle_is_named(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        id: t
        tasks:
          - {id: a, tool: echo, depends_on: [b]}
          - {id: b, tool: echo, depends_on: [c]}
          - {id: c, tool: echo, depends_on: [a]}
        """,
    )
    assert tree_problems(path) == ["dependency cycle: a -> b -> c -> a"]


def test_reference_to_a_task_outside_depends_on(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        id: t
        tasks:
          - {id: a, tool: echo}
          - {id: b, tool: echo, args: {text: "${tasks.a.result}"}}
        """,
    )
    assert tree_problems(path) == ["task 'b': args.text: references task 'a', which is not in depends_on"]


def test_argument_schema_mismatch_against_the_given_registry(tmp_path: Path) -> None:
    schema = {"type": "object", "properties": {"timezone": {"type": "string"}}}
    registry = {"get_time": ToolSpec(name="get_time", location=Location.SERVER, input_schema=schema)}
    path = write(tmp_path, "id: t\ntasks: [{id: x, tool: get_time, args: {timezone: 5}}]\n")
    assert load_tree(path).task("x").args == {"timezone": 5}  # without a registry: not checked
    assert tree_problems(path, registry=registry) == ["task 'x': args.timezone: 5 is not of type 'string'"]


# --- registry files -------------------------------------------------------------------------------


def test_load_registry_normalises_the_prefer_shorthands(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        tools:
          - {name: drive, location: prefer_server, type: mcp, mcp_server: gdrive}
          - {name: notes, location: prefer_client, offline_strategy: fallback}
          - {name: read_local_file, location: client, type: native}
        """,
        "registry.yaml",
    )
    tools = load_registry(path)
    assert list(tools) == ["drive", "notes", "read_local_file"]
    assert (tools["drive"].location, tools["drive"].prefer) == (Location.BOTH, Side.SERVER)
    assert (tools["notes"].location, tools["notes"].prefer) == (Location.BOTH, Side.CLIENT)
    assert tools["notes"].offline_strategy is OfflineStrategy.FALLBACK


def test_registry_duplicate_names(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "tools:\n  - {name: x, location: server}\n  - {name: y, location: server}\n  - {name: x, location: client}\n",
        "registry.yaml",
    )
    assert registry_problems(path) == ["tool 'x': name is used by more than one tool (tools #1 and #3)"]


def test_registry_model_errors_name_the_tool(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        tools:
          - {name: a, location: cloud}
          - {name: b, location: prefer_server, prefer: client}
          - {name: c, location: server, type: mcp}
          - {location: server}
        extra: 1
        """,
        "registry.yaml",
    )
    assert registry_problems(path) == [
        (
            "tool 'a': location: Input should be 'server', 'client' or 'both' "
            "(or the shorthand 'prefer_server' or 'prefer_client')"
        ),
        "tool 'b': location 'prefer_server' contradicts prefer 'client'; drop one",
        "tool 'c': type 'mcp' needs mcp_server (the server's name in mcpServers)",
        "tool #4: name: Field required",
        "extra: Extra inputs are not permitted",
    ]


def test_registry_checks_input_schemas_and_self_fallback(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        tools:
          - {name: a, location: server, input_schema: {type: 12}}
          - {name: b, location: client, offline_strategy: fallback, fallback_tool: b}
        """,
        "registry.yaml",
    )
    assert registry_problems(path) == [
        "tool 'a': input_schema: 12 is not valid under any of the given schemas",
        "tool 'b': fallback_tool names the tool itself",
    ]


def test_registry_file_must_hold_a_mapping(tmp_path: Path) -> None:
    path = write(tmp_path, "- {name: a, location: server}\n", "registry.yaml")
    with pytest.raises(
        InvalidFile, match=r"expected a mapping with 'tools' \(and optionally 'engines'\), got a list"
    ):
        load_registry(path)


def test_engines_in_the_registry_file(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        tools: [{name: web_search, location: server}]
        engines:
          - id: eng_literature_review
            tools:
              server: [web_search]
              client: [read_local_file]
              auto_fallback: true
          - {id: eng_flat, server: [web_search]}
        """,
        "registry.yaml",
    )
    assert load_engines(path) == {
        "eng_literature_review": Engine(
            id="eng_literature_review",
            server=("web_search",),
            client=("read_local_file",),
            auto_fallback=True,
        ),
        "eng_flat": Engine(id="eng_flat", server=("web_search",)),
    }
    assert list(load_registry(path)) == ["web_search"]


def test_engine_problems(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        engines:
          - {id: e, server: [a], auto_fallback: maybe}
          - {id: e, colour: blue}
        """,
        "registry.yaml",
    )
    assert registry_problems(path) == [
        "engine 'e': id is used by more than one engine (engines #1 and #2)",
        "engine 'e': auto_fallback: Input should be a valid boolean, unable to interpret input",
        "engine 'e': colour: Extra inputs are not permitted",
    ]


def test_engines_must_be_a_list(tmp_path: Path) -> None:
    path = write(tmp_path, "engines: {id: e}\n", "registry.yaml")
    assert registry_problems(path) == ["engines: expected a list of engines, got a mapping"]


def test_the_shipped_examples_load() -> None:
    assert "read_local_file" in load_registry(EXAMPLES / "registry.yaml")
    assert load_tree(EXAMPLES / "night-batch.yaml").id == "night-batch"


# --- layering registries --------------------------------------------------------------------------

SCHEMA = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
DISCOVERED = ToolSpec(
    name="search",
    location=Location.SERVER,
    type=ToolType.MCP,
    mcp_server="gdrive",
    description="from the MCP server",
    input_schema=SCHEMA,
)


def test_a_later_layer_keeps_what_it_does_not_set() -> None:
    declared = ToolSpec.model_validate(
        {"name": "search", "location": "prefer_client", "offline_strategy": "queue"}
    )
    merged = merge_registry({"search": DISCOVERED}, {"search": declared})["search"]
    assert (merged.location, merged.prefer, merged.offline_strategy) == (
        Location.BOTH,
        Side.CLIENT,
        OfflineStrategy.QUEUE,
    )
    assert (merged.type, merged.mcp_server, merged.description, merged.input_schema) == (
        ToolType.MCP,
        "gdrive",
        "from the MCP server",
        SCHEMA,
    )


def test_a_later_layer_overrides_what_it_sets() -> None:
    declared = ToolSpec(
        name="search", location=Location.CLIENT, input_schema={"type": "object"}, description="mine"
    )
    merged = merge_registry({"search": DISCOVERED}, {"search": declared})["search"]
    assert (merged.location, merged.input_schema, merged.description) == (
        Location.CLIENT,
        {"type": "object"},
        "mine",
    )


def test_where_a_tool_runs_is_decided_as_a_whole_by_the_later_layer() -> None:
    base = ToolSpec.model_validate(
        {"name": "t", "location": "prefer_client", "offline_strategy": "fallback", "fallback_tool": "u"}
    )
    merged = merge_registry({"t": base}, {"t": ToolSpec(name="t", location=Location.SERVER)})["t"]
    assert (merged.location, merged.prefer, merged.offline_strategy, merged.fallback_tool) == (
        Location.SERVER,
        None,
        None,
        None,
    )


def test_merge_keeps_tools_of_every_layer_and_copies() -> None:
    first = {"a": ToolSpec(name="a", location=Location.SERVER)}
    second = {"b": ToolSpec(name="b", location=Location.CLIENT)}
    merged = merge_registry(first, second, {})
    assert list(merged) == ["a", "b"]
    merged.pop("a")
    assert "a" in first


def test_spec_from_descriptor() -> None:
    descriptor = ToolDescriptor(name="search", type=ToolType.MCP, mcp_server="gdrive", input_schema=SCHEMA)
    spec = spec_from_descriptor(descriptor, Location.SERVER)
    assert spec == ToolSpec(
        name="search", location=Location.SERVER, type=ToolType.MCP, mcp_server="gdrive", input_schema=SCHEMA
    )
    assert "description" not in spec.model_fields_set  # so a registry file may add one


def test_what_an_mcp_server_said_of_a_tool_survives_discovery_and_a_registry_override() -> None:
    hints = {"destructiveHint": True, "readOnlyHint": False}
    descriptor = ToolDescriptor(
        name="git_reset", type=ToolType.MCP, mcp_server="git", title="Reset", annotations=hints, meta={"k": 1}
    )
    discovered = spec_from_descriptor(descriptor, Location.SERVER)
    assert (discovered.title, discovered.annotations, discovered.meta) == ("Reset", hints, {"k": 1})
    override = ToolSpec(name="git_reset", location=Location.BOTH)  # a registry file moves it only
    merged = merge_registry({"git_reset": discovered}, {"git_reset": override})["git_reset"]
    assert (merged.location, merged.title, merged.annotations, merged.meta) == (
        Location.BOTH,
        "Reset",
        hints,
        {"k": 1},
    )


def test_a_registry_file_may_state_a_tools_annotations_in_either_spelling(tmp_path: Path) -> None:
    path = tmp_path / "registry.yaml"
    path.write_text(
        dedent(
            """
            tools:
              - name: wipe
                location: client
                type: native
                title: Wipe a folder
                annotations: {destructive_hint: true, openWorldHint: false}
            """
        )
    )
    assert load_registry(path)["wipe"].annotations == {"destructiveHint": True, "openWorldHint": False}


def test_a_registry_file_with_an_output_schema_that_is_no_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "registry.yaml"
    path.write_text("tools:\n  - {name: wipe, location: client, type: native, output_schema: {type: 5}}\n")
    with pytest.raises(InvalidRegistry, match=r"tool 'wipe': output_schema: 5 is not valid"):
        load_registry(path)


def test_a_registry_file_with_an_annotation_of_the_wrong_type_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "registry.yaml"
    path.write_text(
        "tools:\n  - {name: wipe, location: client, type: native, annotations: {destructiveHint: maybe}}\n"
    )
    with pytest.raises(
        InvalidRegistry, match=r"tool 'wipe': annotations.destructiveHint: Input should be a valid boolean"
    ):
        load_registry(path)


def test_spec_from_descriptor_refuses_an_invalid_tool_name() -> None:
    descriptor = ToolDescriptor(name="has space", type=ToolType.NATIVE)
    with pytest.raises(
        ConfigError,
        match=r"^tool 'has space' cannot be registered: name: 'has space' is not a valid id: use letters",
    ):
        spec_from_descriptor(descriptor, Location.CLIENT)
