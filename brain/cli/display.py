"""How trees and tasks look in the terminal (layer: brain/cli; presentation). Pure: records in,
rich renderables out. Every value from a record goes in as ``Text``, never as a str: rich
reads a str as markup, and results, errors and tool names are anyone's text ("see [/x]"
made `vancetope status` crash; a client could name a tool to restyle the table)."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from rich import box
from rich.console import Group
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from brain.core.models import Progress, TaskRecord, TaskState, TreeRecord
from brain.core.transitions import QUEUED
from brain.hot.queues import QueuesReport

STATE_STYLE = {
    "pending": "dim",
    "queued_server": "cyan",
    "queued_client": "cyan",
    "running": "bold yellow",
    "awaiting_approval": "bold magenta",
    "blocked": "magenta",
    "pending_client": "magenta",
    "retrying": "bold cyan",
    "fanned_out": "cyan",
    "done": "green",
    "failed": "bold red",
    "skipped": "yellow",
    "expired": "red",
    "not_triggered": "dim green",
}


# How status shows a queued_server run waiting at the gate (a view, not a store state: the
# gate is Redis, docs/fair-share.md).
THROTTLED = "throttled"


def shown_state(rec: TaskRecord, running: Mapping[str, Mapping[str, Any]]) -> str:
    """The store's state. A run begun is ``running`` in the store (``Store.begin_run``, a
    client agent's ``ClientToolStarted``); a queued one shows ``running`` too when a worker
    began this very run without the store saying so: a pool older than that counted it in
    the store (``deliveries``), and a worker whose store was unreachable, or a client agent
    older than that message, marks it in Redis (``running``)."""
    if rec.state is TaskState.QUEUED_SERVER and rec.deliveries > 0:
        return TaskState.RUNNING.value
    mark = running.get(rec.task_id)
    if (
        rec.state is TaskState.QUEUED_SERVER
        and mark
        and "throttled" in mark
        and mark.get("run_id") == rec.run_id
    ):
        return THROTTLED
    if rec.state in QUEUED and mark and mark.get("run_id") == rec.run_id:
        return TaskState.RUNNING.value
    return rec.state.value


def progress_text(p: Progress) -> str:
    """``2/4 (50%) copying files`` from an MCP server's latest progress notification."""
    if p.total:
        text = f"{p.progress:g}/{p.total:g} ({100 * p.progress / p.total:.0f}%)"
    else:
        text = f"{p.progress:g}"
    return f"{text} {p.message}" if p.message else text


# Characters of a result shown in a table: one line at 80 columns beside the other columns.
PREVIEW_WIDTH = 40


def summarize(value: Any, width: int = 60) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str, separators=(",", ":"))
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def some_ids(ids: Sequence[str], shown: int = 20) -> str:
    """``ids`` joined, the first ``shown`` of them when there are more: a cancel of a fan-out of
    5,000 items printed all 5,000."""
    if len(ids) <= shown:
        return ", ".join(ids)
    return f"{', '.join(ids[:shown])} … and {len(ids) - shown:,} more"


def duration(rec: TaskRecord) -> str:
    if rec.started_at and rec.finished_at:
        return f"{rec.finished_at - rec.started_at:.2f}s"
    return ""


