"""What a submission is, and the check of a submitted tree against the running brain (layer:
brain/core, pure on its inputs).

Every way in — `vancetope run`, the Python API, a ``submit.<user>`` message, the MCP gateway,
a schedule's fire — builds one ``SubmitRequest`` and hands it to ``Scheduler.accept``, the one
submission path. One rule for all: the tree is valid against the registry in use (its
engines and named pools included), a chosen run id is well-formed, and tools nobody offers
yet are reported, not refused (a client may announce them later); then the tree's size and
its user's quota (``brain.core.limits``), before anything is written.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field

from brain.core.models import SessionKind, TaskTree, TreeRecord
from brain.core.snapshot import RegistrySnapshot
from brain.core.validation import check_tree, unknown_tools
from brain.errors import InvalidTaskTree
from workers.contracts import TREE_ID_PATTERN

_TREE_ID = re.compile(TREE_ID_PATTERN)


class SubmitRequest(BaseModel):
    """A tree to run and who runs it, whichever way it came in."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tree: TaskTree
    # Where it came from, for every message about it: a file path, "submit_tree (message …)",
    # "tools/call echo", a schedule's tree file.
    source: str
    session: SessionKind = SessionKind.AUTONOMOUS
    user: str | None = None
    client_id: str | None = None  # bound to this client agent (an interactive session's)
    tree_id: str | None = None  # the run's id, when the caller chooses it (idempotent ways in)
    schedule: str | None = None  # the `[[schedules]]` entry that fired it


class Accepted(BaseModel):
    """A submission recorded: its tree's record, and the warnings (tools nobody offers yet)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    record: TreeRecord
    warnings: list[str] = Field(default_factory=list)


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


__all__ = ["Accepted", "SubmitRequest", "check_submission"]
