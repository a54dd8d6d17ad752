"""Commands about task trees (layer: brain/cli): run, explain, status, schedules, cancel."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import click
import redis
from rich.markdown import Markdown
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from brain.cli.base import (
    EXIT_BAD_INPUT,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_STACK,
    EXIT_TIMED_OUT,
    EXIT_TREE_FAILED,
    cli,
    console,
    err,
    fail,
    running_brain,
    settings_options_given,
    stack_for,
)
from brain.cli.display import (
    THROTTLED,
    duration,
    limits_table,
    queues_table,
    some_ids,
    task_table,
    trees_table,
)
from brain.cli.explain_limits import limit_lines
from brain.cli.schedule_view import schedules_report, schedules_table
from brain.cli.watch import watch
from brain.config import Settings
from brain.core.limits import TreeRefused
from brain.core.models import (
    RunIf,
    SessionKind,
    TaskRecord,
    TaskSpec,
    TaskState,
    TaskTree,
    TreeRecord,
    TreeStatus,
)
from brain.core.report import tree_report, trees_report
from brain.core.routing import (
    Presence,
    Route,
    RouteKind,
    RouteRequest,
    client_tools,
    decide_route,
    reachable_client_ids,
)
from brain.core.sessions import ClientSession, announced_schemas, held_names
from brain.core.snapshot import RegistrySnapshot
from brain.core.submission import SubmitRequest, check_submission
from brain.core.summary import render_markdown, shown_summary
from brain.core.toolnames import clash_lines
from brain.core.treefile import load_tree
from brain.core.validation import tree_problems, unknown_tools
from brain.errors import (
    InvalidFile,
    InvalidRegistry,
    InvalidTaskTree,
    NotFound,
    StackAlreadyRunning,
    StackNotRunning,
)
from brain.hot.boundary import unreachable
from brain.hot.gate import Gate
from brain.hot.queues import QueuesReport, queues_report
from brain.runtime import operations, vault
from brain.runtime.registry import build_registry
from brain.runtime.scheduler import new_tree_id
from brain.runtime.service import Brain
from brain.stack.embedded import (
    running_stack_url,
)
from brain.store import Store, open_store
from workers.contracts import client_queue
from workers.redis_connect import redis_client


@cli.command()
@click.argument("tree_file", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.option(
    "--client",
    "client_id",
    help="Bind the tree to this client agent: its client tasks run there only (parked while it is "
    "offline), as its enrolled user. Without it, any connected client of --user may run them.",
)
@click.option(
    "--autonomous/--interactive",
    default=None,
    help="Session kind (default: interactive with --client, else autonomous).",
)
@click.option(
    "--user",
    help="Whose clients may run client tools (default: --client's user, else `user` in vancetope.toml).",
)
@click.option("--no-agent", is_flag=True, help="Start the embedded stack without its local client agent.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=None,
    help="Stop watching after this many seconds (0: never; the tree goes on either way).",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="At the end print the tree's record as JSON (progress goes to stderr).",
)
@click.pass_obj
def run(
    settings: Settings,
    tree_file: Path,
    client_id: str | None,
    autonomous: bool | None,
    user: str | None,
    no_agent: bool,
    timeout: float | None,
    as_json: bool,
) -> None:
    """Run TREE_FILE to the end with a live progress display, then print every task.

    Uses a stack started by `vancetope up` (or VANCETOPE_REDIS_URL); without one it
    starts the embedded stack — with its local client agent unless --no-agent — for the
    length of the run. Tasks waiting for an offline client show as blocked or
    pending_client and run when it connects. Exits 0 only if every task is done.
    """
    tree = _load_tree_or_exit(tree_file, settings)
    if not (settings.redis_url or running_stack_url(settings)):
        # Before anything starts: a tree that cannot run must not cost a stack start-up. (A
        # running stack's brain checks it whole, with who is connected, before submitting.)
        _check_before_start(tree, settings, tree_file, no_agent=no_agent)
    if client_id is not None:
        _check_client_id(client_id)
    session = (
        SessionKind.AUTONOMOUS
        if (autonomous or (autonomous is None and not client_id))
        else SessionKind.INTERACTIVE
    )
    run_user = user or settings.user
    stack_url = settings.redis_url or ""
    stopped: list[str] = []  # what Ctrl-C did, in one line, once the watch ended
    try:
        with stack_for(settings, no_agent=no_agent) as (url, own_stack):
            stack_url = url
            brain = Brain.connect(settings, url)
            try:
                if client_id is not None:
                    # Bound to a client: its work runs there only, as its enrolled user.
                    run_user = user or _check_enrolled(brain, client_id)
                registry = brain.scheduler.registry
                # The id is chosen here, so that a Ctrl-C while the brain records the tree can
                # still find it and stop it (else the tree stayed `running`, its stack gone).
                request = SubmitRequest(
                    tree=tree,
                    source=str(tree_file),
                    session=session,
                    client_id=client_id,
                    user=run_user,
                    tree_id=new_tree_id(tree),
                )
                try:
                    accepted = brain.scheduler.accept(request)
                except (InvalidTaskTree, TreeRefused) as exc:
                    fail(str(exc), EXIT_BAD_INPUT)
                except KeyboardInterrupt:
                    if request.tree_id is None or brain.store.get_tree(request.tree_id) is None:
                        raise
                    stopped.append(_interrupt(brain, request.tree_id, own_stack))
                    raise _Submitted from None
                _print_warnings(accepted.warnings, registry)
                waiting = _tasks_waiting_for_a_client(tree, registry) if not (client_id or run_user) else []
                if waiting:
                    err.print(
                        f"[yellow]warning:[/] no --client and no --user: task(s) {', '.join(waiting)} can "
                        "only wait, since no client may take them (set `user` in vancetope.toml or "
                        "pass --user)",
                        highlight=False,
                    )
                record = accepted.record

                def interrupted(tree_id: str = record.tree_id) -> None:
                    stopped.append(_interrupt(brain, tree_id, own_stack))

                try:
                    if as_json:
                        status = watch(
                            brain,
                            record.tree_id,
                            timeout,
                            err,
                            err,
                            show_table=False,
                            on_interrupt=interrupted,
                        )
                        tasks = brain.store.get_tasks(record.tree_id)
                        final = brain.store.get_tree(record.tree_id) or record
                        click.echo(json.dumps(_tree_json(brain.store, final, tasks), indent=2))
                    else:
                        status = watch(brain, record.tree_id, timeout, console, err, on_interrupt=interrupted)
                except KeyboardInterrupt:
                    # Submitted, but the watch had not begun (or had ended): the same answer.
                    if not stopped:
                        interrupted()
                    status = None
            finally:
                brain.close()
    except _Submitted:
        status = None  # stopped while it was being submitted: `stopped` says what happened
    except KeyboardInterrupt:
        # Before the tree was submitted (the stack was starting): nothing runs, nothing to cancel.
        err.print("[yellow]interrupted (Ctrl-C) before the tree was submitted; nothing runs[/]")
        sys.exit(EXIT_INTERRUPTED)
    except (StackNotRunning, StackAlreadyRunning) as exc:
        fail(str(exc), EXIT_STACK)
    except redis.RedisError as exc:
        # Redis failed outside the watcher's retries (e.g. while submitting): say so in one line.
        fail(str(unreachable(stack_url, exc)), EXIT_STACK)
    if stopped:
        err.print(f"[yellow]{escape(stopped[0])}[/]", highlight=False, soft_wrap=True)
        sys.exit(EXIT_INTERRUPTED)
    sys.exit(run_exit_code(status))


class _Submitted(Exception):
    """Ctrl-C came while the brain was recording the tree, and the tree was stopped: leave the
    stack's block (it stops the stack) and say so as after any other Ctrl-C."""


