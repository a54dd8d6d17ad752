"""The web view's HTML (layer: brain/web; pure rendering, every value escaped).

Server-rendered pages with one stylesheet and one small inline script (the tree page's live
updates and task details); nothing to build. Colours are keyed on ``data-state``, so changing
that attribute is all a live update does to a node.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any
from urllib.parse import quote

from brain.core.models import TaskRecord, TaskState, TreeRecord, TreeStatus
from brain.core.summary import RunSummary, whom
from brain.web.csrf import FIELD
from brain.web.views import (
    GROUP_STATE_ORDER,
    LAST_CHOICES,
    NODE_H,
    NODE_W,
    ClientRow,
    FirstFailure,
    Graph,
    TreeRow,
    badges,
    clock,
    critical_path,
    group_id,
    group_label,
    group_state,
    group_title,
    n_tasks,
    seconds,
    task_rows,
    timeline,
    waiting_reason,
)
from workers import masking

# One colour per state (fill of a node, bar of the timeline).
STATE_COLOURS = {
    "pending": "#e5e7eb",
    "queued_server": "#bfdbfe",
    "queued_client": "#c7d2fe",
    "running": "#60a5fa",
    "awaiting_approval": "#f0abfc",
    "blocked": "#fdba74",
    "pending_client": "#fcd34d",
    "retrying": "#fca5a5",
    "fanned_out": "#a5b4fc",
    "done": "#86efac",
    "failed": "#f87171",
    "skipped": "#d1d5db",
    "expired": "#fb923c",
    "not_triggered": "#f3f4f6",
}
TREE_STATUSES = [s.value for s in TreeStatus]


def _css() -> str:
    states = "\n".join(
        f'[data-state="{state}"] rect.box, .bar[data-state="{state}"], .pill[data-state="{state}"] '
        f"{{fill: {colour}; background: {colour};}}"
        for state, colour in STATE_COLOURS.items()
    )
    return f"""
