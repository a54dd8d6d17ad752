"""The morning summary of a run (layer: brain/core; pure).

One job: from a tree's record and its task records, say what the run did — how many tasks
are done, failed, expired, skipped, still waiting for a client, still in flight — and for
whom the waiting work waits (which client of which user must come online, with which
tools). Records in, a ``RunSummary`` out, and its Markdown; storing and sending it is
``brain.runtime.summary_sinks`` / ``brain.runtime.schedule_runs``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from brain.core.models import TaskRecord, TaskState, TreeRecord, TreeStatus
from brain.core.transitions import FAN_OUT_WAIT, IN_FLIGHT, PARKED, RETRY_WAIT

# How many failed/skipped tasks a summary names one by one (the counts are always whole).
MAX_LISTED = 50


class SummaryKind(StrEnum):
    FINAL = "final"  # the run ended
    DEADLINE = "deadline"  # its schedule's deadline passed while it was still going


class SummaryCounts(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    total: int = 0
    done: int = 0
    failed: int = 0
    expired: int = 0
    skipped: int = 0
    not_triggered: int = 0  # its run_if did not hold (a notify when nothing failed)
    waiting: int = 0  # blocked or pending_client: waiting for a client
    in_flight: int = 0  # queued or running (a for_each task: its items are)
    retrying: int = 0  # an attempt failed; the next one waits for its time
    pending: int = 0  # waiting for upstream tasks


class TaskLine(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    task_id: str
    tool: str
    state: TaskState
    reason: str = ""


class RetriedLine(BaseModel):
    """A task that needed more than one attempt: how many, the last failed one's error."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    task_id: str
    tool: str
    state: TaskState
    attempts: int  # attempts made so far, the current one included
    last_error: str = ""


class FanOutLine(BaseModel):
    """A for_each task: how many items it made, and how they ended."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    task_id: str
    tool: str
    state: TaskState
    items: int
    done: int
    failed: int  # failed, skipped or expired


class WaitingFor(BaseModel):
    """Work that waits until a client comes online: ``client_id`` of ``user`` (None: any client
    of ``user`` that offers the tools)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    user: str | None
    client_id: str | None
    tasks: list[str]
    tools: list[str]