# What a task cancelled because its `run` was stopped records (issue 22): not "by user", since
# nobody asked for that tree to end but for the run's own stack to stop.
INTERRUPTED_REASON = "interrupted: vancetope run was stopped (Ctrl-C)"


def _interrupt(brain: Brain, tree_id: str, own_stack: bool) -> str:
    """Ctrl-C on `run`: a stack that stays up goes on with the tree; a stack this run started
    is about to stop, so the tree's unfinished work is cancelled (recorded as interrupted)
    rather than left ``running`` with nothing behind it. The line that says which."""
    if not own_stack:
        return f"stopped watching (Ctrl-C); the tree goes on: vancetope status {tree_id}"
    cancelled = brain.sweeps.cancel(tree_id, reason=INTERRUPTED_REASON)
    return (
        f"interrupted (Ctrl-C): tree {tree_id} stopped with the stack this run started; "
        f"{len(cancelled)} unfinished task(s) cancelled: vancetope status {tree_id}"
    )


def run_exit_code(status: TreeStatus | None) -> int:
    """None: the watch ended before the tree did (--timeout)."""
    if status is None:
        return EXIT_TIMED_OUT
    return EXIT_OK if status is TreeStatus.DONE else EXIT_TREE_FAILED


def _check_client_id(client_id: str) -> None:
    try:
        client_queue(client_id)
    except ValueError as exc:
        fail(f"--client: {exc}", EXIT_BAD_INPUT)