body {{font: 14px/1.4 system-ui, sans-serif; margin: 0; color: #111827;}}
header {{background: #1f2937; color: #f9fafb; padding: 8px 16px;}}
header a {{color: #f9fafb; margin-right: 16px; text-decoration: none;}}
main {{padding: 12px 16px;}}
table {{border-collapse: collapse;}}
td, th {{border-bottom: 1px solid #e5e7eb; padding: 4px 8px; text-align: left; vertical-align: top;}}
.pill {{display: inline-block; border-radius: 8px; padding: 0 6px; margin: 1px; font-size: 12px;}}
.waits {{color: #9a3412;}}
.muted {{color: #6b7280;}}
.ok {{color: #166534;}}
svg text {{font: 12px system-ui, sans-serif; pointer-events: none;}}
svg .tool {{font-weight: 600;}}
svg .edge {{stroke: #9ca3af; fill: none;}}
rect.box {{stroke: #374151; stroke-width: 1;}}
form.action {{display: inline-block; margin: 0 8px 8px 0;}}
.scroll {{overflow: auto; max-height: 70vh; border: 1px solid #e5e7eb;}}
#details {{border: 1px solid #e5e7eb; padding: 8px; margin-top: 8px; min-height: 2em;}}
pre.result {{background: #f9fafb; border: 1px solid #e5e7eb; padding: 6px; max-height: 40vh; overflow: auto;}}
.vlist {{position: relative; overflow: auto; height: 60vh; border: 1px solid #e5e7eb;}}
.vspacer {{position: relative;}}
.vrow {{position: absolute; left: 0; right: 0; height: {ROW_PX}px; display: flex; align-items: center;
  font-size: 12px; border-bottom: 1px solid #f3f4f6; cursor: pointer;}}
.vrow:hover {{background: #f9fafb;}}
.vrow > span {{overflow: hidden; white-space: nowrap; text-overflow: ellipsis; padding: 0 4px; flex: none;}}
.vrow .id {{width: 200px;}} .vrow .tool {{width: 150px;}} .vrow .state {{width: 130px;}} .vrow .route {{width: 120px;}}
.vrow > span.lane {{position: relative; flex: 1; height: 12px; padding: 0; min-width: 200px;}}
.lane i {{position: absolute; top: 0; height: 12px;}}
.lane i.wait {{background: #e5e7eb;}}
.vrow.critical .id {{font-weight: 700; color: #b91c1c;}}
.vrow.critical .lane i.bar {{outline: 2px solid #b91c1c;}}
.list-tools {{margin: 4px 0;}}
{states}
"""


# An action's form asks before it posts (its data-confirm says what will happen).
CONFIRM_SCRIPT = """
document.addEventListener('submit', (e) => {
  const ask = e.target.dataset.confirm;
  if (ask && !confirm(ask)) e.preventDefault();
});
"""


def action_form(
    action: str, csrf: str, label: str, confirm: str, fields: Sequence[tuple[str, str]] = ()
) -> str:
    """A POST form of one button carrying the page's CSRF token (brain.web.csrf)."""
    hidden = "".join(
        f'<input type=hidden name="{escape(k)}" value="{escape(v)}">' for k, v in [(FIELD, csrf), *fields]
    )
    return (
        f'<form method=post class=action action="{escape(action)}" data-confirm="{escape(confirm)}">'
        f"{hidden}<button>{escape(label)}</button></form>"
    )


def page(title: str, body: str, script: str = "", vendored: Sequence[str] = ()) -> str:
    """``vendored``: files of brain/web/static/vendor the page loads before its own script."""
    if "data-confirm=" in body:
        script += CONFIRM_SCRIPT
    libraries = "".join(f'<script src="/static/vendor/{quote(name)}"></script>' for name in vendored)
    return (
        "<!doctype html>\n<html lang=en><head><meta charset=utf-8>"
        f"<title>{escape(title)} — Vancetope</title><style>{_css()}</style></head><body>"
        '<header><a href="/trees"><b>Vancetope</b></a><a href="/trees">Trees</a>'
        '<a href="/trees?status=running">Running</a><a href="/clients">Clients</a></header>'
        f"<main>{body}</main>{libraries}{f'<script>{script}</script>' if script else ''}</body></html>"
    )


def _pills(counts: dict[str, int]) -> str:
    return "".join(
        f'<span class="pill" data-state="{escape(state)}">{escape(state)} {n}</span>'
        for state, n in sorted(counts.items())
    )


@dataclass(frozen=True)
class TreeFilters:
    """The trees page's filters as the query gave them (None: not given)."""

    status: str | None = None
    user: str | None = None
    schedule: str | None = None
    since: str | None = None
    until: str | None = None
    last: str | None = None


def _select(name: str, chosen: str | None, values: Sequence[str], any_label: str = "any") -> str:
    # The chosen value is kept even when no listed tree has it (a filter that matched nothing).
    listed = ["", *values, *([chosen] if chosen and chosen not in values else [])]
    options = "".join(
        f'<option value="{escape(v)}"{" selected" if v == (chosen or "") else ""}>{escape(v) or any_label}</option>'
        for v in listed
    )
    return f"{name} <select name={name}>{options}</select> "


def trees_page(
    rows: Sequence[TreeRow], filters: TreeFilters, users: Sequence[str], schedules: Sequence[str] = ()
) -> str:
    f = filters
    form = (
        '<form method=get action="/trees">'
        + _select("status", f.status, TREE_STATUSES)
        + _select("user", f.user, users)
        + _select("schedule", f.schedule, schedules)
        + _select("last", f.last, LAST_CHOICES, "—")
        + f'or since <input type=datetime-local name=since value="{escape(f.since or "")}"> '
        f'until <input type=datetime-local name=until value="{escape(f.until or "")}"> '
        "<button>filter</button></form>"
    )
    lines = []
    for row in rows:
        s = row.summary
        tree_id = str(s["tree_id"])
        waits = "<br>".join(escape(w) for w in row.waits)
        lines.append(
            f'<tr data-tree-id="{escape(tree_id)}" data-status="{escape(s["status"])}">'
            f'<td><a href="/trees/{quote(tree_id, safe="")}">{escape(tree_id)}</a>'
            f'<div class="muted">{escape(str(s["name"]))}{_schedule_link(s["schedule"])}'
            f"{_summary_link(tree_id) if s['schedule'] else ''}</div></td>"
            f"<td>{escape(s['status'])}</td><td>{escape(s['user'] or '')}</td>"
            f"<td>{escape(clock(s['submitted_at']))}</td><td>{escape(row.duration)}</td>"
            f"<td>{_pills(s['counts'])}</td><td class=waits>{waits}</td></tr>"
        )
    table = (
        "<table><thead><tr><th>tree</th><th>status</th><th>user</th><th>submitted</th>"
        "<th>duration</th><th>tasks by state</th><th>waiting for</th></tr></thead>"
        f"<tbody>{''.join(lines)}</tbody></table>"
        if lines
        else '<p class="muted">no task trees match</p>'
    )
    return page("Trees", f"<h1>Trees</h1>{form}{table}")


def _schedule_link(schedule: str | None) -> str:
    """`` · schedule nightly``, linked to the trees page of that schedule's runs."""
    if not schedule:
        return ""
    return f' · schedule <a href="/trees?schedule={quote(schedule, safe="")}">{escape(schedule)}</a>'


def _summary_link(tree_id: str) -> str:
    return f' · <a class="summary" href="{escape(_tree_url(tree_id))}#summary">morning summary</a>'


def _node(tree_id: str, x: int, y: int, t: TaskRecord) -> str:
    reason = waiting_reason(t)
    label, tool = _fit(t.task_id), _fit(t.tool)
    tip = f"{t.task_id}: {t.tool} ({t.state.value}){' — ' + reason if reason else ''}"
    href = f"/trees/{quote(tree_id, safe='')}/tasks/{quote(t.task_id, safe='')}"
    return (
        f'<a href="{escape(href)}"><g class="node" data-task-id="{escape(t.task_id)}" '
        f'data-state="{t.state.value}" transform="translate({x},{y})">'
        f"<title>{escape(tip)}</title>"
        f'<rect class="box" width="{NODE_W}" height="{NODE_H}" rx="6"/>'
        f'<text x="6" y="14" class="tool">{escape(label)}</text>'
        f'<text x="6" y="28">{escape(tool)}</text>'
        f'<text x="6" y="41" class="muted">{escape(_fit(" · ".join([*badges(t), *([reason] if reason else [])])))}'
        "</text></g></a>"
    )


def _group_node(tree_id: str, x: int, y: int, first: TaskRecord, counts: dict[str, int]) -> str:
    """A fan-out's items as one node: the count by state, coloured by ``group_state``; a click
    opens the fanned-out task."""
    parent = first.parent or ""
    label = group_label(counts)
    href = f"/trees/{quote(tree_id, safe='')}/tasks/{quote(parent, safe='')}"
    return (
        f'<a href="{escape(href)}"><g class="node group" data-group="{escape(group_id(parent))}" '
        f'data-state="{group_state(counts)}" transform="translate({x},{y})">'
        f"<title>{escape(group_title(parent, counts))}</title>"
        f'<rect class="box" width="{NODE_W}" height="{NODE_H}" rx="6"/>'
        f'<rect class="box" x="3" y="3" width="{NODE_W}" height="{NODE_H}" rx="6" opacity="0.5"/>'
        f'<text x="6" y="14" class="tool">{escape(_fit(f"{parent}[…]"))}</text>'
        f'<text x="6" y="28">{escape(_fit(first.tool))}</text>'
        f'<text x="6" y="41" class="muted count">{escape(_fit(label))}</text></g></a>'
    )


def _collapsed_node(x: int, y: int, gid: str, tool: str, counts: dict[str, int]) -> str:
    """A big tree's tasks of one tool at neighbouring depths as one node (``views.collapse``);
    a click lists them in the task list."""
    depth = gid.rsplit("@", 1)[1]
    label = group_label(counts)
    title = f"{sum(counts.values())} tasks of tool {tool} at depth {depth}: {label}"
    return (
        f'<a href="#timeline"><g class="node group collapsed" data-group="{escape(gid)}" '
        f'data-state="{group_state(counts)}" transform="translate({x},{y})">'
        f"<title>{escape(title)}</title>"
        f'<rect class="box" width="{NODE_W}" height="{NODE_H}" rx="6"/>'
        f'<rect class="box" x="3" y="3" width="{NODE_W}" height="{NODE_H}" rx="6" opacity="0.5"/>'
        f'<text x="6" y="14" class="tool">{escape(_fit(tool))}</text>'
        f'<text x="6" y="28">{escape(_fit(f"depth {depth}"))}</text>'
        f'<text x="6" y="41" class="muted count">{escape(_fit(label))}</text></g></a>'
    )


# About this many characters of 12px text fit in a node; the tooltip has the rest.
NODE_CHARS = 30


def _fit(text: str) -> str:
    return text if len(text) <= NODE_CHARS else text[: NODE_CHARS - 1] + "…"


def graph_svg(tree_id: str, graph: Graph) -> str:
    edges = []
    for src, dst in graph.edges:
        a, b = graph.by_id[src], graph.by_id[dst]
        x1, y1 = a.x + NODE_W, a.y + NODE_H // 2
        x2, y2 = b.x, b.y + NODE_H // 2
        mid = (x1 + x2) // 2
        edges.append(
            f'<path class="edge" data-from="{escape(src)}" data-to="{escape(dst)}" '
            f'd="M{x1},{y1} C{mid},{y1} {mid},{y2} {x2},{y2}"/>'
        )
    nodes = [
        _node(tree_id, n.x, n.y, n.task)
        if n.group is None
        else _group_node(tree_id, n.x, n.y, n.task, n.group)
        if n.collapsed is None
        else _collapsed_node(n.x, n.y, n.collapsed, n.task.tool, n.group)
        for n in graph.nodes
    ]
    return (
        f'<svg id="graph" xmlns="http://www.w3.org/2000/svg" width="{graph.width}" height="{graph.height}" '
        f'data-node-w="{NODE_W}" data-node-h="{NODE_H}">'
        f"{''.join(edges)}{''.join(nodes)}</svg>"
    )


# The task list's rows, in px: the page draws only the rows in view (and a few around them).
ROW_PX = 20


def task_list(tree: TreeRecord, tasks: Sequence[TaskRecord], graph: Graph, now: float) -> str:
    """Every task with its timeline bar, as a virtual list: the rows are data in the page
    (``views.task_rows``) and its script puts only those in view into the DOM, so 10,000
    tasks are some fifty rows of elements. Grey: queued (or parked) until started; coloured:
    running until finished (or now). The critical path is marked (``views.critical_path``)."""
    start, end, _ = timeline(tasks, now)
    critical = critical_path(tree, tasks, now)
    data = {
        "start": start,  # the live updates' times are absolute: the rows' are from here
        "span": max(end - start, 0.0),
        "now": round(now - start, 3),
        "order": list(GROUP_STATE_ORDER),
        "rows": task_rows(tasks, graph, start, critical),
    }
    path = (
        f"<p id=critical-path>Critical path ({n_tasks(len(critical))}, "
        f"{escape(seconds(_path_span(tasks, critical, now)))}): "
        + " → ".join(_task_link(tree.tree_id, k) for k in critical[:MAX_NAMED])
        + (f" → … → {_task_link(tree.tree_id, critical[-1])}" if len(critical) > MAX_NAMED else "")
        + "</p>"
        if critical
        else ""
    )
    return (
        f"{path}<div class=list-tools>find <input id=find type=search placeholder='task id or tool'> "
        "<label><input type=checkbox id=critical-only> critical path only</label> "
        "<span id=group-filter hidden>tasks of <b></b> <button type=button>show all</button></span> "
        f"<span id=shown-count class=muted>{len(tasks)} tasks</span> <span class=muted>· from "
        f"{escape(clock(start))} to +{escape(seconds(end - start))}</span></div>"
        # As tall as its rows, up to 60% of the window: a small tree leaves no empty box.
        f'<div id="timeline" class="vlist" data-row-px="{ROW_PX}" '
        f'style="height:min(60vh,{len(tasks) * ROW_PX + 2}px)"><div class="vspacer" '
        f'style="height:{len(tasks) * ROW_PX}px"></div></div>'
        "<noscript>The task list is drawn by script; the graph's tasks link to their own pages.</noscript>"
        f'<script type="application/json" id="task-data">{_json_in_html(data)}</script>'
    )


def _path_span(tasks: Sequence[TaskRecord], path: Sequence[str], now: float) -> float:
    """From the path's first task leaving pending to its last one ending (or now)."""
    by_id = {t.task_id: t for t in tasks}
    first, last = by_id[path[0]], by_id[path[-1]]
    began = first.first_queued_at or first.queued_at or first.started_at or now
    return max((last.finished_at if last.state.is_final and last.finished_at else now) - began, 0.0)


def _json_in_html(value: object) -> str:
    """JSON inside a <script> data block: no ``<`` at all, so no ``</script>`` can end it."""
    return json.dumps(value, separators=(",", ":")).replace("<", "\\u003c")


# The graph laid out by dagre (brain/web/static/vendor): the server draws the nodes in columns
# by dependency depth (readable without script), this moves them and routes the edges.
DAGRE = "dagre.min.js"
LAYOUT_SCRIPT = """
(() => {
  const svg = document.getElementById('graph');
  if (!svg || typeof dagre === 'undefined') return;
  const w = Number(svg.dataset.nodeW), h = Number(svg.dataset.nodeH);
  const g = new dagre.graphlib.Graph();
  g.setGraph({rankdir: 'LR', nodesep: 14, edgesep: 10, ranksep: 70, marginx: 10, marginy: 16});
  g.setDefaultEdgeLabel(() => ({}));
  const nodes = svg.querySelectorAll('g.node');
  const id = (n) => n.dataset.taskId || n.dataset.group;  // a task, or a fan-out's items
  nodes.forEach(n => g.setNode(id(n), {width: w, height: h}));
  const edges = [...svg.querySelectorAll('path.edge')];
  edges.forEach(e => g.setEdge(e.dataset.from, e.dataset.to));
  dagre.layout(g);
  nodes.forEach(n => {
    const p = g.node(id(n));
    n.setAttribute('transform', `translate(${p.x - w / 2},${p.y - h / 2})`);
  });
  edges.forEach(e => {
    const points = g.edge(e.dataset.from, e.dataset.to).points;
    e.setAttribute('d', 'M' + points.map(p => `${p.x.toFixed(1)},${p.y.toFixed(1)}`).join(' L'));
  });
  svg.setAttribute('width', Math.ceil(g.graph().width));
  svg.setAttribute('height', Math.ceil(g.graph().height));
  svg.dataset.layout = 'dagre';
})();
"""

# The task list (``task_list``): draws the rows in view of the data block; filters by text, by
# the critical path and by a graph group (a click on a fan-out's or a collapsed group's node);
# a click on a task (row or node) puts its details under the graph.
LIST_SCRIPT = """
const taskList = (() => {
  const data = JSON.parse(document.getElementById('task-data').textContent);
  const rows = data.rows;  // [id, tool, state, route, reason, queued, started, finished, node, critical]
  const box = document.getElementById('timeline');
  const spacer = box.firstElementChild;
  const H = Number(box.dataset.rowPx);
  let span = Math.max(data.span, 1e-6);
  const index = new Map(rows.map((r, i) => [r[0], i]));
  const find = document.getElementById('find');
  const criticalOnly = document.getElementById('critical-only');
  const groupNote = document.getElementById('group-filter');
  const shownCount = document.getElementById('shown-count');
  const details = document.getElementById('details');
  const base = location.pathname.replace(/[/]$/, '');
  const esc = (v) => String(v ?? '').replace(/[&<>"']/g, c => `&#${c.charCodeAt(0)};`);
  const pct = (t) => Math.max(0, Math.min(100, t / span * 100)).toFixed(2);
  // A collapsed group's node counts its tasks by state; the list keeps the counts live.
  const collapsed = new Map();
  document.querySelectorAll('#graph g.node.collapsed').forEach(n => collapsed.set(n.dataset.group, {node: n, counts: {}}));
  rows.forEach(r => { const g = collapsed.get(r[8]); if (g) g.counts[r[2]] = (g.counts[r[2]] || 0) + 1; });
  let shown = rows.map((_, i) => i);
  let group = null;
  let pending = false;

  function lane(r) {
    const queued = r[5] ?? r[6];
    if (queued == null) return '';
    const end = r[7] ?? data.now;
    const began = r[6] ?? end;
    let html = `<i class="wait" style="left:${pct(queued)}%;width:${Math.max(pct(began) - pct(queued), 0.1)}%"></i>`;
    if (r[6] != null) {
      html += `<i class="bar" data-state="${esc(r[2])}" style="left:${pct(r[6])}%;width:${Math.max(pct(end) - pct(r[6]), 0.2)}%"></i>`;
    }
    return html;
  }
  function draw() {
    pending = false;
    const first = Math.max(0, Math.floor(box.scrollTop / H) - 5);
    const last = Math.min(shown.length, first + Math.ceil(box.clientHeight / H) + 10);
    let html = '';
    for (let k = first; k < last; k++) {
      const r = rows[shown[k]];
      html += `<div class="vrow${r[9] ? ' critical' : ''}" style="top:${k * H}px" data-task-id="${esc(r[0])}" `
        + `data-state="${esc(r[2])}" title="${esc(r[4])}"><span class="id">${esc(r[0])}</span>`
        + `<span class="tool">${esc(r[1])}</span><span class="state"><span class="pill" data-state="${esc(r[2])}">`
        + `${esc(r[2])}</span></span><span class="route">${esc(r[3])}</span><span class="lane">${lane(r)}</span></div>`;
    }
    spacer.innerHTML = html;
    box.dataset.span = span;  // the scale in seconds, for tools and tests reading the bars
  }
  const redraw = () => { if (!pending) { pending = true; requestAnimationFrame(draw); } };
  function filter() {
    const text = find.value.trim().toLowerCase();
    shown = [];
    rows.forEach((r, i) => {
      if (group !== null && r[8] !== group) return;
      if (criticalOnly.checked && !r[9]) return;
      if (text && !r[0].toLowerCase().includes(text) && !r[1].toLowerCase().includes(text)) return;
      shown.push(i);
    });
    spacer.style.height = `${shown.length * H}px`;
    shownCount.textContent = `${shown.length} of ${rows.length} tasks`;
    groupNote.hidden = group === null;
    groupNote.querySelector('b').textContent = group ?? '';
    box.scrollTop = 0;
    draw();
  }
  async function showDetails(href) {
    const r = await fetch(href + '?fragment=1');
    details.innerHTML = await r.text();
  }
  function showGroup(id) {
    group = id;
    filter();
    box.scrollIntoView({block: 'nearest'});
  }
  function label(counts) {
    const total = Object.values(counts).reduce((a, b) => a + b, 0);
    const parts = Object.entries(counts).filter(([, n]) => n > 0)
      .sort((a, b) => b[1] - a[1] || (a[0] < b[0] ? -1 : 1)).map(([s, n]) => `${n} ${s}`);
    return [`\\u00d7${total}`, ...parts].join(' \\u00b7 ');
  }
  function setState(id, state) {
    const i = index.get(id);
    if (i === undefined || rows[i][2] === state) return;
    const g = collapsed.get(rows[i][8]);
    if (g) {
      g.counts[rows[i][2]] -= 1;
      g.counts[state] = (g.counts[state] || 0) + 1;
      g.node.setAttribute('data-state', data.order.find(s => g.counts[s] > 0) || 'done');
      g.node.querySelector('text.count').textContent = label(g.counts);
    }
    rows[i][2] = state;
    redraw();
  }
  // Live bar times (absolute, as the events send them): the row's queued, started, finished;
  // the scale widens when a time falls past its end, and unfinished bars run to ``now``.
  function setTimes(id, times) {
    const i = index.get(id);
    if (i === undefined) return;
    times.forEach((t, k) => { rows[i][5 + k] = t == null ? null : t - data.start; });
    span = Math.max(span, ...times.filter(t => t != null).map(t => t - data.start));
    redraw();
  }
  function setNow(now) {
    data.now = now - data.start;
    if (rows.some(r => r[5] != null && r[7] == null)) span = Math.max(span, data.now);
    redraw();
  }
  box.addEventListener('scroll', redraw);
  window.addEventListener('resize', redraw);
  find.addEventListener('input', filter);
  criticalOnly.addEventListener('change', filter);
  groupNote.querySelector('button').addEventListener('click', () => { group = null; filter(); });
  box.addEventListener('click', (e) => {
    const row = e.target.closest('.vrow');
    if (row) showDetails(`${base}/tasks/${encodeURIComponent(row.dataset.taskId)}`);
  });
  document.getElementById('graph').addEventListener('click', (e) => {
    const a = e.target.closest('a');
    if (!a) return;
    e.preventDefault();
    const n = a.querySelector('g.node');
    if (n && n.dataset.group) showGroup(n.dataset.group);  // a fan-out's items, or a collapsed group
    if (n && !n.classList.contains('collapsed')) showDetails(a.getAttribute('href'));
  });
  draw();
  return {setState, setTimes, setNow, showGroup};
})();
"""

LIVE_SCRIPT = """
const nodes = new Map();
const groups = new Map();
document.querySelectorAll('#graph g.node').forEach(n => {
  if (n.dataset.group) groups.set(n.dataset.group, n); else nodes.set(n.dataset.taskId, n);
});
const status = document.getElementById('status');
const counts = document.getElementById('counts');
const source = new EventSource(location.pathname.replace(/\\/$/, '') + '/events');
source.onmessage = (e) => {
  const m = JSON.parse(e.data);
  for (const [id, state] of Object.entries(m.states || {})) {
    const n = nodes.get(id);
    if (n) n.setAttribute('data-state', state);
    taskList.setState(id, state);  // its row, and its collapsed group's count
  }
  for (const [id, times] of Object.entries(m.times || {})) taskList.setTimes(id, times);
  if (m.now !== undefined) taskList.setNow(m.now);
  for (const [id, g] of Object.entries(m.groups || {})) {  // a fan-out's items: one node
    const n = groups.get(id);
    if (!n) continue;
    n.setAttribute('data-state', g.state);
    n.querySelector('text.count').textContent = g.label;
    n.querySelector('title').textContent = g.title;
  }
  if (m.status) { status.textContent = m.status; status.dataset.status = m.status; }
  if (m.counts_html !== undefined) counts.innerHTML = m.counts_html;
  if (m.unknown) location.reload();  // new tasks (a fan-out's items): lay the graph out again
  if (m.final) source.close();
};
"""


def _tree_url(tree_id: str) -> str:
    return f"/trees/{quote(tree_id, safe='')}"


def tree_page(
    tree: TreeRecord,
    tasks: Sequence[TaskRecord],
    graph: Graph,
    row: TreeRow,
    now: float,
    csrf: str | None = None,
    summary: str = "",
) -> str:
    """``csrf``: the page's token when actions are offered (None: this web view has no brain
    to act through); ``summary``: a scheduled run's ``summary_section``."""
    s = row.summary
    final = tree.status is not TreeStatus.RUNNING
    cancel = (
        action_form(
            f"{_tree_url(tree.tree_id)}/cancel",
            csrf,
            "Cancel tree",
            f"Cancel every unfinished task of tree {tree.tree_id}?",
        )
        if csrf and not final
        else ""
    )
    waits = "".join(f"<li>{escape(w)}</li>" for w in row.waits)
    head = (
        f"<h1>Tree {escape(tree.tree_id)}</h1>"
        f'<p><b id="status" data-status="{escape(s["status"])}">{escape(s["status"])}</b> · '
        f"user {escape(s['user'] or '—')} · submitted {escape(clock(tree.submitted_at))} · "
        f"duration {escape(row.duration)} · {len(tasks)} tasks"
        f"{_schedule_link(tree.schedule)}</p>{cancel}"
        f'<p id="counts">{_pills(s["counts"])}</p>'
        f"{f'<ul class=waits>{waits}</ul>' if waits else ''}"
    )
    body = (
        f"{head}{summary}<h2>Graph</h2><p class=muted>Laid out by dagre, left to right along <code>depends_on</code>; "
        "click a task for its details.</p>"
        f'<div class="scroll">{graph_svg(tree.tree_id, graph)}</div><div id="details"></div>'
        "<h2>Tasks and timeline</h2><p class=muted>Every task (click one for its details); grey: "
        "queued (or parked) until started; coloured: running until finished; bold red: the critical "
        "path, the chain of <code>depends_on</code> that ended last.</p>"
        f"{task_list(tree, tasks, graph, now)}"
    )
    script = LAYOUT_SCRIPT + LIST_SCRIPT + ("" if final else LIVE_SCRIPT)
    return page(f"Tree {tree.tree_id}", body, script, [DAGRE])


# The summary's counts in the order its Markdown report puts them (brain.core.summary).
SUMMARY_COUNTS = (
    ("done", "done"), ("failed", "failed"), ("expired", "expired"), ("skipped", "skipped"),
    ("not_triggered", "not triggered"), ("waiting", "waiting for a client"), ("in_flight", "in flight"),
    ("retrying", "retrying"), ("pending", "pending"), ("total", "total"),
)  # fmt: skip


def _code(markdown: str) -> str:
    """Escaped text with its `backticked` names as <code> (the summary's own wording)."""
    return re.sub(r"`([^`]*)`", r"<code>\1</code>", escape(markdown))


def _task_link(tree_id: str, task_id: str) -> str:
    href = f"{_tree_url(tree_id)}/tasks/{quote(task_id, safe='')}"
    return f'<a href="{escape(href)}">{escape(task_id)}</a>'


def summary_section(summary: RunSummary, stored: bool, first: FirstFailure | None) -> str:
    """The morning summary of a scheduled run (``brain.core.summary``; ``stored``: the one the
    schedule sweep stored and sent on), with the first failure and what it skipped."""
    ended = summary.finished_at
    took = seconds((ended or summary.at) - summary.submitted_at)
    if stored:
        made = f"the {summary.kind.value} summary the brain stored at {clock(summary.at)}"
    elif summary.status is TreeStatus.RUNNING:
        made = "as the tasks stand now (the brain stores the summary when the run ends)"
    else:
        made = "made from the run's records (the brain has stored no summary of it)"
    span = f"started {clock(summary.submitted_at)}, " + (
        f"ended {clock(ended)}, took {took}" if ended else f"running for {took}"
    )
    head = "".join(f"<th>{label}</th>" for _, label in SUMMARY_COUNTS)
    cells = "".join(
        f'<td data-count="{key}">{getattr(summary.counts, key)}</td>' for key, _ in SUMMARY_COUNTS
    )
    parts = [
        f"<p><b>{escape(summary.status.value)}</b> · {escape(span)} · <span class=muted>{escape(made)}</span></p>",
        f"<table class=counts><tr>{head}</tr><tr>{cells}</tr></table>",
    ]
    if first is not None:
        t = first.task
        why = f"{t.error.type}: {t.error.message}" if t.error else t.reason or "no reason recorded"
        skipped = (
            f"; it skipped {n_tasks(len(first.skipped))}: "
            + ", ".join(_task_link(summary.tree_id, k) for k in first.skipped[:MAX_NAMED])
            + (f" and {len(first.skipped) - MAX_NAMED} more" if len(first.skipped) > MAX_NAMED else "")
            if first.skipped
            else "; it skipped nothing"
        )
        parts.append(
            f'<p id="first-failure">First failure: {_task_link(summary.tree_id, t.task_id)} '
            f"({escape(t.tool)}, {escape(t.state.value)}{', at ' + escape(clock(t.finished_at)) if t.finished_at else ''})"
            f": {escape(why)}{skipped}</p>"
        )
    if summary.waiting_for:
        waits = "".join(
            f"<li>{_code(whom(w))}: {n_tasks(len(w.tasks))} "
            f"({', '.join(_task_link(summary.tree_id, k) for k in w.tasks[:MAX_NAMED])}"
            f"{' …' if len(w.tasks) > MAX_NAMED else ''})</li>"
            for w in summary.waiting_for
        )
        parts.append(f'<p>Still waiting for a client to come online:</p><ul id="still-waiting">{waits}</ul>')
    parts.append(
        _task_lines(
            "Fan-outs",
            summary.tree_id,
            (
                (f.task_id, f.tool, f.state, f"{f.items} items, {f.done} done, {f.failed} failed")
                for f in summary.fan_outs
            ),
        )
    )
    parts.append(
        _task_lines(
            "Retried",
            summary.tree_id,
            (
                (
                    r.task_id,
                    r.tool,
                    r.state,
                    f"{r.attempts} attempts; the last failed one: {r.last_error or 'no error recorded'}",
                )
                for r in summary.retried
            ),
        )
    )
    return (
        f'<section id="summary" data-kind="{summary.kind.value if stored else "now"}">'
        f"<h2>Morning summary of schedule {escape(summary.schedule or summary.name)}</h2>{''.join(parts)}</section>"
    )


def _task_lines(heading: str, tree_id: str, lines: Iterable[tuple[str, str, TaskState, str]]) -> str:
    """``heading:`` and a list of "task (tool, state): what", each task linked ('' if none)."""
    items = "".join(
        f"<li>{_task_link(tree_id, task_id)} ({escape(tool)}, {escape(state.value)}): {escape(what)}</li>"
        for task_id, tool, state, what in lines
    )
    return f"<p>{escape(heading)}:</p><ul>{items}</ul>" if items else ""


# How many task ids a line of the summary names before "and N more".
MAX_NAMED = 20


def counts_html(counts: dict[str, int]) -> str:
    return _pills(counts)


def _when(at: float | None) -> str:
    return f"{clock(at)} ({at:.3f})" if at else "—"


def flower_links(t: TaskRecord, flower_url: str | None) -> str:
    """A task's Celery task ids (its run ids: the current one and each earlier attempt's),
    each a link to Flower's page of that task."""
    runs = [(f"attempt {a.number}", a.run_id) for a in t.attempts if a.run_id]
    if t.run_id:
        runs.append(("current" if runs else "", t.run_id))
    if not runs:
        return ""
    base = (flower_url or "").rstrip("/")
    links = ", ".join(
        (f"{escape(label)} " if label else "")
        + (
            f'<a class="flower" href="{escape(base)}/task/{quote(run, safe="")}">{escape(run)}</a>'
            if base
            else escape(run)
        )
        for label, run in runs
    )
    return f"<p>Celery task id{'s' if len(runs) > 1 else ''} (Flower): {links}</p>"


def task_details(
    tree: TreeRecord,
    t: TaskRecord,
    csrf: str | None = None,
    flower_url: str | None = None,
    show_result: bool = False,
    show_args: bool = False,
) -> str:
    """A task's details: tool, route and why, attempts, timings, error. Argument names only
    (as Flower shows them), their values only with ``show_args`` (a login of
    ``web_argument_users``); the result value only with ``show_result`` (a login of
    ``web_result_users``), as `vancetope status TREE TASK` prints it."""
    spec = next((s for s in tree.tree.tasks if s.id == t.task_id), None) or t.spec
    arg_names = ", ".join(sorted(spec.args)) if spec is not None else ""
    deps = ", ".join(spec.depends_on) if spec is not None else ""
    ran = seconds(t.finished_at - t.started_at) if t.started_at and t.finished_at else ""
    rows = [
        ("task", t.task_id),
        ("state", t.state.value),
        ("tool", f"{t.tool}({arg_names})"),
        ("depends on", deps),
        ("route", t.route),
        ("client", t.client_id or ""),
        ("pool", t.pool or ""),
        ("reason", t.reason),
        ("attempt", str(t.attempt)),
        ("deliveries", str(t.deliveries) if t.deliveries else ""),
        ("worker", t.worker),
        ("run id", t.run_id or ""),
        ("first queued", _when(t.first_queued_at)),
        ("queued", _when(t.queued_at)),
        ("started", _when(t.started_at)),
        ("finished", _when(t.finished_at)),
        ("ran for", ran),
    ]
    if t.state is TaskState.RETRYING:
        rows.append(("next attempt", _when(t.retry_at)))
    if t.error is not None:
        rows.append(("error", f"{t.error.type}: {t.error.message}"))
    cells = "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in rows if v)
    attempts = "".join(
        f"<li>attempt {a.number} on {escape(a.route)}: "
        f"{escape(f'{a.error.type}: {a.error.message}' if a.error else 'failed')}"
        f"{escape(' after ' + seconds(a.finished_at - a.started_at)) if a.started_at and a.finished_at else ''}</li>"
        for a in t.attempts
    )
    cancel = (
        action_form(
            f"{_tree_url(tree.tree_id)}/tasks/{quote(t.task_id, safe='')}/cancel",
            csrf,
            "Cancel task",
            f"Cancel task {t.task_id} (its dependents are skipped)?",
        )
        if csrf and not t.state.is_final
        else ""
    )
    status = f"<code>vancetope status {escape(tree.tree_id)} {escape(t.task_id)}</code>"
    args = _args(spec.args) if show_args and spec is not None else ""
    result = _result(t, status) if show_result else ""
    hidden = [
        what for what, shown in (("Argument values", show_args), ("The result", show_result)) if not shown
    ]
    note = (
        f"<p class=muted>{' and '.join(hidden).capitalize()} {'is' if hidden == ['The result'] else 'are'} "
        "not shown here (argument values are shown to the logins of <code>web_argument_users</code>, "
        "the result is shown to the logins of <code>web_result_users</code>)"
        f"{'' if show_result else f'; {status} prints the result'}.</p>"
        if hidden
        else ""
    )
    return (
        f'<div class="task" data-task-id="{escape(t.task_id)}"><table>{cells}</table>{args}{result}'
        f"{flower_links(t, flower_url)}{cancel}"
        f"{f'<p>earlier attempts:</p><ul>{attempts}</ul>' if attempts else ''}{note}</div>"
    )


# Characters of a result a task's details show; `vancetope status TREE TASK` prints it whole.
MAX_RESULT_CHARS = 65_536


def _args(args: dict[str, Any]) -> str:
    """A task's arguments as its tree gave them (indented JSON). A ``${vault:NAME}`` stays the
    reference it is everywhere (never resolved here), and a secret value this process knows is
    masked (``workers.masking``), as in everything else a process sends."""
    text = json.dumps(masking.mask_data(args), indent=2, ensure_ascii=False, default=str)
    return f'<p>arguments:</p><pre class="args">{escape(text)}</pre>'


def _result(t: TaskRecord, status: str) -> str:
    """A done task's result as `vancetope status TREE TASK` prints it (indented JSON), cut at
    ``MAX_RESULT_CHARS``."""
    if t.state is not TaskState.DONE:
        return ""
    text = json.dumps(t.result, indent=2, ensure_ascii=False, default=str)
    cut = (
        f"<p class=muted>… {len(text) - MAX_RESULT_CHARS:,} more characters: {status} prints it whole.</p>"
        if len(text) > MAX_RESULT_CHARS
        else ""
    )
    return f'<p>result:</p><pre class="result">{escape(text[:MAX_RESULT_CHARS])}</pre>{cut}'


def task_page(tree: TreeRecord, t: TaskRecord, details: str) -> str:
    """A task's own page around its ``task_details``."""
    back = f'<p><a href="{_tree_url(tree.tree_id)}">← tree {escape(tree.tree_id)}</a></p>'
    return page(f"Task {t.task_id}", f"{back}<h1>Task {escape(t.task_id)}</h1>{details}")


def event_data(payload: dict[str, object]) -> str:
    """One server-sent event's bytes."""
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


CLIENT_STATE_CLASS = {"connected": "ok", "recently seen": "muted", "offline": "muted", "misbehaving": "waits"}


def _client_row(r: ClientRow, csrf: str | None) -> str:
    held = ""
    if r.held:
        approve = (
            action_form(
                f"/clients/{quote(r.client_id, safe='')}/approve-tools",
                csrf,
                "Approve changed tools",
                f"Accept the new definitions of {', '.join(r.held)} on client {r.client_id}?",
                [("tool", name) for name in r.held],
            )
            if csrf
            else ""
        )
        held = f'<div class="waits">changed, held until approved: {escape(", ".join(r.held))}{approve}</div>'
    clashes = "".join(f'<div class="muted">clash: {escape(c)}</div>' for c in r.clashes)
    return (
        f'<tr data-client-id="{escape(r.client_id)}" data-client-state="{escape(r.state)}">'
        f"<td>{escape(r.client_id)}</td>"
        f'<td class="{CLIENT_STATE_CLASS[r.state]}">{escape(r.said)}</td>'
        f"<td>{escape(r.client_type)}</td><td>{escape(r.round_trip)}</td>"
        f"<td>{escape(', '.join(r.tools))}{held}{clashes}</td><td class=waits>{escape(r.waiting)}</td></tr>"
    )


def clients_page(rows: dict[str, list[ClientRow]], csrf: str | None) -> str:
    """``vancetope clients`` in the browser: each user's clients, connected first."""
    head = (
        "<thead><tr><th>client</th><th>state</th><th>type</th><th>round trip</th><th>tools</th>"
        "<th>waiting for it</th></tr></thead>"
    )
    sections = "".join(
        f'<h2>User {escape(user)}</h2><table data-user="{escape(user)}">{head}<tbody>'
        f"{''.join(_client_row(r, csrf) for r in clients)}</tbody></table>"
        for user, clients in rows.items()
    )
    body = (
        "<h1>Clients</h1><p class=muted>Enrolled client agents by user: connected, then recently seen "
        "(offline for less than a day), then the others. Round trip: to Redis, as the agent measures it.</p>"
        f"{sections or '<p class=muted>no client is enrolled (`vancetope clients enroll`)</p>'}"
    )
    return page("Clients", body)


def unavailable_page(title: str, why: str) -> str:
    return page(title, f"<h1>{escape(title)}</h1><p>{escape(why)}</p>")
