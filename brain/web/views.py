"""What the web pages show, from the store's records (layer: brain/web; pure).

A tree's row (counts by state from ``brain.core.report``, as ``vancetope status`` counts them;
duration; what it waits for), a tree's graph laid out in columns by dependency depth, and its
timeline. Functions of their arguments (time comes in as ``now``): tests are tables.
"""

from __future__ import annotations

import math
import re
import time
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from brain.core.fanout import parent_of
from brain.core.models import TaskRecord, TaskState, TreeRecord
from brain.core.report import tree_summary
from brain.core.transitions import FINAL, PARKED
from brain.errors import BadQuery

# Node size and spacing of the graph, in SVG user units (px at zoom 1).
NODE_W = 200
NODE_H = 46
COL_GAP = 70
ROW_GAP = 10
MARGIN = 10

# Beyond this many nodes the graph draws groups (``collapse``): dagre lays out 1,000 nodes in
# about 0.2 s in Chromium here, and its time grows faster than the count.
MAX_NODES = 1000


def clock(at: float | None) -> str:
    """``HH:MM`` of a unix time in the web process's local time zone ('' for None)."""
    return time.strftime("%H:%M", time.localtime(at)) if at else ""


def seconds(span: float | None) -> str:
    """A duration as people read it: 850ms, 12.3s, 4m05s, 2h13m."""
    if span is None:
        return ""
    if span < 1:
        return f"{span * 1000:.0f}ms"
    if span < 60:
        return f"{span:.1f}s"
    if span < 3600:
        return f"{int(span // 60)}m{int(span % 60):02d}s"
    return f"{int(span // 3600)}h{int(span % 3600 // 60):02d}m"


@dataclass(frozen=True)
class Seen:
    """What the brain knows of clients now (``PresenceBook``): who is connected, and when each
    one's last session ended."""

    connected: frozenset[str]
    last_seen: Mapping[str, float]


def waits_for(
    tree: TreeRecord, tasks: Sequence[TaskRecord], now: float, seen: Seen | None = None
) -> list[str]:
    """What an unfinished tree waits for, one line per cause, e.g. "3 tasks waiting for
    client laptop (offline since 02:14)": with ``seen``, when that client went offline;
    without it (or never recorded), when its oldest task was parked."""
    if tree.status.value != "running":
        return []
    parked: dict[str, list[TaskRecord]] = defaultdict(list)
    approval: dict[str, int] = Counter()
    retrying: list[TaskRecord] = []
    for t in tasks:
        if t.state in PARKED:
            # Parked work of a tree bound to a client waits for that client (its record names
            # no client until it is sent).
            client = t.client_id or tree.client_id
            who = f"client {client}" if client else f"a client of user {tree.user or '?'}"
            parked[who].append(t)
        elif t.state is TaskState.AWAITING_APPROVAL:
            approval[t.client_id or "?"] += 1
        elif t.state is TaskState.RETRYING:
            retrying.append(t)
    lines = []
    for who, waiting in sorted(parked.items()):
        since = min((t.queued_at for t in waiting if t.queued_at), default=None)
        when = f" (parked since {clock(since)})" if since else ""
        client = who.removeprefix("client ") if who.startswith("client ") else None
        if seen is not None and client is not None and client not in seen.connected:
            gone = seen.last_seen.get(client)
            when = f" (offline since {clock(gone)})" if gone else when
        lines.append(f"{n_tasks(len(waiting))} waiting for {who}{when}")
    for cid, n in sorted(approval.items()):
        lines.append(f"{n_tasks(n)} awaiting its user's approval on client {cid}")
    if retrying:
        due = min((t.retry_at for t in retrying if t.retry_at), default=None)
        lines.append(f"{n_tasks(len(retrying))} retrying" + (f" (next at {clock(due)})" if due else ""))
    return lines


def n_tasks(n: int) -> str:
    return f"{n} task" if n == 1 else f"{n} tasks"


@dataclass(frozen=True)
class TreeRow:
    """One row of ``/trees``."""

    summary: dict[str, Any]  # brain.core.report.tree_summary: the shape `status --json` prints
    duration: str
    waits: list[str]