def _check_enrolled(brain: Brain, client_id: str) -> str:
    """Enrollments are asked for once the stack is up: the embedded stack enrolls its own agent.
    The client's user."""
    enrollment = brain.scheduler.presence.enrollment(client_id)
    if enrollment is None:
        fail(
            f"--client: client {client_id!r} is not enrolled, so no session can be bound to it; "
            f"`vancetope clients` lists the enrolled ones, `vancetope clients enroll {client_id} --user U` "
            "enrolls it",
            EXIT_BAD_INPUT,
        )
    return enrollment.user


def _load_tree_or_exit(path: Path, settings: Settings) -> TaskTree:
    try:
        return load_tree(path, max_bytes=settings.max_tree_bytes)
    except (InvalidFile, InvalidTaskTree) as exc:
        fail(str(exc), EXIT_BAD_INPUT)


def _check_before_start(tree: TaskTree, settings: Settings, path: Path, *, no_agent: bool = False) -> None:
    """Refuse a tree that is invalid against what is known without starting anything: the
    built-ins and the registry file (MCP tools are checked once the brain has listed them).
    A refusal names every problem: the MCP servers are then asked for their tools too, so an
    argument error of an MCP tool is not left for the next try; and, when no client can
    connect to the stack this run starts (no agent), every tool nothing declares."""
    try:
        declared = build_registry(settings, discover=False)
        # Pools are checked once the brain answers: a running stack may know pools this
        # directory's config does not.
        problems = tree_problems(tree, declared.tools, source=str(path), engines=declared.engines)
        if not problems:
            return
        if settings.mcp_config and any(t not in declared.tools for spec in tree.tasks for t in spec.toolset):
            declared = build_registry(settings)
            problems = tree_problems(tree, declared.tools, source=str(path), engines=declared.engines)
        if no_agent or not settings.agent_config:
            known = declared.tools.keys() | declared.clashes.keys()
            problems += unknown_tools(tree, known, names=known)
    except (InvalidRegistry, InvalidFile, InvalidTaskTree) as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    fail(str(InvalidTaskTree(str(path), problems)), EXIT_BAD_INPUT)


def _validate_or_exit(
    tree: TaskTree,
    registry: RegistrySnapshot,
    path: Path,
    announced: frozenset[str] = frozenset(),
    schemas: Mapping[str, Sequence[dict[str, Any]]] | None = None,
) -> None:
    """``announced``: tools the run's connected clients offer, so they are not called unknown;
    ``schemas``: their input schemas, against which the arguments are checked as the brain will."""
    try:
        warnings = check_submission(
            tree, registry, source=str(path), announced=announced, announced_schemas=schemas
        )
    except InvalidTaskTree as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    _print_warnings(warnings, registry)


def _print_warnings(warnings: list[str], registry: RegistrySnapshot) -> None:
    for warning in warnings:
        err.print(f"[yellow]warning:[/] {escape(warning + _failed_servers(registry))}", highlight=False)


