"""Fan-out over a result: one task per item of a dependency's list (layer: brain/core; pure).

A task with ``for_each: "${tasks.<id>.result.<path>}"`` is not called itself. When it is
ready, its list is read and one *item task* is made per element, ``<id>[0]``, ``<id>[1]``, …:
the same tool, timeouts, retry policy and pool, its arguments with ``${item}`` (or the name
``as:`` gives) replaced by that element. Each item routes, parks and retries on its own. The
for_each task waits in ``fanned_out`` until every item has ended, then ends ``done`` with the
list of their results in order (``${tasks.<id>.results}``) if all are done, else ``failed``,
naming the items that were not; its dependents' ``run_if`` decides what that means to them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from typing import Any, overload

from brain.core.models import MAX_TASK_ID_CHARS, TaskRecord, TaskSpec, TaskState

_ITEM = re.compile(r"(?P<parent>.+)\[(?P<index>\d+)\]")


class FanOutError(ValueError):
    """A for_each task cannot fan out: its list is not one, is too long, or an item lacks what
    the arguments ask of it. The message names the task and what to change."""


def item_id(parent: str, index: int) -> str:
    return f"{parent}[{index}]"


class ItemIds(Sequence[str]):
    """The ids of a for_each task's ``size`` items in order, each made when it is read.
    Recording one item's result asks whether a sibling is unfinished, the last listed first,
    and is mostly answered by the first few; a list of all the ids, made for every item's
    result, made a fan-out of N items cost O(N²) (11 % of a pool child's time at 1,000 items,
    bench/README.md, ``fan_out_1000``)."""

    __slots__ = ("parent", "size")

    def __init__(self, parent: str, size: int) -> None:
        self.parent = parent
        self.size = size

    def __len__(self) -> int:
        return self.size

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> list[str]: ...

    def __getitem__(self, index: int | slice) -> str | list[str]:
        if isinstance(index, slice):
            return [item_id(self.parent, i) for i in range(*index.indices(self.size))]
        at = index + self.size if index < 0 else index
        if not 0 <= at < self.size:
            raise IndexError(f"item {index} of {self.size}")
        return item_id(self.parent, at)

    def __reversed__(self) -> Iterator[str]:
        for index in range(self.size - 1, -1, -1):
            yield item_id(self.parent, index)


def parent_of(task_id: str) -> str | None:
    """The for_each task an item task was made from, or None for any other task."""
    found = _ITEM.fullmatch(task_id)
    return found["parent"] if found else None


def items_of(spec: TaskSpec, value: Any, limit: int) -> list[Any]:
    """The list ``spec`` fans out over, checked: a list, of at most ``limit`` items."""
    if not isinstance(value, list):
        shown = type(value).__name__ if value is not None else "null"
        raise FanOutError(
            f"task {spec.id!r}: for_each {spec.for_each} is {shown}, not a list; point it at a list "
            "(e.g. ${tasks.<id>.result.items})"
        )
    if len(value) > limit:
        raise FanOutError(
            f"task {spec.id!r}: for_each {spec.for_each} has {len(value)} items, over max_fan_out "
            f"{limit}; raise max_fan_out (on the task, or the setting) or split the list"
        )
    return value


def item_specs(spec: TaskSpec, items: Sequence[Any]) -> list[TaskSpec]:
    """One spec per item: ``spec`` with the item put in its arguments, its id ``<id>[i]``."""
    specs = []
    for index, item in enumerate(items):
        task_id = item_id(spec.id, index)
        if len(task_id) > MAX_TASK_ID_CHARS:
            raise FanOutError(
                f"task {spec.id!r}: its item ids ({task_id!r}) would be over {MAX_TASK_ID_CHARS} "
                "characters; shorten the task id"
            )
        args = _put(spec.args, spec.item_name, item, f"task {task_id!r}")
        # model_copy: the item id's form is the brain's own, checked by TaskSpec on the way in.
        specs.append(
            spec.model_copy(update={"id": task_id, "args": args, "for_each": None, "max_fan_out": None})
        )
    return specs


def item_records(tree_id: str, specs: Sequence[TaskSpec], parent: str, now: float) -> list[TaskRecord]:
    return [
        TaskRecord(tree_id=tree_id, task_id=s.id, tool=s.tool, parent=parent, spec=s, updated_at=now)
        for s in specs
    ]


def gathered(items: Sequence[TaskRecord]) -> tuple[TaskState, list[Any], str]:
    """What a for_each task ends as once its items have (``items`` in order): done with their
    results, else failed, naming what was not done (a failed item's result is null)."""
    results = [r.result if r.state is TaskState.DONE else None for r in items]
    not_done = [r for r in items if r.state is not TaskState.DONE]
    if not not_done:
        return TaskState.DONE, results, ""
    shown = ", ".join(f"{r.task_id} {r.state.value}" for r in not_done[:5])
    more = f" and {len(not_done) - 5} more" if len(not_done) > 5 else ""
    return TaskState.FAILED, results, f"{len(not_done)} of {len(items)} items not done: {shown}{more}"


# --- ${item} in an item's arguments ----------------------------------------------------


def _put(value: Any, name: str, item: Any, where: str) -> Any:
    if isinstance(value, str):
        return _put_text(value, name, item, where)
    if isinstance(value, dict):
        return {key: _put(v, name, item, where) for key, v in value.items()}
    if isinstance(value, list):
        return [_put(v, name, item, where) for v in value]
    return value


def _pattern(name: str) -> re.Pattern[str]:
    return re.compile(r"\$\{" + re.escape(name) + r"(?P<path>(?:\.[^.}]+)*)\}")


def _put_text(text: str, name: str, item: Any, where: str) -> Any:
    pattern = _pattern(name)
    whole = pattern.fullmatch(text)
    if whole is not None:
        return _walk(item, whole["path"], name, where)
    return pattern.sub(lambda m: _as_text(_walk(item, m["path"], name, where)), text)


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def _walk(item: Any, dotted: str, name: str, where: str) -> Any:
    value = item
    walked = name
    for segment in dotted.removeprefix(".").split(".") if dotted else []:
        if isinstance(value, dict) and segment in value:
            value = value[segment]
        elif isinstance(value, list) and segment.isdigit() and int(segment) < len(value):
            value = value[int(segment)]
        else:
            raise FanOutError(f"{where}: ${{{name}{dotted}}}: {walked} has no {segment!r}")
        walked += f".{segment}"
    return value