# The states whose records ``waits_for`` reads: /trees fetches only these tasks whole.
WAITING: frozenset[TaskState] = PARKED | {TaskState.AWAITING_APPROVAL, TaskState.RETRYING}


def tree_row(
    tree: TreeRecord,
    states: Mapping[str, TaskState],
    now: float,
    waiting: Sequence[TaskRecord] = (),
    seen: Seen | None = None,
) -> TreeRow:
    """``states``: every task's (``Store.task_states``); ``waiting``: the records of those in
    ``WAITING`` (more are ignored), so a big tree's row does not parse every record."""
    counts = Counter(state.value for state in states.values())
    end = tree.finished_at or now
    return TreeRow(
        tree_summary(tree, counts),
        seconds(max(end - tree.submitted_at, 0.0)),
        waits_for(tree, waiting, now, seen),
    )


def matches(tree: TreeRecord, status: str | None, user: str | None) -> bool:
    """The trees page's filters (None or '': any)."""
    return (not status or tree.status.value == status) and (not user or tree.user == user)


# ``?last=12h``: a number and a unit.
_LAST = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
LAST_CHOICES = ("1h", "12h", "24h", "7d", "30d")


def time_window(
    since: str | None, until: str | None, last: str | None, now: float
) -> tuple[float | None, float | None]:
    """The trees page's time filter as (since, until) unix times, either end open (None):
    ``since``/``until`` are ISO dates or times (``2026-12-06``, ``2026-12-06T02:00``; without a
    zone, the web process's local time, as the pages show times) or unix seconds; ``last`` is
    a span back from ``now`` (``90m``, ``12h``, ``7d``) in place of ``since``. A tree is in the
    window when it was submitted at or after ``since`` and before ``until``."""
    if last and since:
        raise BadQuery("give ?last= or ?since=, not both (?last=12h means since 12 hours ago)")
    start = _instant("since", since) if since else None
    if last:
        found = _LAST.fullmatch(last.strip())
        if found is None:
            raise BadQuery(f"?last={last!r}: give a number and a unit s, m, h, d or w, e.g. ?last=12h")
        start = now - float(found.group(1)) * _UNIT_S[found.group(2)]
    end = _instant("until", until) if until else None
    if start is not None and end is not None and start >= end:
        raise BadQuery(f"?since= must be before ?until= (got {since or last!r} and {until!r})")
    return start, end


def _instant(name: str, given: str) -> float:
    text = given.strip()
    try:
        seconds_since_epoch = float(text)
    except ValueError:
        pass
    else:
        if math.isfinite(seconds_since_epoch):
            return seconds_since_epoch
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise BadQuery(
            f"?{name}={given!r} is no time: give an ISO date or time (2026-12-06, 2026-12-06T02:00, "
            "2026-12-06T02:00+01:00) or unix seconds"
        ) from None
    return parsed.timestamp()  # naive: local time, as every time on the pages is shown


# --- the graph --------------------------------------------------------------------------


@dataclass(frozen=True)
class Node:
    """A task, or (``group`` set) a fan-out's items drawn as one node: ``task`` is then its
    first item and ``group`` its items counted by state."""

    task: TaskRecord
    col: int
    row: int
    group: dict[str, int] | None = None
    # A big tree's tasks of one tool at neighbouring depths drawn as one node (``collapse``):
    # its node id (``tool@depth`` or ``tool@first-last``; never a task id: ids hold no ``@``).
    collapsed: str | None = None

    @property
    def node_id(self) -> str:
        if self.collapsed is not None:
            return self.collapsed
        return group_id(self.task.parent or "") if self.group is not None else self.task.task_id

    @property
    def x(self) -> int:
        return MARGIN + self.col * (NODE_W + COL_GAP)

    @property
    def y(self) -> int:
        return MARGIN + self.row * (NODE_H + ROW_GAP)


