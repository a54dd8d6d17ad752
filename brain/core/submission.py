"""What a submission is, and the check of a submitted tree against the running brain (layer:
brain/core, pure on its inputs).

Every way in — `vancetope run`, the Python API, a ``submit.<user>`` message, the MCP gateway,
a schedule's fire — builds one ``SubmitRequest`` and hands it to ``Scheduler.accept``, the one
submission path. One rule for all: the tree is valid against the registry in use (its
engines and named pools included), a chosen run id is well-formed, and every tool is known:
declared by the registry (a ``location: client`` entry is known while its client is offline:
the task parks) or announced by a connected client the run may use. Every problem is named
at once, an unknown tool with "did you mean"; then the tree's size and its user's quota
(``brain.core.limits``), before anything is written.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from brain.core.models import SessionKind, TaskTree, TreeRecord
from brain.core.snapshot import RegistrySnapshot
from brain.core.toolnames import legacy_warning
from brain.core.validation import announced_arg_problems, tree_problems, unknown_tools
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
    gateway_call: bool = False  # one gateway tools/call (TreeRecord.gateway_call)


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
    elsewhere: frozenset[str] = frozenset(),
    announced_schemas: Mapping[str, Sequence[dict[str, Any]]] | None = None,
) -> list[str]:
    """Raise ``InvalidTaskTree`` listing every problem of the submission at once: a malformed
    run id, the tree's own (``tree_problems``: arguments against the registry's schemas
    included), arguments against the schemas clients announced for the tools only they
    describe (``announced_arg_problems``), and each tool nothing declares and nothing
    announces, with "did you mean". ``announced``: tools the connected clients this run may
    use offer, and ``announced_schemas`` their input schemas (``sessions.announced_schemas``);
    ``elsewhere``: other tool names known (other clients'), only for suggestions. A tool a name
    clash made ambiguous is not unknown: its route fails saying what to write. So a call with
    arguments its tool refuses is refused here on both routes, before anything runs.
    Returns warnings, for the ways in that print them: each tool name written in the
    deprecated ``<server>/<tool>`` form (it was read as ``<server>.<tool>``)."""
    problems = []
    if tree_id is not None and not _TREE_ID.match(tree_id):
        problems.append(
            f"tree_id {tree_id!r}: use letters, digits, '_', '.', '-' (max 128, starting with a letter or digit)"
        )
    problems += tree_problems(
        tree, registry.tools, source=source, engines=registry.engines, pools=registry.pools
    )
    if announced_schemas:
        problems += announced_arg_problems(tree, registry.tools, announced_schemas)
    known = registry.tools.keys() | announced | registry.clashes.keys()
    problems += unknown_tools(tree, known, names=known | elsewhere, note=_failed_servers(registry))
    if problems:
        raise InvalidTaskTree(source, problems)
    return legacy_name_warnings(tree, source)


def legacy_name_warnings(tree: TaskTree, source: str) -> list[str]:
    """One deprecation warning per task and ``<server>/<tool>`` name it was written with."""
    return [
        legacy_warning(f"{source}: task {spec.id!r}", name)
        for spec in tree.tasks
        for name in spec.legacy_names
    ]


def _failed_servers(registry: RegistrySnapshot) -> str:
    if not registry.mcp_failures:
        return ""
    names = ", ".join(repr(f.server) for f in registry.mcp_failures)
    return f" (MCP server(s) {names} failed to start, so their tools are missing)"


__all__ = ["Accepted", "SubmitRequest", "check_submission", "legacy_name_warnings"]