def _failed_servers(registry: RegistrySnapshot) -> str:
    if not registry.mcp_failures:
        return ""
    names = ", ".join(repr(f.server) for f in registry.mcp_failures)
    return f" (MCP server(s) {names} failed to start, so their tools are missing)"


def _routes(
    tree: TaskTree,
    registry: RegistrySnapshot,
    session: SessionKind = SessionKind.AUTONOMOUS,
    presence: Presence | None = None,
) -> list[tuple[TaskSpec, Route]]:
    """Each task's route in ``session`` as ``presence`` stands (default: no client connected),
    one view for the whole tree as the scheduler routes ready tasks. A server route of a tool
    whose MCP server the brain lacks is the failure a run meets (``RegistrySnapshot.unserved``)."""
    engine = registry.engines.get(tree.engine) if tree.engine else None
    view = presence or Presence()
    routes = []
    for spec in tree.tasks:
        route = decide_route(
            RouteRequest(
                tool=spec.tool,
                execution_target=spec.execution_target,
                session=session,
                engine=engine,
                pool=spec.pool,
                tree_pool=tree.pool,
                pools=frozenset(registry.pools),
            ),
            registry.tools,
            view,
        )
        unserved = registry.unserved.get(route.tool) if route.kind is RouteKind.SERVER else None
        if unserved is not None:
            route = Route(
                kind=RouteKind.FAIL, tool=route.tool, reason=f"{unserved}; a server run of it fails"
            )
        if route.kind is RouteKind.CLIENT and route.client_id is not None:
            view = view.with_call_sent_to(route.client_id)
        routes.append((spec, route))
    return routes


def _autonomous_routes(tree: TaskTree, registry: RegistrySnapshot) -> list[tuple[TaskSpec, Route]]:
    """Each task's route in an autonomous session with no client connected."""
    return _routes(tree, registry)


def _tasks_waiting_for_a_client(tree: TaskTree, registry: RegistrySnapshot) -> list[str]:
    """Tasks the router parks for a client when none may take them: the router's own verdict,
    so server tools, fallbacks and skips never trigger the warning."""
    parked = (RouteKind.BLOCKED, RouteKind.PENDING_CLIENT)
    return [spec.id for spec, route in _autonomous_routes(tree, registry) if route.kind in parked]


class _StackView:
    """What `explain` asks the running stack: its registry, who is connected, held tools."""

    def __init__(self) -> None:
        self.registry: RegistrySnapshot | None = None
        self.presence: Presence | None = None
        self.sessions: dict[str, ClientSession] = {}
        self.user: str | None = None
        # Budgets a 429 paused now: limit key -> why and until when (brain.hot.gate).
        self.pauses: dict[str, str] = {}


def _ask_stack(settings: Settings, client_id: str | None, user: str | None, *, registry: bool) -> _StackView:
    """The running stack's view for a run of ``user`` bound to ``client_id``; empty without a stack."""
    view = _StackView()
    url = settings.redis_url or running_stack_url(settings)
    if not url:
        return view
    with contextlib.suppress(StackNotRunning, redis.RedisError):
        brain = Brain.connect(settings, url)
        try:
            book = brain.scheduler.presence
            enrollment = book.enrollment(client_id) if client_id else None
            view.user = user or (enrollment.user if enrollment else None) or settings.user
            view.sessions = book.sessions()
            view.presence = book.view(
                user=view.user,
                session_client=client_id,
                sessions=view.sessions,
                registry=brain.scheduler.registry.tools,
            )
            if registry:
                view.registry = brain.scheduler.registry
            gate = Gate(brain.hot.r)
            keys, _ = gate.keys_view(gate.pauses())
            view.pauses = {
                key: f"{k.paused_why} until {time.strftime('%H:%M:%S', time.localtime(k.paused_until))}"
                for key, k in keys.items()
                if k.paused_until is not None
            }
        finally:
            brain.close()
    return view