@dataclass(frozen=True)
class Graph:
    nodes: list[Node]
    edges: list[tuple[str, str]]  # (from task id, to task id), from depends_on and fan-outs
    width: int
    height: int
    by_id: dict[str, Node] = field(default_factory=dict)
    # Task id -> the id of the node it is drawn in (itself, its fan-out's, or a collapsed group's).
    node_of: dict[str, str] = field(default_factory=dict)


def _graph(nodes: list[Node], edges: list[tuple[str, str]], node_of: dict[str, str]) -> Graph:
    cols = max((n.col for n in nodes), default=0) + 1
    rows = max((n.row for n in nodes), default=-1) + 1
    width = 2 * MARGIN + cols * NODE_W + (cols - 1) * COL_GAP
    height = 2 * MARGIN + rows * (NODE_H + ROW_GAP)
    return Graph(nodes, edges, width, height, {n.node_id: n for n in nodes}, node_of)


def dependencies(tree: TreeRecord, tasks: Sequence[TaskRecord]) -> dict[str, list[str]]:
    """Task id -> the task ids it waits for: its spec's ``depends_on`` (an item of a fan-out:
    its parent), and, for a task that depends on a fanned-out task, that task's items too."""
    specs = {s.id: s for s in tree.tree.tasks}
    known = {t.task_id for t in tasks}
    items: dict[str, list[str]] = defaultdict(list)
    for t in tasks:
        if t.parent is not None:
            items[t.parent].append(t.task_id)
    deps: dict[str, list[str]] = {}
    for t in tasks:
        if t.parent is not None:
            deps[t.task_id] = [t.parent] if t.parent in known else []
            continue
        spec = specs.get(t.task_id) or t.spec
        wanted = list(spec.depends_on) if spec is not None else []
        deps[t.task_id] = [d for d in wanted if d in known] + [i for d in wanted for i in items.get(d, ())]
    return deps


def layout(tree: TreeRecord, tasks: Sequence[TaskRecord], max_nodes: int = MAX_NODES) -> Graph:
    """Each task in the column of its dependency depth (the longest chain of dependencies
    before it), in the tree's order within a column; edges from ``depends_on`` and from a
    fanned-out task to its items (an item's dependents are drawn from the task it came from).
    More than ``max_nodes`` nodes: grouped (``collapse``)."""
    deps = dependencies(tree, tasks)
    depth: dict[str, int] = {}
    for t in tasks:  # a tree is acyclic (validation); iterative, so 10,000 deep cannot overflow
        if t.task_id in depth:
            continue
        stack = [t.task_id]
        while stack:
            top = stack[-1]
            waiting = [d for d in deps.get(top, ()) if d not in depth]
            if waiting:
                stack.extend(waiting)
                continue
            stack.pop()
            depth[top] = 1 + max((depth[d] for d in deps.get(top, ())), default=-1)
    # A fan-out's items are one node (×N): a for_each over 5,000 rows is one box, not 5,000.
    groups: dict[str, list[TaskRecord]] = defaultdict(list)
    for t in tasks:
        if t.parent is not None and t.parent in depth:
            groups[t.parent].append(t)
    shown = {t.task_id: group_id(t.parent or "") for items in groups.values() for t in items}
    rows: Counter[int] = Counter()
    nodes = []
    for t in tasks:
        if t.task_id in shown:
            if t is not groups[t.parent or ""][0]:
                continue
            counts = dict(Counter(i.state.value for i in groups[t.parent or ""]))
        else:
            counts = None
        col = depth[t.task_id]
        nodes.append(Node(t, col, rows[col], counts))
        rows[col] += 1
    parents = {t.task_id: t.parent for t in tasks}
    edges: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()
    for t in tasks:
        for d in deps[t.task_id]:
            # A dependent of a fan-out is drawn from the fanned-out task only, not from its items.
            if parents.get(d) is not None and parents[d] != t.task_id:
                continue
            edge = (shown.get(d, d), shown.get(t.task_id, t.task_id))
            if edge not in seen:
                seen.add(edge)
                edges.append(edge)
    graph = _graph(nodes, edges, {t.task_id: shown.get(t.task_id, t.task_id) for t in tasks})
    return collapse(graph, tasks, max_nodes)


