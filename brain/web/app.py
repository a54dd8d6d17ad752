"""The web view as a Starlette app (layer: brain/web): ``/trees``, ``/trees/<id>``, a task's
details, a tree's live updates as server-sent events, and the actions (cancel a tree or a
task) behind a CSRF token (brain.web.csrf).

Its pages read the store read-only (``open_store(..., read_only=True)``: SQLite ``mode=ro``;
MongoDB as the URL's user), through the same store calls ``vancetope status`` makes; the
actions go through a brain connection (brain.web.actions). Live updates poll the store's ``task_states`` (an index read, not whole records)
every ``poll_s`` for each open tree page and send what changed: a change shows within about
half a second whoever made it (brain, server pool, relay), with no wake-up channel to miss.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from importlib import resources
from urllib.parse import parse_qs, quote

import redis
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route

from brain.core.fanout import parent_of
from brain.core.models import TaskRecord, TaskState, TreeRecord, TreeStatus
from brain.core.summary import SummaryKind, shown_summary, summarise
from brain.errors import BadQuery, NotFound, StackNotRunning
from brain.runtime import operations
from brain.runtime.service import Brain
from brain.store import Store
from brain.web import pages
from brain.web.actions import NO_REDIS, Actions
from brain.web.csrf import COOKIE, FIELD, HEADER, Csrf
from brain.web.guard import Guard
from brain.web.views import (
    WAITING,
    Seen,
    bar_times,
    client_rows,
    first_failure,
    group_counts,
    group_id,
    group_label,
    group_state,
    group_title,
    layout,
    matches,
    time_window,
    tree_row,
)

# The vendored libraries the pages load (brain/web/static/vendor/README.md), read once.
VENDORED = {
    name: (resources.files("brain.web") / "static" / "vendor" / name).read_bytes() for name in (pages.DAGRE,)
}
POLL_S = 0.5
# The Flower `vancetope up --flower` starts (brain.cli.services.FLOWER_PORT).
DEFAULT_FLOWER_URL = "http://127.0.0.1:5555"
# An action's form is a token and a few names; a session cookie is ours (Csrf.new_session).
MAX_FORM_BYTES = 16_384
MAX_SESSION_CHARS = 64
# A comment line this often keeps proxies from closing a quiet event stream.
KEEPALIVE_S = 15.0
# How many of the newest trees /trees looks at before filtering.
RECENT_TREES = 200
SHOWN_TREES = 50


def _html(text: str, status: int = 200, session: str | None = None) -> HTMLResponse:
    """A page with its inline script allowed by a nonce and nothing else from anywhere;
    ``session``: a new CSRF session cookie to set (brain.web.csrf)."""
    nonce = secrets.token_urlsafe(16)
    cookie = {"Set-Cookie": Csrf.cookie(session)} if session else {}
    return HTMLResponse(
        text.replace("<script>", f'<script nonce="{nonce}">'),
        status_code=status,
        headers={
            **cookie,
            "Content-Security-Policy": (
                f"default-src 'self'; script-src 'self' 'nonce-{nonce}'; style-src 'unsafe-inline'; "
                "img-src 'self' data:; frame-ancestors 'none'; form-action 'self'"
            ),
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "same-origin",
            "Cache-Control": "no-store",
        },
    )


def _not_found(what: str) -> HTMLResponse:
    return _html(pages.page("Not found", f"<h1>Not found</h1><p>{pages.escape(what)}</p>"), 404)


def _listed(request: Request, logins: Collection[str]) -> bool:
    """Whether the request's login is one of ``logins``, a ``web_*_users`` setting's value."""
    if "none" in logins:  # the settings' word for no login (brain.config)
        return False
    return "*" in logins or getattr(request.state, "login", None) in logins


def create_app(
    store: Store,
    *,
    address: str,
    users: Mapping[str, str],
    unauthorized: str,
    clock: Callable[[], float] = time.time,
    poll_s: float = POLL_S,
    actions: Actions | None = None,
    flower_url: str | None = None,
    result_users: Collection[str] = (),
    argument_users: Collection[str] = (),
) -> Guard:
    """The app behind its guard (``brain.web.guard``): no route is reachable without it.
    ``actions``: the brain connection cancel and approve go through (None or without a Redis
    URL: pages only, and each action answers 503); ``flower_url``: where a task's Celery task
    ids link (Flower's task pages; None: not linked); ``result_users``: the logins a task's
    details show its result value to (``*``: every login; the ``web_result_users`` setting);
    ``argument_users``: those shown its argument values (``web_argument_users``)."""
    csrf = Csrf()

    def token(request: Request) -> tuple[str | None, str | None]:
        """(the CSRF token a page gives its forms, None when no action is offered; the session
        cookie to set when the browser has none)."""
        if actions is None or not actions.available:
            return None, None
        session = request.cookies.get(COOKIE)
        fresh = None
        if not session or len(session) > MAX_SESSION_CHARS:
            session = fresh = Csrf.new_session()
        return csrf.token(session), fresh

    async def clients_seen() -> Seen | None:
        """Who is connected and when each client was last seen, for the waits' "offline since"
        (None without a brain connection: the waits then say when the work was parked)."""
        if actions is None or not actions.available:
            return None

        def read(brain: Brain) -> Seen:
            book = brain.scheduler.presence
            return Seen(frozenset(book.sessions()), book.last_seen())

        try:
            return await run_in_threadpool(actions.run, read)
        except (StackNotRunning, redis.RedisError):
            return None

    async def act(
        request: Request, operation: Callable[[Brain, dict[str, list[str]]], object], then: str
    ) -> Response:
        """Check the posted CSRF token against the session cookie, run ``operation`` through
        the brain (with the posted form), then send the browser to ``then``."""
        form = parse_qs((await request.body())[:MAX_FORM_BYTES].decode("utf-8", "replace"))
        given = request.headers.get(HEADER) or next(iter(form.get(FIELD, [])), None)
        if not csrf.valid(request.cookies.get(COOKIE), given):
            return PlainTextResponse(
                "403 Forbidden: this action's CSRF token is missing or stale (the web view may have "
                "restarted): reload the page and try again\n",
                status_code=403,
            )
        if actions is None or not actions.available:
            return PlainTextResponse(f"503 Service Unavailable: {NO_REDIS}\n", status_code=503)
        try:
            await run_in_threadpool(actions.run, lambda brain: operation(brain, form))
        except NotFound as exc:
            return _not_found(str(exc))
        except (StackNotRunning, redis.RedisError) as exc:
            return PlainTextResponse(f"503 Service Unavailable: {exc}\n", status_code=503)
        return RedirectResponse(then, 303)

    async def cancel(request: Request) -> Response:
        tree_id, task_id = request.path_params["tree_id"], request.path_params.get("task_id")
        return await act(
            request,
            lambda brain, _: operations.cancel(brain, tree_id, task_id),
            f"/trees/{quote(tree_id, safe='')}",
        )

    async def approve_tools(request: Request) -> Response:
        client_id = request.path_params["client_id"]
        return await act(
            request,
            # The tools the page showed held: one held since is not approved unseen.
            lambda brain, form: operations.approve_tools(brain, client_id, form.get("tool", [])),
            "/clients",
        )

    async def clients(request: Request) -> Response:
        if actions is None or not actions.available:
            return _html(pages.unavailable_page("Clients", NO_REDIS), 503)
        given, session = token(request)
        try:
            report = await run_in_threadpool(actions.run, operations.clients_view)
        except (StackNotRunning, redis.RedisError) as exc:
            return _html(pages.unavailable_page("Clients", str(exc)), 503)
        return _html(pages.clients_page(client_rows(report, clock()), given), session=session)

    async def trees(request: Request) -> Response:
        query = request.query_params
        status = query.get("status") or None
        user = query.get("user") or None
        schedule = query.get("schedule") or None
        if status is not None and status not in pages.TREE_STATUSES:
            return PlainTextResponse(f"status must be one of {', '.join(pages.TREE_STATUSES)}\n", 400)
        try:
            since, until = time_window(query.get("since"), query.get("until"), query.get("last"), clock())
        except BadQuery as exc:
            return PlainTextResponse(f"400 Bad Request: {exc}\n", 400)
        shown_filters = pages.TreeFilters(
            status, user, schedule, *(query.get(k) or None for k in ("since", "until", "last"))
        )

        def read() -> str:
            # The store selects the window (and the schedule's runs) by its indexes, as the
            # schedules' own look-ups do; status and user are picked from what it returns.
            recent = (
                store.schedule_runs(schedule, limit=RECENT_TREES, since=since, until=until)
                if schedule
                else store.list_trees(limit=RECENT_TREES, since=since, until=until)
            )
            users_seen = sorted({t.user for t in recent if t.user})
            schedules_seen = sorted({t.schedule for t in recent if t.schedule})
            shown = [t for t in recent if matches(t, status, user)][:SHOWN_TREES]
            now = clock()
            rows = []
            for t in shown:
                # States only (an index read); whole records only of the tasks that wait.
                states = store.task_states(t.tree_id)
                waiting = (
                    [k for k, v in states.items() if v in WAITING] if t.status is TreeStatus.RUNNING else []
                )
                rows.append(
                    tree_row(t, states, now, store.get_tasks(t.tree_id, waiting) if waiting else [], seen)
                )
            return pages.trees_page(rows, shown_filters, users_seen, schedules_seen)

        seen = await clients_seen()
        return _html(await run_in_threadpool(read))

    async def tree(request: Request) -> Response:
        tree_id = request.path_params["tree_id"]

        def read() -> str | None:
            record = store.get_tree(tree_id)
            if record is None:
                return None
            tasks = store.get_tasks(tree_id)
            now = clock()
            row = tree_row(record, {t.task_id: t.state for t in tasks}, now, tasks, seen)
            summary = morning_summary(record, tasks, now) if record.schedule else ""
            return pages.tree_page(record, tasks, layout(record, tasks), row, now, given, summary)

        def morning_summary(record: TreeRecord, tasks: list[TaskRecord], now: float) -> str:
            """The summary `vancetope status` shows (the stored final one, else the latest stored,
            else one made from the records of an ended run: brain.core.summary.shown_summary);
            while a run goes on with none stored yet, the same summary of its tasks as they stand."""
            stored = store.get_summaries(record.tree_id)
            summary = shown_summary(record, tasks, stored, now)
            return pages.summary_section(
                summary or summarise(record, tasks, SummaryKind.DEADLINE, now),
                summary in stored if summary is not None else False,
                first_failure(record, tasks),
            )

        given, session = token(request)
        seen = await clients_seen()
        text = await run_in_threadpool(read)
        return _not_found(f"no task tree {tree_id!r}") if text is None else _html(text, session=session)

    async def task(request: Request) -> Response:
        tree_id, task_id = request.path_params["tree_id"], request.path_params["task_id"]
        record = await run_in_threadpool(store.get_tree, tree_id)
        rec = await run_in_threadpool(store.get_task, tree_id, task_id) if record else None
        if record is None or rec is None:
            return _not_found(f"no task {task_id!r} in tree {tree_id!r}")
        given, session = token(request)
        details = pages.task_details(
            record,
            rec,
            given,
            flower_url,
            show_result=_listed(request, result_users),
            show_args=_listed(request, argument_users),
        )
        if request.query_params.get("fragment"):
            return _html(details, session=session)
        return _html(pages.task_page(record, rec, details), session=session)

    async def events(request: Request) -> Response:
        tree_id = request.path_params["tree_id"]
        if await run_in_threadpool(store.get_tree, tree_id) is None:
            return _not_found(f"no task tree {tree_id!r}")
        return StreamingResponse(
            _changes(request, store, tree_id, poll_s, clock),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    async def vendored(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in VENDORED:  # the listed files only: no path reaches anything else
            return PlainTextResponse("404 Not Found\n", 404)
        return Response(
            VENDORED[name],
            media_type="text/javascript",
            headers={"X-Content-Type-Options": "nosniff", "Cache-Control": "private, max-age=3600"},
        )

    async def root(request: Request) -> Response:
        return RedirectResponse("/trees", 303)

    app = Starlette(
        routes=[
            Route("/", root),
            Route("/trees", trees),
            Route("/trees/{tree_id}", tree),
            Route("/trees/{tree_id}/events", events),
            Route("/trees/{tree_id}/tasks/{task_id}", task),
            Route("/trees/{tree_id}/cancel", cancel, methods=["POST"]),
            Route("/trees/{tree_id}/tasks/{task_id}/cancel", cancel, methods=["POST"]),
            Route("/clients", clients),
            Route("/static/vendor/{name}", vendored),
            Route("/clients/{client_id}/approve-tools", approve_tools, methods=["POST"]),
        ]
    )
    return Guard(app, address=address, users=users, unauthorized=unauthorized)


async def _changes(
    request: Request, store: Store, tree_id: str, poll_s: float, clock: Callable[[], float]
) -> AsyncIterator[str]:
    """Server-sent events: first every task's state, then what changed, every ``poll_s``, with
    the changed tasks' bar times (``views.bar_times``) and the time now for the timeline; the
    tree's status with its counts when any state changed; ``final`` once the tree ended."""
    sent: dict[str, str] = {}
    quiet_since = time.monotonic()
    while not await request.is_disconnected():
        states = {k: v.value for k, v in (await run_in_threadpool(store.task_states, tree_id)).items()}
        changed = {k: v for k, v in states.items() if sent.get(k) != v}
        # The tree's status is written just after its last task's: once every task is final,
        # look again until the status says so too.
        if changed or (sent and all(TaskState(v).is_final for v in states.values())):
            record = await run_in_threadpool(store.get_tree, tree_id)
            status = record.status if record else TreeStatus.RUNNING
            if not changed and status is TreeStatus.RUNNING:
                await asyncio.sleep(poll_s)
                continue
            counts = dict(Counter(states.values()))
            touched = {group_id(p) for p in map(parent_of, changed) if p is not None}
            groups = {
                gid: {"state": group_state(c), "label": group_label(c), "title": group_title(gid[:-3], c)}
                for gid, c in group_counts(states).items()
                if gid in touched
            }
            # The page was drawn with every bar as of its load: only later changes move one.
            moved = (
                await run_in_threadpool(store.get_tasks, tree_id, list(changed)) if sent and changed else []
            )
            payload: dict[str, object] = {
                "states": changed,
                "times": {t.task_id: bar_times(t) for t in moved},
                "now": clock(),
                "groups": groups,
                "status": status.value,
                "counts_html": pages.counts_html(counts),
                # Tasks the page was not drawn with (a fan-out's items): it lays itself out again.
                "unknown": bool(sent) and bool(states.keys() - sent.keys()),
                "final": status is not TreeStatus.RUNNING,
            }
            sent = states
            quiet_since = time.monotonic()
            yield pages.event_data(payload)
            if status is not TreeStatus.RUNNING:
                return
        elif time.monotonic() - quiet_since > KEEPALIVE_S:
            quiet_since = time.monotonic()
            yield ": still here\n\n"
        await asyncio.sleep(poll_s)
