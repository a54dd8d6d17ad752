"""What one tree, and one user's unfinished work, may hold (layer: brain/core; pure).

Issue 20: a tree of 100,000 tasks starved the server pool for every user. Every way in —
`vancetope run`, the Python API, a submit credential's queue, the MCP gateway, a schedule's
fire — meets the same limits: ``max_tree_bytes`` and ``max_tasks_per_tree`` before the tree
is parsed when it arrives as data (``check_tree_data``), and again on the parsed tree with the
user's quota of unfinished tasks when it is submitted (``check_limits``, in
``Scheduler.submit``). A refusal names the user, the numbers and the setting to change.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Protocol

from brain.core.models import TaskTree
from brain.errors import BrainError


class TreeLimits(Protocol):
    """The settings the limits read (``brain.config.Settings`` has them): core reads no config."""

    @property
    def max_tree_bytes(self) -> int: ...
    @property
    def max_tasks_per_tree(self) -> int: ...
    @property
    def max_unfinished_tasks_per_user(self) -> int: ...


class TreeRefused(BrainError):
    """A tree over one of the limits; nothing was recorded."""


def _setting(name: str) -> str:
    return f"{name} (VANCETOPE_{name.upper()})"


def check_tree_data(data: Any, settings: TreeLimits, *, source: str) -> None:
    """Refuse a tree given as data (a message, a gateway call) that is over ``max_tree_bytes``
    as JSON or lists more than ``max_tasks_per_tree`` tasks, before it is validated: parsing
    100,000 task models is the cost being refused."""
    size = len(json.dumps(data, default=str, separators=(",", ":")))
    if size > settings.max_tree_bytes:
        raise TreeRefused(
            f"{source}: refused: the tree is {size:,} bytes as JSON, over {_setting('max_tree_bytes')} "
            f"= {settings.max_tree_bytes:,}"
        )
    body = data.get("tree", data) if isinstance(data, Mapping) else None
    tasks = body.get("tasks") if isinstance(body, Mapping) else None
    if isinstance(tasks, list):
        _check_count(len(tasks), settings, source)


def check_limits(
    tree: TaskTree, settings: TreeLimits, *, source: str, user: str | None, unfinished: int
) -> None:
    """Refuse ``tree`` when it has more than ``max_tasks_per_tree`` tasks, or when with the
    ``unfinished`` tasks ``user`` already has it would pass ``max_unfinished_tasks_per_user``."""
    count = len(tree.tasks)
    _check_count(count, settings, source)
    quota = settings.max_unfinished_tasks_per_user
    if unfinished + count > quota:
        who = f"user {user!r}" if user else "runs without a user"
        raise TreeRefused(
            f"{source}: refused: {who} already has {unfinished:,} unfinished task(s); this tree's "
            f"{count:,} would pass {_setting('max_unfinished_tasks_per_user')} = {quota:,}. Wait for "
            "them to finish, cancel some, or raise the setting"
        )


def _check_count(count: int, settings: TreeLimits, source: str) -> None:
    if count > settings.max_tasks_per_tree:
        raise TreeRefused(
            f"{source}: refused: the tree has {count:,} tasks, over {_setting('max_tasks_per_tree')} "
            f"= {settings.max_tasks_per_tree:,}; split it into smaller trees or raise the setting"
        )


__all__ = ["TreeLimits", "TreeRefused", "check_limits", "check_tree_data"]
