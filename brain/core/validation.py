"""Whole-tree validation and argument references (layer: brain/core; pure).

One job: decide whether a parsed task tree can run, and fill in the references
between its tasks. Field-level checks already happened in ``brain.core.models``; here
are the checks that need the whole tree or the registry: duplicate ids, unknown
or cyclic dependencies, references to tasks outside ``depends_on``, arguments
against the tool's input_schema, execution_target against the tool's location, and the
server pools named against the configured ones (``brain.core.pools``).

References: a string argument ``${tasks.<id>.result}`` or ``${tasks.<id>.result.a.0}``
is replaced by (a part of) an upstream task's result. The task must be named
directly in ``depends_on``; reaching it transitively is not enough, because the
reference is also the reader's only hint of which result flows where.

Unknown tools: ``unknown_tools`` names every tool that nothing declares (the registry, where
a ``location: client`` entry is known while its client is offline, and parks) and nothing
announces (the connected clients the run may use), with a "did you mean" over every known
name; ``brain.core.submission`` makes them problems of the submission.
"""

from __future__ import annotations

import difflib
import heapq
import json
import re
from collections import deque
from collections.abc import Collection, Container, Iterable, Iterator, Mapping, Sequence
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, ValidationError
from referencing.exceptions import Unresolvable

from brain.core.models import ID_BODY, ExecutionTarget, Location, TaskSpec, TaskTree, ToolSpec
from brain.core.pools import tree_pool_problems
from brain.core.routing import Engine
from brain.errors import BrainError, InvalidTaskTree
from workers import argcheck

# Ids may contain dots, so the id part is lazy and the regex backtracks to the first ".result"
# that ends the reference; task ids never hold a ".result" part (brain.core.models.check_task_id),
# so that first one is the right one.
# ``.result`` is the convenient value; ``.mcp`` the whole MCP CallToolResult (content blocks);
# ``.status`` how the task ended (done, failed, skipped, ...) and ``.error`` its error
# ({type, message, data}, or null): what a clean-up or notify task (run_if) reads.
_REF = re.compile(
    r"\$\{tasks\.(?P<task>"
    + ID_BODY
    + r"?)\.(?P<root>results|result|mcp|status|error)(?P<path>(?:\.[^.}]+)*)\}"
)
_REF_START = "${tasks."

# Schema keywords whose verdict on a container does not depend on the values inside it,
# so they are still checked above an argument that holds a (not yet known) reference.
_SHAPE_KEYWORDS = frozenset(
    [
        "type",
        "required",
        "additionalProperties",
        "propertyNames",
        "minProperties",
        "maxProperties",
        "dependentRequired",
        "minItems",
        "maxItems",
    ]
)

_Path = tuple[str | int, ...]


class UnresolvedReference(BrainError):
    """A ``${tasks.<id>.result...}`` reference names a result, or a part of one, that does not exist."""

    def __init__(self, task_ref: str, path: str, detail: str = "", root: str = "result") -> None:
        self.task_ref = task_ref
        self.path = path
        self.detail = detail
        ref = "${tasks." + task_ref + f".{root}" + (f".{path}" if path else "") + "}"
        super().__init__(f"cannot resolve {ref}: {detail or f'task {task_ref!r} has no result at {path!r}'}")


# --- whole-tree validation ----------------------------------------------------------


def validate_tree(tree: TaskTree, registry: Mapping[str, ToolSpec], *, source: str) -> list[str]:
    """Every problem of ``tree``, one line each, naming the task and the field; [] when valid.

    ``source`` (the file) is not repeated in the lines: ``check_tree`` puts it in front.
    """
    del source  # part of the signature so both entry points read alike
    ids = {t.id for t in tree.tasks}
    problems = [*_duplicate_ids(tree), *_dependency_problems(tree, ids), *_cycles(tree, ids)]
    validators: dict[str, Draft202012Validator | str] = {}
    for task in tree.tasks:
        problems += _task_problems(task, ids, registry, validators)
    return problems