def task_table(
    tree: TreeRecord, records: Sequence[TaskRecord], running: Mapping[str, Mapping[str, Any]]
) -> Table:
    on = f" (schedule {tree.schedule})" if tree.schedule else ""
    # No outer edge and a rule under the head only: at 80 columns the result keeps room for a
    # preview instead of ten characters.
    table = Table(
        title=Text(f"tree {tree.tree_id}{on} — {tree.status.value}"),
        title_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
    )
    for col in ("task", "tool", "state", "route", "duration"):
        table.add_column(col, overflow="fold")
    # A result is a one-line preview (it wrapped over five lines at 80 columns; issue 22);
    # reasons and errors fold, as they are what a reader needs whole.
    table.add_column("result / reason", overflow="fold")
    shortened = False
    for rec in records:
        state = shown_state(rec, running)
        if rec.state is TaskState.DONE:
            detail = summarize(rec.result, PREVIEW_WIDTH)
            shortened |= detail.endswith("…")
        elif rec.error is not None:
            detail = rec.error.message
        elif state == THROTTLED:
            detail = f"throttled by {running[rec.task_id]['throttled']}"
        elif rec.state in QUEUED and rec.progress is not None:
            detail = progress_text(rec.progress)
        else:
            detail = rec.reason
        table.add_row(
            Text(rec.task_id),
            Text(rec.tool),
            Text(state, style=STATE_STYLE.get(state, "")),
            Text(rec.route),
            Text(duration(rec)),
            Text(detail, no_wrap=rec.state is TaskState.DONE, overflow="ellipsis"),
        )
    if shortened:
        table.caption = Text(f"whole results: vancetope status {tree.tree_id} TASK (or --json)")
        table.caption_justify = "left"
    return table


def progress(
    tree: TreeRecord, records: Sequence[TaskRecord], running: Mapping[str, Mapping[str, Any]]
) -> Group:
    counts = Counter(shown_state(r, running) for r in records)
    final = sum(1 for r in records if r.state.is_final)
    parts = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    # The bar in a grid row of its own: alone in a Group it ends no line, and the table's title
    # printed on the same line as it.
    bar = Table.grid()
    bar.add_row(ProgressBar(total=len(records), completed=final, width=40))
    return Group(
        Text(f"{tree.tree_id}: {final}/{len(records)} final — {parts}"),
        bar,
        task_table(tree, records, running),
    )


def trees_table(trees: Sequence[TreeRecord], counts: Mapping[str, Counter[str]]) -> Table:
    table = Table(title="task trees (newest first)", title_justify="left")
    for col in ("tree", "status", "session", "tasks", "submitted"):
        # fold, not "…": the tree id is what `vancetope status ID` and `cancel` need whole.
        table.add_column(col, overflow="fold")
    for t in trees:
        c = counts.get(t.tree_id, Counter())
        table.add_row(
            Text(t.tree_id),
            Text(t.status.value),
            Text(t.session.value + (f" (schedule {t.schedule})" if t.schedule else "")),
            Text(", ".join(f"{n} {s}" for s, n in sorted(c.items()))),
            Text(time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t.submitted_at))),
        )
    return table


def clients_table(
    enrolled: Mapping[str, Any],
    sessions: Mapping[str, Any],
    waiting: Mapping[str, int],
    misbehaving: Mapping[str, Any] | None = None,
    round_trips: Mapping[str, float | None] | None = None,
    last_seen: Mapping[str, float] | None = None,
) -> Table:
    """Enrolled clients, their sessions, round trips and tools, the parked work each could
    take, since when an offline one is gone, and why a suspended one is (brain.hot.misbehaving)."""
    marks = misbehaving or {}
    rtts = round_trips or {}
    seen = last_seen or {}
    table = Table(title="client agents", title_justify="left")
    for col in ("client", "user", "state", "type", "round trip", "tools", "waiting for it"):
        table.add_column(col, overflow="fold")
    for cid, enrollment in sorted(enrolled.items()):
        session = sessions.get(cid)
        tools = ", ".join(sorted(t.name for t in session.tools)) if session else ""
        held = sorted(t.name for t in getattr(session, "held_tools", ())) if session else []
        if held:  # brain.hot.toolpins: changed definitions, not routed to
            tools += f" (changed, held until `vancetope clients approve-tools {cid}`: {', '.join(held)})"
        wait = _waiting_for(
            waiting.get(f"client:{cid}", 0), waiting.get(f"user:{enrollment.user}", 0), enrollment.user
        )
        if cid in marks:
            state = Text(f"misbehaving: {marks[cid].shown()}", style="bold red")
        else:
            gone = (
                f" since {time.strftime('%Y-%m-%d %H:%M', time.localtime(seen[cid]))}" if cid in seen else ""
            )
            state = Text("connected", style="green") if session else Text(f"offline{gone}", style="dim")
        table.add_row(
            Text(cid),
            Text(enrollment.user),
            state,
            Text(session.client_type.value if session else ""),
            Text(_round_trip(rtts.get(cid)) if session else ""),
            Text(tools),
            Text(wait),
        )
    return table


