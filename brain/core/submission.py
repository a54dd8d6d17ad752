"""Checking a tree someone submits against the running brain (layer: brain, pure on its inputs).

One rule for every way in — `vancetope run`, the Python API, the ``vancetope.submit_tree``
Celery task, a schedule's fire: the tree is valid against the registry in use (its engines
and named pools included), a chosen run id is well-formed, and tools nobody offers yet are
reported, not refused (a client may announce them later).
"""

from __future__ import annotations

import re

from brain.core.models import TaskTree
from brain.core.snapshot import RegistrySnapshot
from brain.core.validation import check_tree, unknown_tools
from brain.errors import InvalidTaskTree
from workers.contracts import TREE_ID_PATTERN

_TREE_ID = re.compile(TREE_ID_PATTERN)


def check_submission(
    tree: TaskTree,
    registry: RegistrySnapshot,
    *,
    source: str,
    tree_id: str | None = None,
    announced: frozenset[str] = frozenset(),
) -> list[str]:
    """Raise ``InvalidTaskTree`` listing every problem; return warnings (unknown tools)."""
    if tree_id is not None and not _TREE_ID.match(tree_id):
        raise InvalidTaskTree(
            source,
            [
                f"tree_id {tree_id!r}: use letters, digits, '_', '.', '-' (max 128, starting with a letter or digit)"
            ],
        )
    check_tree(tree, registry.tools, source=source, engines=registry.engines, pools=registry.pools)
    return unknown_tools(tree, registry.tools.keys() | announced)


__all__ = ["check_submission"]