def tree_problems(
    tree: TaskTree,
    registry: Mapping[str, ToolSpec],
    *,
    source: str,
    engines: Mapping[str, Engine] | None = None,
    pools: Collection[str] | None = None,
) -> list[str]:
    """Every problem of ``tree`` (``validate_tree``, its engine's and its pools'), one line each."""
    problems = validate_tree(tree, registry, source=source)
    if engines is not None:
        problems += engine_problems(tree, engines, registry)
    if pools is not None:
        problems += tree_pool_problems(tree, registry, pools)
    return problems


def check_tree(
    tree: TaskTree,
    registry: Mapping[str, ToolSpec],
    *,
    source: str,
    engines: Mapping[str, Engine] | None = None,
    pools: Collection[str] | None = None,
) -> None:
    """Raise ``InvalidTaskTree(source, problems)`` unless ``tree`` is valid. ``pools``: the
    configured named pools; when given, a pool name the tree or its tools use must be one."""
    problems = tree_problems(tree, registry, source=source, engines=engines, pools=pools)
    if problems:
        raise InvalidTaskTree(source, problems)


def engine_problems(
    tree: TaskTree, engines: Mapping[str, Engine], registry: Mapping[str, ToolSpec] | None = None
) -> list[str]:
    """A tree run under a think-process engine may call only that engine's tools (seed 000 §8),
    including the ``fallback_tool`` a tool of the registry would fall back to."""
    if tree.engine is None:
        return []
    engine = engines.get(tree.engine)
    if engine is None:
        known = ", ".join(sorted(engines)) or "none are defined"
        return [f"engine: {tree.engine!r} is not an engine of the registry ({known})"]
    problems = []
    for task in tree.tasks:
        for tool in task.toolset:
            if not engine.allows(tool):
                problems.append(f"task {task.id!r}: tool {tool!r} is not allowed by engine {engine.id!r}")
                continue
            spec = (registry or {}).get(tool)
            fallback = spec.fallback_tool if spec is not None else None
            if fallback is not None and not engine.allows(fallback):
                problems.append(
                    f"task {task.id!r}: tool {tool!r} falls back to fallback_tool {fallback!r}, which engine "
                    f"{engine.id!r} does not allow; list {fallback!r} under the engine's server tools "
                    f"or remove the fallback_tool"
                )
    return problems


def unknown_tools(
    tree: TaskTree, known: Container[str], names: Iterable[str] = (), note: str = ""
) -> list[str]:
    """Problems for tools that nothing declares and nothing announces: not in the registry
    (where a ``location: client`` entry makes a tool known while no client is connected) and
    not announced by a connected client this run may use. ``known``: those names; ``names``:
    every tool name known anywhere, for "did you mean" (difflib); ``note``: words to add (an
    MCP server that failed to start)."""
    candidates = sorted(set(names))
    problems = []
    for task in tree.tasks:
        if task.tool not in known:
            problems.append(
                f"task {task.id!r}: tool {task.tool!r} is unknown: no registry entry declares it and no "
                f"connected client this run may use announces it{did_you_mean(task.tool, candidates)}{note}"
            )
        for name in task.tools:
            if name != task.tool and name not in known:
                problems.append(
                    f"task {task.id!r}: tools lists {name!r}, which is unknown (not in the registry, not "
                    f"announced){did_you_mean(name, candidates)}"
                )
    return problems


def did_you_mean(name: str, candidates: list[str]) -> str:
    """``; did you mean `a` or `b`?`` with up to three close names of ``candidates``, else ""."""
    close = difflib.get_close_matches(name, candidates, n=3)
    return "; did you mean " + " or ".join(f"`{c}`" for c in close) + "?" if close else ""


