"""Task-tree and registry files (layer: brain/core; the only module of the pure core that reads files).

One job: turn a YAML/JSON file into validated models, with errors a user can act
on — the file, the task or tool by name, the field, the problem. Also the pure
registry merge that layers file specs over discovered ones.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from pydantic import TypeAdapter, ValidationError

from brain.core import safeyaml
from brain.core.models import Location, RegistryFile, TaskTree, ToolSpec
from brain.core.routing import Engine
from brain.core.validation import check_tree, numbered
from brain.errors import ConfigError, InvalidFile, InvalidRegistry, InvalidTaskTree
from workers.contracts import ToolDescriptor

# Default of max_tree_bytes: far above any hand-written tree or registry file.
MAX_TREE_BYTES = 4 * 1024 * 1024
_ENGINES = TypeAdapter(list[Engine])

# Fields that together say *where and how* a tool runs: a later registry layer that
# names a tool decides them as a whole, so no half-inherited, contradictory mix arises.
_DECISION_FIELDS = frozenset({"location", "prefer", "offline_strategy", "fallback_tool"})


# --- task trees ---------------------------------------------------------------------

_TREE_EXPECTED = "'id' and 'tasks' (or a single 'tree:' mapping)"


def load_tree(
    path: str | Path, registry: Mapping[str, ToolSpec] | None = None, *, max_bytes: int = MAX_TREE_BYTES
) -> TaskTree:
    """Read and validate a task tree file (YAML or JSON).

    The file holds the tree's fields (``id``, ``goal``, ``tasks``) at the top level or
    under a single ``tree:`` key. Whole-tree checks (``brain.core.validation.check_tree``)
    run too, against ``registry`` when given; without one, only the checks that need
    no registry (ids, dependencies, cycles, references).

    Raises InvalidFile (unreadable, bad syntax, not a mapping, over ``max_bytes``, YAML
    aliases that expand beyond ``safeyaml.MAX_ALIAS_EXPANSION``) or InvalidTaskTree.
    """
    return tree_from_data(_read_mapping(path, _TREE_EXPECTED, max_bytes), registry, source=str(path))


def tree_from_data(
    data: Mapping[str, Any], registry: Mapping[str, ToolSpec] | None = None, *, source: str = "<tree>"
) -> TaskTree:
    """Validate a tree given as data (a parsed file, a program's dict), as ``load_tree`` does."""
    if not isinstance(data, Mapping):
        raise InvalidFile(source, f"expected a mapping with {_TREE_EXPECTED}, got {_kind(data)}")
    data = _unwrap_tree(dict(data), source)
    try:
        tree = TaskTree.model_validate(data)
    except ValidationError as exc:
        raise InvalidTaskTree(source, _error_lines(exc, data.get("tasks"), ("tasks",), "task", "id")) from exc
    check_tree(tree, registry or {}, source=source)
    return tree


def _unwrap_tree(data: dict[str, Any], source: str) -> dict[str, Any]:
    if "tree" not in data:
        return data
    beside = sorted(str(k) for k in data if k != "tree")
    if beside:
        listed = ", ".join(repr(k) for k in beside)
        raise InvalidTaskTree(source, [f"top level: 'tree' must be the only key, found also {listed}"])
    inner = data["tree"]
    if not isinstance(inner, dict):
        raise InvalidFile(source, f"'tree' must be a mapping with 'id' and 'tasks', got {_kind(inner)}")
    return inner


# --- registry -----------------------------------------------------------------------


def load_registry(path: str | Path) -> dict[str, ToolSpec]:
    """Read and validate a registry file: ``tools:`` (seed 000 §3), optionally ``engines:``.

    Returns tool name → spec. Raises InvalidFile or InvalidRegistry (every problem of
    the file, engines included).
    """
    return _load_registry_file(path)[0]


def load_engines(path: str | Path) -> dict[str, Engine]:
    """The think-process engines (seed 000 §8) of a registry file: engine id → engine."""
    return _load_registry_file(path)[1]


def _load_registry_file(path: str | Path) -> tuple[dict[str, ToolSpec], dict[str, Engine]]:
    source = str(path)
    data = dict(_read_mapping(path, "'tools' (and optionally 'engines')"))
    # RegistryFile forbids unknown keys and knows only tools; engines are parsed here.
    raw_engines = data.pop("engines", [])
    problems: list[str] = []
    tools = _parse_tools(data, problems)
    engines = _parse_engines(raw_engines, problems)
    if problems:
        raise InvalidRegistry(source, problems)
    return tools, engines


def _parse_tools(data: dict[str, Any], problems: list[str]) -> dict[str, ToolSpec]:
    raw = data.get("tools")
    problems += _duplicates(raw, "tool", "name")
    try:
        parsed = RegistryFile.model_validate(data)
    except ValidationError as exc:
        problems += _error_lines(exc, raw, ("tools",), "tool", "name")
        return {}
    tools: dict[str, ToolSpec] = {}
    for spec in parsed.tools:
        tools.setdefault(spec.name, spec)
        problems += _spec_problems(spec)
    return tools


def _spec_problems(spec: ToolSpec) -> list[str]:
    problems = []
    try:
        Draft202012Validator.check_schema(spec.input_schema)
    except SchemaError as exc:
        problems.append(f"tool {spec.name!r}: input_schema: {exc.message}")
    if spec.output_schema is not None:
        try:
            Draft202012Validator.check_schema(spec.output_schema)
        except SchemaError as exc:
            problems.append(f"tool {spec.name!r}: output_schema: {exc.message}")
    if spec.fallback_tool == spec.name:
        problems.append(f"tool {spec.name!r}: fallback_tool names the tool itself")
    return problems


def _parse_engines(raw: Any, problems: list[str]) -> dict[str, Engine]:
    if raw is None:
        return {}
    if not isinstance(raw, list):
        problems.append(f"engines: expected a list of engines, got {_kind(raw)}")
        return {}
    problems += _duplicates(raw, "engine", "id")
    try:
        engines = _ENGINES.validate_python(raw)
    except ValidationError as exc:
        problems += _error_lines(exc, raw, (), "engine", "id")
        return {}
    return {engine.id: engine for engine in engines}


def _duplicates(raw: Any, noun: str, key: str) -> list[str]:
    if not isinstance(raw, list):
        return []
    numbers: dict[str, list[int]] = {}
    for number, item in enumerate(raw, start=1):
        if isinstance(item, dict) and isinstance(item.get(key), str):
            numbers.setdefault(item[key], []).append(number)
    return [
        f"{noun} {name!r}: {key} is used by more than one {noun} ({noun}s {numbered(found)})"
        for name, found in numbers.items()
        if len(found) > 1
    ]


# --- registry layers (pure) -----------------------------------------------------------


def merge_registry(*layers: Mapping[str, ToolSpec]) -> dict[str, ToolSpec]:
    """Layer registries; a later layer overrides an earlier one, tool by tool.

    The rule, for a tool named in both: the later spec's location, prefer,
    offline_strategy and fallback_tool win as a whole (they are one decision, and
    mixing them could contradict). Every other field the later spec sets explicitly
    wins; a field it leaves unset (type, mcp_server, description, input_schema,
    timeout_s, max_wait_s) keeps the earlier value. So a registry file entry that
    only says ``location: client`` keeps the input_schema an MCP server reported.
    """
    merged: dict[str, ToolSpec] = {}
    for layer in layers:
        for name, spec in layer.items():
            merged[name] = _overlay(merged[name], spec) if name in merged else spec
    return merged


def _overlay(base: ToolSpec, top: ToolSpec) -> ToolSpec:
    inherited = {
        field: value
        for field, value in base.model_dump(exclude_unset=True).items()
        if field not in top.model_fields_set and field not in _DECISION_FIELDS
    }
    return ToolSpec.model_validate({**inherited, **top.model_dump(exclude_unset=True)})


def spec_from_descriptor(d: ToolDescriptor, location: Location) -> ToolSpec:
    """The tool spec of a discovered or announced tool, placed at ``location``.

    Only what the descriptor states is set, so ``merge_registry`` lets a registry file
    add to it. Raises ConfigError when the descriptor does not make a valid spec
    (e.g. a name that is not a valid tool name).
    """
    try:
        return ToolSpec.model_validate({**d.model_dump(exclude_unset=True), "location": location})
    except ValidationError as exc:
        problems = "; ".join(_error_lines(exc, None, (), "tool", "name"))
        raise ConfigError(f"tool {d.name!r} cannot be registered: {problems}") from exc


# --- reading and error wording --------------------------------------------------------


def _read_mapping(path: str | Path, expected: str, max_bytes: int = MAX_TREE_BYTES) -> dict[str, Any]:
    source = str(path)
    try:
        raw = _read_bounded(Path(path), max_bytes)
        if len(raw) > max_bytes:
            raise InvalidFile(source, _too_big(max_bytes))
        text = raw.decode("utf-8")
    except FileNotFoundError:
        raise InvalidFile(source, "no such file") from None
    except UnicodeDecodeError as exc:
        raise InvalidFile(source, f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise InvalidFile(source, f"cannot read the file: {exc.strerror or exc}") from None
    data = _parse(text, source)
    if not isinstance(data, dict):
        raise InvalidFile(source, f"expected a mapping with {expected}, got {_kind(data)}")
    return data


def _read_bounded(path: Path, max_bytes: int) -> bytes:
    """At most ``max_bytes + 1`` bytes: enough to tell the file is too big without reading it all."""
    with path.open("rb") as f:
        return f.read(max_bytes + 1)


def _too_big(max_bytes: int) -> str:
    return (
        f"the file is larger than the limit of {max_bytes} bytes (max_tree_bytes in vancetope.toml "
        "or VANCETOPE_MAX_TREE_BYTES); split the tree or raise the limit"
    )


def _parse(text: str, source: str) -> Any:
    """YAML or JSON, told apart by content.

    JSON goes to ``json`` first: PyYAML (YAML 1.1) rejects tab-indented JSON.
    """
    json_error: json.JSONDecodeError | None = None
    if text.lstrip().startswith(("{", "[")):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            json_error = exc  # may still be flow-style YAML
        except RecursionError:
            raise InvalidFile(source, "the JSON is nested too deeply to read") from None
    try:
        return safeyaml.load(text)
    except safeyaml.YAMLTooLarge as exc:
        raise InvalidFile(source, str(exc)) from None
    except yaml.YAMLError as exc:
        if json_error is not None and source.endswith(".json"):
            raise InvalidFile(
                source,
                f"JSON syntax error at line {json_error.lineno}, column {json_error.colno}: {json_error.msg}",
            ) from None
        raise InvalidFile(source, _yaml_problem(exc)) from None


def _yaml_problem(exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "invalid YAML"
        if mark is not None:
            return f"YAML syntax error at line {mark.line + 1}, column {mark.column + 1}: {problem}"
        return f"YAML syntax error: {problem}"
    return f"YAML syntax error: {exc}"


def _kind(value: Any) -> str:
    if value is None:
        return "nothing (empty document)"
    names = {
        dict: "a mapping",
        list: "a list",
        str: "a string",
        bool: "a boolean",
        int: "a number",
        float: "a number",
    }
    return names.get(type(value), type(value).__name__)


def _error_lines(exc: ValidationError, items: Any, prefix: tuple[str, ...], noun: str, key: str) -> list[str]:
    """pydantic errors as ``task 'fetch': execution_target: Input should be …`` lines.

    An error located under ``prefix + (index, …)`` is attributed to the item at that
    index of ``items`` (the raw list), by its ``key`` when it has one, else by number.
    """
    lines: list[str] = []
    for error in exc.errors():
        loc = tuple(error["loc"])
        who = ""
        index = loc[len(prefix)] if loc[: len(prefix)] == prefix and len(loc) > len(prefix) else None
        if isinstance(index, int):
            who = _label(items, index, noun, key)
            loc = loc[len(prefix) + 1 :]
        line = ": ".join(part for part in (who, _format_loc(loc), _message(error, loc)) if part)
        if line not in lines:
            lines.append(line)
    return lines


def _label(items: Any, index: int, noun: str, key: str) -> str:
    item = items[index] if isinstance(items, list) and index < len(items) else None
    if isinstance(item, dict) and isinstance(item.get(key), str) and item[key]:
        return f"{noun} {item[key]!r}"
    return f"{noun} #{index + 1}"


def _format_loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _message(error: Any, loc: tuple[Any, ...]) -> str:
    message = str(error["msg"])
    for noise in ("Value error, ", "Assertion failed, "):
        message = message.removeprefix(noise)
    if error["type"] == "enum" and loc == ("location",):
        message += " (or the shorthand 'prefer_server' or 'prefer_client')"
    return message