class RunSummary(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    tree_id: str
    name: str  # the tree's own id
    schedule: str | None = None
    kind: SummaryKind
    at: float
    status: TreeStatus
    user: str | None = None
    submitted_at: float
    finished_at: float | None = None
    counts: SummaryCounts
    failed: list[TaskLine] = Field(default_factory=list)
    skipped: list[TaskLine] = Field(default_factory=list)
    waiting_for: list[WaitingFor] = Field(default_factory=list)
    retried: list[RetriedLine] = Field(default_factory=list)
    fan_outs: list[FanOutLine] = Field(default_factory=list)


def summarise(tree: TreeRecord, tasks: Sequence[TaskRecord], kind: SummaryKind, at: float) -> RunSummary:
    """The summary of ``tree`` as its ``tasks`` stand at time ``at``."""
    return RunSummary(
        tree_id=tree.tree_id,
        name=tree.tree.id,
        schedule=tree.schedule,
        kind=kind,
        at=at,
        status=tree.status,
        user=tree.user,
        submitted_at=tree.submitted_at,
        finished_at=tree.finished_at,
        counts=count(tasks),
        failed=_lines(tasks, {TaskState.FAILED, TaskState.EXPIRED}),
        skipped=_lines(tasks, {TaskState.SKIPPED}),
        waiting_for=waiting_for(tree, tasks),
        retried=retried(tasks),
        fan_outs=fan_outs(tasks),
    )


def count(tasks: Sequence[TaskRecord]) -> SummaryCounts:
    states = [t.state for t in tasks]
    return SummaryCounts(
        total=len(states),
        done=states.count(TaskState.DONE),
        failed=states.count(TaskState.FAILED),
        expired=states.count(TaskState.EXPIRED),
        skipped=states.count(TaskState.SKIPPED),
        not_triggered=states.count(TaskState.NOT_TRIGGERED),
        waiting=sum(s in PARKED for s in states),
        in_flight=sum(s in IN_FLIGHT or s in FAN_OUT_WAIT for s in states),
        retrying=sum(s in RETRY_WAIT for s in states),
        pending=states.count(TaskState.PENDING),
    )


def _lines(tasks: Sequence[TaskRecord], states: set[TaskState]) -> list[TaskLine]:
    return [
        TaskLine(task_id=t.task_id, tool=t.tool, state=t.state, reason=t.reason)
        for t in tasks
        if t.state in states
    ][:MAX_LISTED]


def retried(tasks: Sequence[TaskRecord]) -> list[RetriedLine]:
    """Tasks with a failed attempt behind them, and what the last one failed with."""
    lines = []
    for t in tasks:
        if not t.attempts:
            continue
        last = t.attempts[-1].error
        lines.append(
            RetriedLine(
                task_id=t.task_id,
                tool=t.tool,
                state=t.state,
                attempts=len(t.attempts) + (t.state is not TaskState.RETRYING),
                last_error=f"{last.type}: {last.message}" if last else "",
            )
        )
    return lines[:MAX_LISTED]


def fan_outs(tasks: Sequence[TaskRecord]) -> list[FanOutLine]:
    """Each for_each task with its items' outcomes so far."""
    items: dict[str, list[TaskState]] = {}
    for t in tasks:
        if t.parent is not None:
            items.setdefault(t.parent, []).append(t.state)
    return [
        FanOutLine(
            task_id=t.task_id,
            tool=t.tool,
            state=t.state,
            items=t.fan_out or 0,
            done=items.get(t.task_id, []).count(TaskState.DONE),
            failed=sum(
                s in (TaskState.FAILED, TaskState.SKIPPED, TaskState.EXPIRED)
                for s in items.get(t.task_id, [])
            ),
        )
        for t in tasks
        if t.fan_out is not None
    ][:MAX_LISTED]


def waiting_for(tree: TreeRecord, tasks: Sequence[TaskRecord]) -> list[WaitingFor]:
    """Waiting work grouped by whom it waits for, as the parked lists own it (``owner_of``):
    a task taken back from a client waits for that client; an interactive session's work for
    its client; an autonomous run's for any client of its user."""
    groups: dict[tuple[str | None, str | None], tuple[list[str], list[str]]] = {}
    for t in tasks:
        if t.state not in PARKED:
            continue
        key = (tree.user, t.client_id or tree.client_id)
        ids, tools = groups.setdefault(key, ([], []))
        ids.append(t.task_id)
        if t.tool not in tools:
            tools.append(t.tool)
    return [
        WaitingFor(user=user, client_id=client_id, tasks=ids, tools=tools)
        for (user, client_id), (ids, tools) in groups.items()
    ]


def whom(w: WaitingFor) -> str:
    if w.client_id and w.user:
        return f"client `{w.client_id}` of user `{w.user}`"
    if w.client_id:
        return f"client `{w.client_id}`"
    if w.user:
        return f"any client of user `{w.user}` offering {', '.join(f'`{t}`' for t in w.tools)}"
    return "a client (the run names no user: set `user` on the schedule)"


def render_markdown(summary: RunSummary) -> str:
    """The summary as a short Markdown report (a file, a chat message)."""
    c = summary.counts
    title = summary.schedule or summary.name
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(summary.at))
    heading = "deadline reached, still running" if summary.kind is SummaryKind.DEADLINE else summary.status
    lines = [
        f"# {title}: {heading}",
        "",
        f"Run `{summary.tree_id}`" + (f" for user `{summary.user}`" if summary.user else "") + f", {when}.",
        "",
        (
            "| done | failed | expired | skipped | not triggered | waiting for a client | in flight | retrying "
            "| pending | total |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|",
        "| "
        + " | ".join(
            map(
                str,
                (c.done, c.failed, c.expired, c.skipped, c.not_triggered, c.waiting, c.in_flight, c.retrying),
            )
        )
        + f" | {c.pending} | {c.total} |",
    ]
    if summary.waiting_for:
        lines += ["", "## Waiting for a client to come online", ""]
        lines += [f"- {whom(w)}: {len(w.tasks)} task(s) ({', '.join(w.tasks)})" for w in summary.waiting_for]
    if summary.fan_outs:
        lines += ["", "## Fan-outs", ""]
        lines += [
            f"- `{f.task_id}` ({f.tool}, {f.state}): {f.items} items, {f.done} done, {f.failed} failed"
            for f in summary.fan_outs
        ]
    if summary.retried:
        lines += ["", "## Retried", ""]
        lines += [
            f"- `{r.task_id}` ({r.tool}, {r.state}): {r.attempts} attempts; the last failed one: "
            f"{r.last_error or 'no error recorded'}"
            for r in summary.retried
        ]
    for heading_text, items in (("Failed", summary.failed), ("Skipped", summary.skipped)):
        if items:
            lines += ["", f"## {heading_text}", ""]
            lines += [
                f"- `{t.task_id}` ({t.tool}, {t.state}): {t.reason or 'no reason recorded'}" for t in items
            ]
    return "\n".join(lines) + "\n"


def shown_summary(
    tree: TreeRecord, tasks: Sequence[TaskRecord], stored: Sequence[RunSummary], now: float
) -> RunSummary | None:
    """The summary ``vancetope status`` and the web view show: the stored final one, else the
    latest stored one, else — for a tree that has ended (e.g. one run by hand) — one made now
    from its records."""
    finals = [s for s in stored if s.kind is SummaryKind.FINAL]
    if finals:
        return finals[-1]
    if tree.status is not TreeStatus.RUNNING:
        return summarise(tree, tasks, SummaryKind.FINAL, tree.finished_at or now)
    return stored[-1] if stored else None