def topological_order(tree: TaskTree) -> list[str]:
    """Task ids, dependencies first; among tasks ready at the same time, file order.

    The tree must be valid (``check_tree``); raises ValueError otherwise.
    """
    position = {t.id: i for i, t in enumerate(tree.tasks)}
    if len(position) != len(tree.tasks):
        raise ValueError(f"tree {tree.id!r} has duplicate task ids; validate it first")
    waiting = {t.id: set(t.depends_on) for t in tree.tasks}
    dependents: dict[str, list[str]] = {t.id: [] for t in tree.tasks}
    for task in tree.tasks:
        for dep in set(task.depends_on) & dependents.keys():
            dependents[dep].append(task.id)
    ready = [position[tid] for tid, deps in waiting.items() if not deps]
    heapq.heapify(ready)
    order: list[str] = []
    while ready:
        tid = tree.tasks[heapq.heappop(ready)].id
        order.append(tid)
        for dependent in dependents[tid]:
            waiting[dependent].discard(tid)
            if not waiting[dependent]:
                heapq.heappush(ready, position[dependent])
    if len(order) != len(tree.tasks):
        placed = set(order)
        stuck = [t.id for t in tree.tasks if t.id not in placed]
        raise ValueError(f"tree {tree.id!r}: tasks {stuck} can never run (cycle or unknown dependency)")
    return order


def _duplicate_ids(tree: TaskTree) -> list[str]:
    seen: dict[str, list[int]] = {}
    for number, task in enumerate(tree.tasks, start=1):
        seen.setdefault(task.id, []).append(number)
    return [
        f"task {tid!r}: id is used by more than one task (tasks {numbered(numbers)})"
        for tid, numbers in seen.items()
        if len(numbers) > 1
    ]


def numbered(numbers: list[int]) -> str:
    """``#2, #4 and #7``: which entries of a file clash."""
    marked = [f"#{n}" for n in numbers]
    return ", ".join(marked[:-1]) + " and " + marked[-1]


def _dependency_problems(tree: TaskTree, ids: set[str]) -> list[str]:
    problems = []
    for task in tree.tasks:
        for dep in task.depends_on:
            if dep == task.id:
                problems.append(f"task {task.id!r}: depends_on names the task itself")
            elif dep not in ids:
                problems.append(f"task {task.id!r}: depends_on names unknown task {dep!r}")
    return problems


# --- cycles ---------------------------------------------------------------------------


def _cycles(tree: TaskTree, ids: set[str]) -> list[str]:
    """One ``dependency cycle: a -> b -> a`` line per tangle; ``a -> b`` reads "a depends on b".

    Self-dependencies are reported by ``_dependency_problems``; with duplicate ids the
    first task of that id stands for it.
    """
    graph: dict[str, list[str]] = {}
    for task in tree.tasks:
        graph.setdefault(task.id, [d for d in dict.fromkeys(task.depends_on) if d in ids and d != task.id])
    order = {tid: i for i, tid in enumerate(graph)}
    found = []
    for component in _strongly_connected(graph, list(order)):
        if len(component) > 1:
            start = min(component, key=order.__getitem__)
            cycle = _shortest_cycle(start, graph, set(component))
            found.append((order[start], "dependency cycle: " + " -> ".join(cycle)))
    return [line for _, line in sorted(found)]