def collapse(graph: Graph, tasks: Sequence[TaskRecord], max_nodes: int = MAX_NODES) -> Graph:
    """A graph of more than ``max_nodes`` nodes redrawn with one node per tool and column: the
    tasks of that tool at that dependency depth (at a range of depths, doubled until the
    nodes fit), counted by state like a fan-out's items; a group of one task stays that task.
    Edges join the groups their tasks' edges join. The page lists every task in its virtual
    list, where a group's click shows its tasks."""
    if len(graph.nodes) <= max_nodes:
        return graph
    col_of = {task_id: graph.by_id[node].col for task_id, node in graph.node_of.items()}
    span = 1
    while len({(col_of[t.task_id] // span, t.tool) for t in tasks}) > max_nodes:
        span *= 2
    members: dict[tuple[int, str], list[TaskRecord]] = defaultdict(list)
    for t in tasks:
        members[(col_of[t.task_id] // span, t.tool)].append(t)
    nodes: list[Node] = []
    node_of: dict[str, str] = {}
    rows: Counter[int] = Counter()
    for (col, tool), group in members.items():
        first = group[0]
        if len(group) == 1 and graph.node_of[first.task_id] == first.task_id:
            node = Node(first, col, rows[col])
        else:
            lo, hi = col * span, min(col * span + span, 1 + max(col_of.values())) - 1
            gid = f"{tool}@{lo}" if lo == hi else f"{tool}@{lo}-{hi}"
            node = Node(first, col, rows[col], dict(Counter(t.state.value for t in group)), gid)
        rows[col] += 1
        nodes.append(node)
        node_of.update((t.task_id, node.node_id) for t in group)
    # Every task of an old node is in one new node (one column, one tool; a fan-out's items too).
    moved = {graph.node_of[task_id]: new for task_id, new in node_of.items()}
    edges = list(dict.fromkeys((moved[a], moved[b]) for a, b in graph.edges if moved[a] != moved[b]))
    return _graph(nodes, edges, node_of)


def group_id(parent: str) -> str:
    """The node id of a fan-out's items (never a task id: ``[*]`` is no item index)."""
    return f"{parent}[*]"


# The state a group of items shows, the first of these any item is in: what still moves first,
# then what failed, then what waits, then how they ended.
GROUP_STATE_ORDER = (
    "running", "retrying", "failed", "awaiting_approval", "blocked", "pending_client", "queued_client",
    "queued_server", "pending", "expired", "skipped", "not_triggered", "fanned_out", "done",
)  # fmt: skip


def group_state(counts: Mapping[str, int]) -> str:
    return next((s for s in GROUP_STATE_ORDER if counts.get(s)), "done")


def group_label(counts: Mapping[str, int]) -> str:
    """``×120 · 80 done · 30 running · 10 failed``: the count, then by state, most first."""
    by_state = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return " · ".join([f"×{sum(counts.values())}", *(f"{n} {state}" for state, n in by_state)])


def group_title(parent: str, counts: Mapping[str, int]) -> str:
    return f"items of {parent}: {group_label(counts)}"


def group_counts(states: Mapping[str, str]) -> dict[str, dict[str, int]]:
    """Each fan-out's items counted by state, by group node id, from task id -> state."""
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for task_id, state in states.items():
        parent = parent_of(task_id)
        if parent is not None:
            counts[group_id(parent)][state] += 1
    return {gid: dict(c) for gid, c in counts.items()}


def badges(t: TaskRecord) -> list[str]:
    """What a node says under its tool: its route, retries, progress, why it waits."""
    shown = [t.route or "unrouted"]
    if t.attempts:
        shown.append(f"retry {len(t.attempts)}")
    if t.progress is not None and t.state is TaskState.RUNNING:
        pct = (
            f"{t.progress.progress / t.progress.total:.0%}"
            if t.progress.total
            else f"{t.progress.progress:g}"
        )
        shown.append(pct)
    if t.fan_out is not None:
        shown.append(f"{t.fan_out} items")
    return shown


def waiting_reason(t: TaskRecord) -> str:
    """A parked, retrying or held task's reason ('' for the others: a final task's reason is
    in its details)."""
    if t.state in PARKED or t.state in (TaskState.RETRYING, TaskState.AWAITING_APPROVAL):
        return t.reason
    return ""


# --- the morning summary ----------------------------------------------------------------


@dataclass(frozen=True)
class FirstFailure:
    """The task that failed (or expired) first, and the tasks skipped because of it."""

    task: TaskRecord
    skipped: list[str]


def first_failure(tree: TreeRecord, tasks: Sequence[TaskRecord]) -> FirstFailure | None:
    """The failed or expired task that finished first (in the tree's order among equal times),
    and every skipped task downstream of it through skipped tasks only: a dependent that ran
    anyway (``run_if``) did not skip what came after it."""
    failed = [t for t in tasks if t.state in (TaskState.FAILED, TaskState.EXPIRED)]
    if not failed:
        return None
    first = min(failed, key=lambda t: t.finished_at if t.finished_at is not None else float("inf"))
    dependents: dict[str, list[str]] = defaultdict(list)
    for task_id, deps in dependencies(tree, tasks).items():
        for d in deps:
            dependents[d].append(task_id)
    states = {t.task_id: t.state for t in tasks}
    skipped: list[str] = []
    reached = {first.task_id}
    frontier = [first.task_id]
    while frontier:
        for d in dependents.get(frontier.pop(), ()):
            if d not in reached and states.get(d) is TaskState.SKIPPED:
                reached.add(d)
                skipped.append(d)
                frontier.append(d)
    order = {t.task_id: i for i, t in enumerate(tasks)}
    return FirstFailure(first, sorted(skipped, key=order.__getitem__))


# --- the timeline -----------------------------------------------------------------------


@dataclass(frozen=True)
class Bar:
    """One task's span: queued (first left pending) -> started -> finished (or now)."""

    task_id: str
    state: str
    queued: float | None
    started: float | None
    finished: float | None


def timeline(tasks: Sequence[TaskRecord], now: float) -> tuple[float, float, list[Bar]]:
    """(start, end, bars) of the tasks that ever left pending, in the tree's order."""
    bars = []
    for t in tasks:
        queued = t.first_queued_at or t.queued_at
        if queued is None and t.started_at is None:
            continue
        finished = t.finished_at if t.state in FINAL else None
        bars.append(Bar(t.task_id, t.state.value, queued, t.started_at, finished))
    points = [p for b in bars for p in (b.queued, b.started, b.finished) if p is not None]
    if not points:
        return now, now, []
    unfinished = any(b.finished is None for b in bars)
    return min(points), max([*points, now] if unfinished else points), bars


def critical_path(tree: TreeRecord, tasks: Sequence[TaskRecord], now: float) -> list[str]:
    """The chain of ``depends_on`` that decided when the tree ended (or, while it runs, what
    holds it open now), first task first: from the task that ended last, back through the
    dependency that ended last before it, to a task with none. A task ends when it finished;
    one that left ``pending`` and is not final ends ``now``; a pending one is on no path. Equal
    ends go to the task first in the tree's order."""
    ends: dict[str, float] = {}
    for t in tasks:
        if t.state in FINAL and t.finished_at is not None:
            ends[t.task_id] = t.finished_at
        elif t.state not in FINAL and (t.first_queued_at or t.queued_at or t.started_at):
            ends[t.task_id] = now
    if not ends:
        return []
    order = {t.task_id: i for i, t in enumerate(tasks)}

    def latest(ids: Sequence[str]) -> str | None:
        ended = [i for i in ids if i in ends]
        return max(ended, key=lambda i: (ends[i], -order[i])) if ended else None

    deps = dependencies(tree, tasks)
    path: list[str] = []
    step = latest(list(ends))
    while step is not None:
        path.append(step)
        step = latest(deps.get(step, []))
    return path[::-1]


def task_rows(
    tasks: Sequence[TaskRecord], graph: Graph, start: float, critical: Sequence[str] = ()
) -> list[list[Any]]:
    """The tree page's task list (its virtual list and timeline), one compact row per task in
    the tree's order: id, tool, state, route, why it waits, queued/started/finished in seconds
    from ``start`` (None: not yet), the graph node it is drawn in, 1 if on the critical path.
    No argument value and no result: the page shows neither."""
    on_path = set(critical)

    def at(when: float | None) -> float | None:
        return None if when is None else round(when - start, 3)

    return [
        [
            t.task_id,
            t.tool,
            t.state.value,
            t.route,
            waiting_reason(t),
            *map(at, bar_times(t)),
            graph.node_of.get(t.task_id, t.task_id),
            int(t.task_id in on_path),
        ]
        for t in tasks
    ]


def bar_times(t: TaskRecord) -> tuple[float | None, float | None, float | None]:
    """A task's timeline bar: when it was first queued, started, finished (None: not yet; a
    finish only once final, so a retry's earlier end does not end its bar)."""
    return t.first_queued_at or t.queued_at, t.started_at, t.finished_at if t.state in FINAL else None


def states_of(tasks: Sequence[TaskRecord]) -> Mapping[str, str]:
    return {t.task_id: t.state.value for t in tasks}


# --- the clients page -------------------------------------------------------------------

# An offline client gone for less than this is "recently seen"; others are listed after it.
RECENT_S = 24 * 3600.0


@dataclass(frozen=True)
class ClientRow:
    """One client of ``vancetope clients --json`` as the clients page shows it."""

    client_id: str
    state: str  # connected, recently seen, offline, misbehaving
    said: str  # "connected since 02:10", "offline since 2026-12-06 02:14", ...
    client_type: str
    round_trip: str
    tools: list[str]
    held: list[str]
    clashes: list[str]
    waiting: str


def client_rows(report: Mapping[str, Any], now: float) -> dict[str, list[ClientRow]]:
    """User -> that user's clients: connected first, then the recently seen (last gone
    first), then the others, each group by client id."""
    by_user: dict[str, list[tuple[tuple[int, float, str], ClientRow]]] = defaultdict(list)
    for c in report.get("clients", []):
        seen = c.get("last_seen")
        if c["connected"]:
            state, said, rank = "connected", f"connected since {_day_clock(c['connected_at'], now)}", 0
        elif seen is not None and now - seen < RECENT_S:
            state, said, rank = "recently seen", f"offline since {_day_clock(seen, now)}", 1
        else:
            gone = (
                f"offline since {_day_clock(seen, now)}"
                if seen is not None
                else "offline (not seen since recorded)"
            )
            state, said, rank = "offline", gone, 2
        if c.get("misbehaving"):
            state, said = "misbehaving", f"suspended: {c['misbehaving']}; {said}"
        rtt = c.get("round_trip_ms")
        waiting = c["waiting"]
        parts = [f"{n_tasks(waiting['client'])} for it"] if waiting["client"] else []
        if waiting["user"]:
            parts.append(f"{n_tasks(waiting['user'])} for any client of user {c['user']}")
        row = ClientRow(
            client_id=c["client_id"],
            state=state,
            said=said,
            client_type=c.get("client_type") or "",
            round_trip="" if rtt is None else (f"{rtt:.0f} ms" if rtt >= 10 else f"{rtt:.1f} ms"),
            tools=list(c.get("tools", [])),
            held=list(c.get("held_tools", [])),
            clashes=list(c.get("clashes", [])),
            waiting="; ".join(parts),
        )
        by_user[c["user"]].append(((rank, -(seen or 0.0) if rank == 1 else 0.0, c["client_id"]), row))
    return {
        user: [row for _, row in sorted(rows, key=lambda r: r[0])] for user, rows in sorted(by_user.items())
    }


def _day_clock(at: float | None, now: float) -> str:
    """``HH:MM`` on the day of ``now``, else ``YYYY-MM-DD HH:MM`` (local time of the web process)."""
    if not at:
        return "?"
    if time.strftime("%Y-%m-%d", time.localtime(at)) == time.strftime("%Y-%m-%d", time.localtime(now)):
        return clock(at)
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(at))