@cli.command()
@click.argument("tree_file", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.option("--client", "client_id", help="As `run --client`: routes for a tree bound to this client.")
@click.option(
    "--autonomous/--interactive",
    default=None,
    help="Session kind (default: interactive with --client, else autonomous).",
)
@click.option("--user", help="As `run --user` (default: --client's user, else `user` in vancetope.toml).")
@click.pass_obj
def explain(
    settings: Settings, tree_file: Path, client_id: str | None, autonomous: bool | None, user: str | None
) -> None:
    """Validate TREE_FILE and show, per task, the route `run` would take now and why; per
    server task, its priority, its limits and its user's fair share. Runs nothing.

    Asks the running stack, when there is one: its registry and who is connected (routes
    with them); else the local config, with no client connected. Exits 2 if the tree is
    invalid (as `run` refuses it), 1 if it is valid but some task would fail as things stand
    (e.g. its MCP server is missing or failed to start), else 0.
    """
    tree = _load_tree_or_exit(tree_file, settings)
    if client_id is not None:
        _check_client_id(client_id)
    given = settings_options_given(click.get_current_context())
    from_files = bool(given.get("registry") or given.get("mcp_config"))
    # Files named on the command line (--registry, --mcp-config) are what is explained, even
    # while a stack runs (they were ignored, silently); who is connected still comes from it.
    stack = _ask_stack(settings, client_id, user, registry=not from_files)
    registry = stack.registry or _local_registry(settings)
    session = (
        SessionKind.AUTONOMOUS
        if (autonomous or (autonomous is None and not client_id))
        else SessionKind.INTERACTIVE
    )
    for failure in registry.mcp_failures:
        err.print(f"[yellow]warning:[/] {escape(failure.described())}", highlight=False)
    for line in clash_lines(registry.clashes):
        err.print(f"[yellow]warning:[/] {escape(line)}", highlight=False)
    if stack.presence is not None:
        for cid in sorted(reachable_client_ids(stack.presence)):
            client_session = stack.sessions.get(cid)
            for line in clash_lines(client_session.clashes(registry.tools)) if client_session else []:
                err.print(f"[yellow]warning:[/] {escape(f'client {cid}: {line}')}", highlight=False)
    announced = (
        client_tools(stack.presence) | held_names(stack.sessions, reachable_client_ids(stack.presence))
        if stack.presence is not None
        else frozenset()
    )
    # Before the check: a tool held for approval is worth naming even when this run may not
    # use its client (the check then says the tool is unknown to it).
    for line in _held_tool_lines(stack.sessions, {spec.tool for spec in tree.tasks}):
        err.print(f"[yellow]warning:[/] {escape(line)}", highlight=False)
    schemas = (
        announced_schemas(
            (stack.sessions[c] for c in sorted(reachable_client_ids(stack.presence)) if c in stack.sessions),
            registry.tools,
        )
        if stack.presence is not None
        else None
    )
    _validate_or_exit(tree, registry, tree_file, announced, schemas)
    routes = _routes(tree, registry, session, stack.presence)
    failing = [(spec, route) for spec, route in routes if route.kind is RouteKind.FAIL]
    verdict = "valid" if not failing else f"valid, but {len(failing)} task(s) will fail"
    table = Table(title=Text(f"{tree_file}: {len(tree.tasks)} task(s), {verdict}"), title_justify="left")
    for col in ("task", "tool", "target", "route", "why"):
        table.add_column(col, overflow="fold")
    for spec, route in routes:
        table.add_row(
            *map(Text, (spec.id, spec.tool, spec.execution_target.value, route.summary, route.reason))
        )
    console.print(table)
    for line in _policy_lines(tree, registry, settings):
        console.print(Text(line), soft_wrap=True)
    shares = limit_lines(
        tree,
        routes,
        registry,
        stack.pauses,
        session=session,
        fairness=settings.fairness,
        user=stack.user or user or settings.user,
    )
    for line in shares:
        console.print(Text(line), soft_wrap=True)
    console.print(Text(_routes_note(stack, session, client_id), style="dim"))
    if failing:
        missing = sorted({spec.tool for spec, route in failing if route.reason.startswith("Tool unknown")})
        if missing:
            err.print(
                f"[red]missing tools:[/] {', '.join(missing)}: not in the registry"
                f"{_failed_servers(registry)}; a client that announces them could still run them",
                highlight=False,
            )
        sys.exit(EXIT_TREE_FAILED)


def _policy_lines(tree: TaskTree, registry: RegistrySnapshot, settings: Settings) -> list[str]:
    """Per task with one: its retry policy (and where it comes from), its trigger rule, its fan-out."""
    lines = []
    for spec in tree.tasks:
        tool = registry.tools.get(spec.tool)
        sources = (
            ("the task", spec.retry),
            (f"tool {spec.tool}", tool.retry if tool else None),
            ("the tree", tree.retry),
            ("the retry setting", settings.retry),
        )
        origin, policy = next(((o, p) for o, p in sources if p is not None), ("", None))
        parts = []
        if policy is not None and policy.max_attempts > 1:
            parts.append(f"retry {policy.shown()} (from {origin})")
        if spec.run_if is not RunIf.ALL_SUCCEEDED:
            parts.append(f"run_if {spec.run_if.value} ({', '.join(spec.depends_on)})")
        if spec.for_each is not None:
            limit = spec.max_fan_out or settings.max_fan_out
            parts.append(f"for_each {spec.for_each} as {spec.item_name} (at most {limit} items)")
        if parts:
            lines.append(f"task {spec.id!r}: {'; '.join(parts)}")
    return lines


def _routes_note(stack: _StackView, session: SessionKind, client_id: str | None) -> str:
    """Under the table: whose session the routes are for, and who was connected."""
    bound = f", bound to client {client_id}" if client_id else ""
    if stack.presence is None:
        return (
            f"Routes assume an {session.value} session{bound} with no client connected "
            "(no stack running here; `vancetope up` starts one)."
        )
    connected = ", ".join(f"{cid} ({s.user})" for cid, s in sorted(stack.sessions.items())) or "none"
    who = f" of user {stack.user}" if stack.user else ""
    return f"Routes as the running stack would take them now: an {session.value} session{who}{bound}; clients connected: {connected}."


def _local_registry(settings: Settings) -> RegistrySnapshot:
    """The registry the config here makes, its MCP servers asked (their ``${vault:NAME}``
    resolved from the vault, as the brain resolves them)."""
    vault.install(settings)
    try:
        return build_registry(settings)
    except (InvalidRegistry, InvalidFile) as exc:
        fail(str(exc), EXIT_BAD_INPUT)


def _held_tool_lines(sessions: Mapping[str, ClientSession], tools: set[str]) -> list[str]:
    """Tools of the tree that a connected client announced with a changed definition (brain.hot.toolpins)."""
    return [
        f"tool {t.name!r} of client {cid}: its definition changed since it was pinned; not routed to "
        f"until `vancetope clients approve-tools {cid} {t.name}`"
        for cid, session in sorted(sessions.items())
        for t in session.held_tools
        if t.name in tools
    ]


@cli.command()
@click.argument("tree_id", required=False)
@click.argument("task_id", required=False)
@click.option(
    "--json", "as_json", is_flag=True, help="Print JSON (shape in docs/output.md) instead of a table."
)
@click.option(
    "--queues",
    "queues_only",
    is_flag=True,
    help="Only the queues: per server pool, client and user, the work waiting and who takes it; "
    "then each limit (rate_limit, max_concurrency, max_in_flight_per_user as user:NAME@POOL): what "
    "waits on it and whose, the slots held, the rate now and a 429 pause.",
)
@click.pass_obj
def status(
    settings: Settings, tree_id: str | None, task_id: str | None, as_json: bool, queues_only: bool
) -> None:
    """Show recent task trees and the queues, or every task of TREE_ID with its state, route and
    a one-line preview of its result, or TASK_ID of it with its whole result.

    Trees come from the store: they show while Redis is down. The queues (per server pool,
    client and user: work waiting, and whether anyone consumes it) need the stack.
    --json prints whole results; --queues --json the queues.
    """
    if queues_only:
        _status_queues(settings, as_json)
        return
    store = open_store(settings.store)
    try:
        if tree_id is None:
            trees = store.list_trees(limit=20)
            counts = {t.tree_id: Counter(r.state.value for r in store.get_tasks(t.tree_id)) for t in trees}
            if as_json:
                click.echo(json.dumps(trees_report(trees, counts), indent=2))
            else:
                console.print(trees_table(trees, counts) if trees else "no task trees yet")
                _show_queues(settings)
            return
        tree_rec = store.get_tree(tree_id)
        if tree_rec is None:
            fail(f"no task tree {tree_id!r}; `vancetope status` lists them", EXIT_BAD_INPUT)
        tasks = store.get_tasks(tree_id)
        if task_id is not None:
            _show_task(tree_rec, tasks, task_id, as_json)
        elif as_json:
            report = _tree_json(store, tree_rec, tasks)
            marks = _gate_marks(settings, tasks)
            for entry in report.get("tasks", []):
                mark = marks.get(entry.get("task_id", ""))
                if mark is not None:
                    # ``state`` stays the store's (queued_server); the gate's view beside it.
                    entry["shown_state"], entry["throttled_by"] = THROTTLED, mark["throttled"]
            click.echo(json.dumps(report, indent=2))
        else:
            console.print(task_table(tree_rec, tasks, _gate_marks(settings, tasks)))
            summary = shown_summary(tree_rec, tasks, store.get_summaries(tree_id), time.time())
            if summary is not None:
                console.print(Markdown(render_markdown(summary)))
    finally:
        store.close()


def _show_task(tree_rec: TreeRecord, tasks: list[TaskRecord], task_id: str, as_json: bool) -> None:
    """One task whole: its record, and its result (or error) as JSON under it, not shortened."""
    rec = next((t for t in tasks if t.task_id == task_id), None)
    if rec is None:
        known = ", ".join(t.task_id for t in tasks)
        fail(f"tree {tree_rec.tree_id!r} has no task {task_id!r}; its tasks: {known}", EXIT_BAD_INPUT)
    if as_json:
        click.echo(rec.model_dump_json(indent=2))
        return
    rows = (
        ("task", rec.task_id),
        ("tool", rec.tool),
        ("state", rec.state.value),
        ("route", rec.route),
        ("attempt", str(rec.attempt)),
        ("duration", duration(rec)),
        ("reason", rec.reason),
    )
    for name, value in rows:
        if value:
            console.print(Text(f"{name}: ", style="bold") + Text(value), soft_wrap=True)
    for attempt in rec.attempts:
        error = f"{attempt.error.type}: {attempt.error.message}" if attempt.error else "failed"
        took = (
            f" after {attempt.finished_at - attempt.started_at:.2f}s"
            if attempt.started_at and attempt.finished_at
            else ""
        )
        console.print(
            Text(f"attempt {attempt.number}: ", style="bold") + Text(f"{error} ({attempt.route}{took})"),
            soft_wrap=True,
        )
    if rec.state is TaskState.RETRYING and rec.retry_at:
        when = time.strftime("%H:%M:%S", time.localtime(rec.retry_at))
        console.print(Text("next attempt: ", style="bold") + Text(f"{len(rec.attempts) + 1} at {when}"))
    if rec.error is not None:
        console.print(Text("error:", style="bold red"))
        click.echo(rec.error.model_dump_json(indent=2))
    if rec.state is TaskState.DONE:
        console.print(Text("result:", style="bold"))
        # Plain JSON, not rich's: whole, copyable, the same bytes as `--json` holds.
        click.echo(json.dumps(rec.result, indent=2, ensure_ascii=False, default=str))


def _status_queues(settings: Settings, as_json: bool) -> None:
    url = settings.redis_url or running_stack_url(settings)
    if not url:
        fail(
            "no stack is running here: start one with `vancetope up` (or set VANCETOPE_REDIS_URL)", EXIT_STACK
        )
    try:
        report = queues_report(settings, url)
    except StackNotRunning as exc:
        fail(str(exc), EXIT_STACK)
    if as_json:
        click.echo(report.model_dump_json(indent=2))
    else:
        _print_queues(report)


def _show_queues(settings: Settings) -> None:
    """The queues under the trees, when a stack answers; else one dim line saying why not."""
    url = settings.redis_url or running_stack_url(settings)
    if not url:
        console.print("[dim]queues: no stack running here (`vancetope up`)[/]")
        return
    try:
        _print_queues(queues_report(settings, url))
    except StackNotRunning as exc:
        console.print(f"[dim]queues: {escape(str(exc))}[/]", highlight=False)


def _print_queues(report: QueuesReport) -> None:
    console.print(queues_table(report))
    if report.limits:
        console.print(limits_table(report))
    for line in report.alarms():
        console.print(
            f"[bold red]work waiting, nobody consuming:[/] {escape(line)}", highlight=False, soft_wrap=True
        )


def _gate_marks(settings: Settings, tasks: Sequence[TaskRecord]) -> dict[str, dict[str, Any]]:
    """Task id -> a ``throttled`` mark for each queued server run waiting at the gate
    (brain.hot.gate): the store says ``queued_server``, the gate says it waits, and by which
    limit. Without a stack that answers, none (status still reads the store alone)."""
    waiting = {r.run_id: r.task_id for r in tasks if r.state is TaskState.QUEUED_SERVER and r.run_id}
    url = settings.redis_url or running_stack_url(settings)
    if not waiting or not url:
        return {}
    try:
        r = redis_client(url, socket_timeout=5, socket_connect_timeout=2)
        try:
            why = Gate(r).throttled(waiting)
        finally:
            r.close()
    except redis.RedisError:
        return {}
    return {waiting[run]: {"run_id": run, "throttled": reason} for run, reason in why.items()}


def _tree_json(store: Store, tree_rec: TreeRecord, tasks: list[TaskRecord]) -> dict[str, Any]:
    """The tree as `run --json` and `status TREE_ID --json` print it: the report, its summary."""
    stored = store.get_summaries(tree_rec.tree_id)
    summary = shown_summary(tree_rec, tasks, stored, time.time())
    return {
        **tree_report(tree_rec, tasks),
        "summary": summary.model_dump(mode="json") if summary else None,
        "summaries": [s.model_dump(mode="json") for s in stored],
    }


@cli.command()
@click.option(
    "--json", "as_json", is_flag=True, help="Print JSON (one object per schedule) instead of a table."
)
@click.pass_obj
def schedules(settings: Settings, as_json: bool) -> None:
    """List the [[schedules]] of vancetope.toml: when each fires, its last and next fire, its last run.

    Reads the settings and the store only (works without Redis). A next fire in the past
    means beat is not running: `vancetope up` runs it, or `vancetope beat`.
    """
    store = open_store(settings.store)
    try:
        last_runs = {
            s.name: next(iter(store.schedule_runs(s.name, limit=1)), None) for s in settings.schedules
        }
        rows = schedules_report(settings.schedules, store.last_fires(), last_runs, time.time())
    finally:
        store.close()
    if as_json:
        click.echo(json.dumps(rows, indent=2))
    elif rows:
        console.print(schedules_table(rows, time.time()))
    else:
        console.print(
            escape("no schedules: add [[schedules]] tables to vancetope.toml (see docs/schedules.md)")
        )


@cli.command()
@click.argument("tree_id")
@click.argument("task_id", required=False)
@click.pass_obj
def cancel(settings: Settings, tree_id: str, task_id: str | None) -> None:
    """Cancel TREE_ID (or only its TASK_ID): unfinished tasks end as skipped (cancelled by user).

    Parked work is cancelled too; a run already sent to an offline client is never started
    when that client comes back.
    """
    with running_brain(settings) as brain:
        try:
            done = operations.cancel(brain, tree_id, task_id)
        except NotFound as exc:
            fail(str(exc), EXIT_BAD_INPUT)
    console.print(escape(f"cancelled {len(done)} task(s): {some_ids(done) or 'none were unfinished'}"))