def _strongly_connected(graph: dict[str, list[str]], order: list[str]) -> list[list[str]]:
    """Tarjan's algorithm, iterative so a long chain of tasks cannot exhaust the stack."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def enter(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)

    for root in order:
        if root in index:
            continue
        enter(root)
        work: list[tuple[str, Iterator[str]]] = [(root, iter(graph[root]))]
        while work:
            node, successors = work[-1]
            for nxt in successors:
                if nxt not in index:
                    enter(nxt)
                    work.append((nxt, iter(graph[nxt])))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    components.append(_pop_component(node, stack, on_stack))
    return components


def _pop_component(node: str, stack: list[str], on_stack: set[str]) -> list[str]:
    component = []
    while True:
        member = stack.pop()
        on_stack.discard(member)
        component.append(member)
        if member == node:
            return component


def _shortest_cycle(start: str, graph: dict[str, list[str]], members: set[str]) -> list[str]:
    previous: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for nxt in graph[node]:
            if nxt == start:
                path = [node]
                while path[-1] != start:
                    path.append(previous[path[-1]])
                return [*reversed(path), start]
            if nxt in members and nxt not in previous:
                previous[nxt] = node
                queue.append(nxt)
    raise AssertionError(f"{start!r} is in a strongly connected component but on no cycle")


# --- per task -----------------------------------------------------------------------


def _task_problems(
    task: TaskSpec,
    ids: set[str],
    registry: Mapping[str, ToolSpec],
    validators: dict[str, Draft202012Validator | str],
) -> list[str]:
    problems = []
    if task.tools and task.tool not in task.tools:
        problems.append(f"task {task.id!r}: tool {task.tool!r} is not in its tools list {task.tools}")
    problems += _reference_problems(task, ids)
    problems += _for_each_problems(task, ids)
    spec = registry.get(task.tool)
    if spec is not None:
        problems += _schema_problems(task, spec, validators)
    problems += _target_problems(task, registry)
    return problems


def _for_each_problems(task: TaskSpec, ids: set[str]) -> list[str]:
    """``for_each`` must be one reference to a dependency's result (brain.core.fanout)."""
    if task.for_each is None:
        if task.max_fan_out is not None:
            return [f"task {task.id!r}: max_fan_out applies only with for_each"]
        return []
    where = f"task {task.id!r}: for_each {task.for_each!r}"
    found = _REF.fullmatch(task.for_each)
    if found is None or found["root"] not in ("result", "results"):
        return [f"{where}: write one reference to a dependency's list, ${{tasks.<id>.result.<path>}}"]
    ref = found["task"]
    if ref not in ids:
        return [f"{where}: references unknown task {ref!r}"]
    if ref not in task.depends_on:
        return [f"{where}: references task {ref!r}, which is not in depends_on"]
    return []