def _round_trip(ms: float | None) -> str:
    if ms is None:
        return "?"  # an older agent, or no heartbeat measured yet
    return f"{ms:.0f} ms" if ms >= 10 else f"{ms:.1f} ms"


def _waiting_for(own: int, users: int, user: str) -> str:
    """Parked work this client could take: bound to it by name, and for any client of its user
    (an unbound tree's, which any of the user's clients may take)."""
    parts = [str(own)] if own else []
    if users:
        parts.append(f"{users} for any client of user {user}")
    return " + ".join(parts)


def queues_table(report: QueuesReport) -> Table:
    """Per server pool, client and user: the work waiting and who takes it; a queue with work
    and nobody consuming it is marked in bold red."""
    table = Table(title="queues", title_justify="left")
    for col in ("", "name", "queue", "waiting", "taken by"):
        table.add_column(col, overflow="fold")
    for p in report.pools:
        table.add_row(
            "pool",
            Text(p.pool),
            Text(p.queue),
            Text(f"{p.waiting}" + (f" (+{p.throttled} throttled at the gate)" if p.throttled else "")),
            _consumers(p.nobody_consuming, p.workers),
        )
    for c in report.clients:
        waiting = f"{c.waiting}" + (f" (+{c.parked} parked)" if c.parked else "")
        taken = (
            [f"client-agent@{c.client_id}" + (f", {c.taken} running" if c.taken else "")]
            if c.connected
            else []
        )
        table.add_row(
            Text(f"client ({c.user})"),
            Text(c.client_id),
            Text(c.queue),
            Text(waiting),
            _consumers(c.nobody_consuming, taken),
        )
    for u in report.users:
        table.add_row(
            "user",
            Text(u.user),
            Text(f"(parked: any client of user {u.user})"),
            Text(str(u.parked)),
            _consumers(u.nobody_consuming, u.connected_clients),
        )
    return table


def limits_table(report: QueuesReport) -> Table:
    """Per limit (and per server paused by a 429): what it allows, the calls waiting at the gate
    under it (per user), how many it holds itself, what runs and how fast calls go now."""
    table = Table(title="limits (the gate)", title_justify="left")
    for col in ("limit", "allows", "waiting", "held by it", "running", "rate now", "paused"):
        table.add_column(col, overflow="fold")
    for row in report.limits:
        allows = [
            f"{row.rate_limit}" if row.rate_limit else "",
            f"{row.max_concurrency} at once" if row.max_concurrency else "",
        ]
        users = ", ".join(f"{user or '-'}: {n}" for user, n in row.waiting_by_user.items())
        paused = (
            f"until {time.strftime('%H:%M:%S', time.localtime(row.paused_until))}: {row.paused_why}"
            if row.paused_until is not None
            else ""
        )
        table.add_row(
            Text(f"{row.scope} {row.name}"),
            Text(", ".join(a for a in allows if a) or "-"),
            Text(f"{row.waiting}" + (f" ({users})" if users else "")),
            Text(str(row.throttled)),
            Text(str(row.running) if row.max_concurrency else "-"),
            Text(f"{row.rate_per_s:g}/s"),
            Text(paused, style="yellow") if paused else Text(""),
        )
    return table


def _consumers(alarm: bool, names: Sequence[str]) -> Text:
    if alarm:
        return Text("NOBODY — work waiting, nobody consuming", style="bold red")
    return Text(", ".join(names)) if names else Text("nobody", style="dim")