def _strings(value: Any, path: _Path = ()) -> Iterator[tuple[_Path, str]]:
    """Every string inside ``value`` (dict values, list items), with its path."""
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _strings(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _strings(item, (*path, i))


def _scan(text: str) -> tuple[list[str], list[str]]:
    """The task ids referenced in ``text``, and the malformed ``${tasks.`` snippets."""
    tasks, malformed = [], []
    start = text.find(_REF_START)
    while start != -1:
        match = _REF.match(text, start)
        if match is None:
            end = text.find("}", start)
            malformed.append(text[start : end + 1] if end != -1 else text[start:])
            start = text.find(_REF_START, start + len(_REF_START))
        else:
            tasks.append(match["task"])
            start = text.find(_REF_START, match.end())
    return tasks, malformed


def _reference_problems(task: TaskSpec, ids: set[str]) -> list[str]:
    problems = []
    for path, text in _strings(task.args):
        where = f"task {task.id!r}: {argcheck.where(path)}"
        referenced, malformed = _scan(text)
        for ref in dict.fromkeys(referenced):
            if ref not in ids:
                problems.append(f"{where}: references unknown task {ref!r}")
            elif ref not in task.depends_on:
                problems.append(f"{where}: references task {ref!r}, which is not in depends_on")
        for snippet in malformed:
            problems.append(
                f"{where}: malformed reference {snippet!r}: "
                "write ${tasks.<id>.result}, ${tasks.<id>.result.<path>}, ${tasks.<id>.mcp.<path>}, "
                "${tasks.<id>.status} or ${tasks.<id>.error}"
            )
    return problems


def _schema_problems(
    task: TaskSpec, spec: ToolSpec, validators: dict[str, Draft202012Validator | str]
) -> list[str]:
    validator = _validator(spec.name, spec.input_schema, validators)
    if isinstance(validator, str):
        return [f"task {task.id!r}: tool {spec.name!r} has an invalid input_schema: {validator}"]
    try:
        return _arg_problems(task, validator)
    except Unresolvable as exc:
        return [f"task {task.id!r}: tool {spec.name!r} has an input_schema with an unresolvable $ref: {exc}"]


def _arg_problems(task: TaskSpec, validator: Draft202012Validator) -> list[str]:
    """The task's arguments against one schema (``argcheck`` wording, as every route words it);
    an argument holding a reference or an item's placeholder is judged only by its shape."""
    # An item's placeholder (${item}, or the name `as:` gives) is as unknown here as a result.
    item_start = "${" + task.item_name if task.for_each is not None else None
    opaque = [
        path
        for path, text in _strings(task.args)
        if _REF_START in text or (item_start is not None and item_start in text)
    ]
    errors = list(validator.iter_errors(task.args))
    kept = [e for e in errors if not _depends_on_reference(e, opaque)]
    return [f"task {task.id!r}: {problem}" for problem in argcheck.problems(kept)]


def _validator(
    key: str, schema: dict[str, Any], cache: dict[str, Draft202012Validator | str]
) -> Draft202012Validator | str:
    """A validator for ``schema`` (cached under ``key``), or the schema's own problem as a string."""
    if key not in cache:
        try:
            Draft202012Validator.check_schema(schema)
            cache[key] = Draft202012Validator(schema)
        except SchemaError as exc:
            cache[key] = exc.message
    return cache[key]


# --- arguments of tools only clients describe ---------------------------------------------

# The input schema of a registry entry that says nothing of the arguments.
_ANY_OBJECT: dict[str, Any] = {"type": "object"}


def announced_arg_problems(
    tree: TaskTree,
    registry: Mapping[str, ToolSpec],
    announced: Mapping[str, Sequence[dict[str, Any]]],
) -> list[str]:
    """Arguments against the input schema a client announced, for each task whose tool only
    clients describe: not in the registry, or a ``location: client`` entry whose schema says
    nothing but "an object". ``announced``: tool name -> the schemas of the clients this run
    may use that announce it. Refused only when every one of them refuses the arguments (the
    router may pick any), with the first's problems, worded as a registry tool's are. A schema
    that is itself invalid, or whose $ref cannot be resolved, is not enforced (the agent does
    not enforce it either)."""
    problems: list[str] = []
    validators: dict[str, Draft202012Validator | str] = {}
    for task in tree.tasks:
        schemas = announced.get(task.tool)
        spec = registry.get(task.tool)
        if not schemas or (
            spec is not None and (spec.location is not Location.CLIENT or spec.input_schema != _ANY_OBJECT)
        ):
            continue
        found = [_announced_problems(task, schema, validators) for schema in schemas]
        if all(found):
            problems += found[0]
    return problems


def _announced_problems(
    task: TaskSpec, schema: dict[str, Any], validators: dict[str, Draft202012Validator | str]
) -> list[str]:
    validator = _validator(json.dumps(schema, sort_keys=True), schema, validators)
    if isinstance(validator, str):
        return []
    try:
        return _arg_problems(task, validator)
    except Unresolvable:
        return []


def _depends_on_reference(error: ValidationError, opaque: list[_Path]) -> bool:
    """True when the error may only be the placeholder string standing in for a result."""
    at = tuple(error.absolute_path)
    for ref in opaque:
        if at[: len(ref)] == ref:
            return True
        if ref[: len(at)] == at and error.validator not in _SHAPE_KEYWORDS:
            return True
    return False


def _target_problems(task: TaskSpec, registry: Mapping[str, ToolSpec]) -> list[str]:
    target = task.execution_target
    if target not in (ExecutionTarget.SERVER, ExecutionTarget.CLIENT):
        return []
    problems = []
    for name in dict.fromkeys([task.tool, *task.tools]):
        spec = registry.get(name)
        if spec is None:
            continue
        if target is ExecutionTarget.CLIENT and spec.location is Location.SERVER:
            problems.append(
                f"task {task.id!r}: execution_target is 'client' but tool {name!r} runs only on the server"
            )
        if target is ExecutionTarget.SERVER and spec.location is Location.CLIENT:
            problems.append(
                f"task {task.id!r}: execution_target is 'server' but tool {name!r} runs only on a client"
            )
    return problems


# --- resolving references -----------------------------------------------------------


def resolve_args(
    args: dict[str, Any],
    results: Mapping[str, Any],
    wholes: Mapping[str, Any] | None = None,
    statuses: Mapping[str, str] | None = None,
    errors: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """``args`` with every reference replaced by upstream results (``results``: task id →
    result; ``wholes``: task id → its whole MCP result, for ``${tasks.<id>.mcp...}``;
    ``statuses`` and ``errors``: task id → its state and its error, or None).

    A string that is exactly one reference becomes the referenced value, of any JSON
    type; references inside longer strings are interpolated (JSON text for non-strings).
    Raises ``UnresolvedReference`` when a referenced task or path does not exist.
    """
    # ``results``: a for_each task's result is the list of its items' results.
    roots = {
        "result": results,
        "results": results,
        "mcp": wholes or {},
        "status": statuses or {},
        "error": errors or {},
    }
    return {key: _resolve(value, roots) for key, value in args.items()}


def _resolve(value: Any, roots: Mapping[str, Mapping[str, Any]]) -> Any:
    if isinstance(value, str):
        return _resolve_text(value, roots)
    if isinstance(value, dict):
        return {key: _resolve(item, roots) for key, item in value.items()}
    if isinstance(value, list):
        return [_resolve(item, roots) for item in value]
    return value


def _resolve_text(text: str, roots: Mapping[str, Mapping[str, Any]]) -> Any:
    if _REF_START not in text:
        return text
    whole = _REF.fullmatch(text)
    if whole is not None:
        return _lookup(whole["task"], whole["root"], whole["path"], roots)
    return _REF.sub(lambda m: _as_text(_lookup(m["task"], m["root"], m["path"], roots)), text)


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def _lookup(task: str, root: str, dotted: str, roots: Mapping[str, Mapping[str, Any]]) -> Any:
    path = dotted.removeprefix(".")
    found = roots[root]
    if root in ("result", "results") and task not in found:
        raise UnresolvedReference(task, path, f"task {task!r} has no result (yet)", root)
    if root in ("status", "error") and task not in found:
        raise UnresolvedReference(task, path, f"task {task!r} has not ended (yet)", root)
    if root == "mcp" and found.get(task) is None:
        why = "(yet)" if task not in roots["result"] else "(its tool is not an MCP tool)"
        raise UnresolvedReference(task, path, f"task {task!r} has no MCP result {why}", root)
    value = found[task]
    walked = root
    for segment in path.split(".") if path else []:
        value = _step(value, segment, task, path, walked, root)
        walked += f".{segment}"
    return value


def _step(value: Any, segment: str, task: str, path: str, walked: str, root: str) -> Any:
    where = f"the {walked} of task {task!r}"
    if isinstance(value, dict):
        if segment in value:
            return value[segment]
        raise UnresolvedReference(task, path, f"{where} has no key {segment!r}", root)
    if isinstance(value, list):
        if not segment.isdigit():
            raise UnresolvedReference(task, path, f"{where} is a list; {segment!r} is not an index", root)
        if int(segment) >= len(value):
            raise UnresolvedReference(
                task, path, f"{where} has no index {segment} (it has {len(value)} item(s))", root
            )
        return value[int(segment)]
    raise UnresolvedReference(task, path, f"{where} is {type(value).__name__}, not an object or a list", root)
