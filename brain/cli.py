"""The ``vancetope`` command (layer: brain, CLI). Parses flags, calls the brain, shows results.

Exit codes (a contract for scripts, README "Output for scripts"): 0 every task done; 1 the
tree ended otherwise (failed, skipped or cancelled tasks); 2 bad input (file, tree, config,
unknown id); 3 the stack or its store could not be reached or started; 4 the tree was still
running at --timeout.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import sqlite3
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import click
import pymongo.errors
import redis
from cryptography.fernet import Fernet
from rich.console import Console
from rich.markdown import Markdown
from rich.table import Table

from brain.config import Settings, load_settings
from brain.display import clients_table, queues_table, task_table, trees_table
from brain.enrollment import enroll, revoke
from brain.errors import (
    BrainError,
    ConfigError,
    InvalidFile,
    InvalidRegistry,
    InvalidTaskTree,
    StackNotRunning,
    StoreError,
)
from brain.flowerauth import FlowerAccess, FlowerUnprotected, flower_access
from brain.models import SessionKind, TaskRecord, TaskSpec, TaskTree, TreeRecord, TreeStatus
from brain.pools import unknown_pool
from brain.queues import QueuesReport, queues_report
from brain.redis_server import submitter_url, write_private
from brain.registry import RegistrySnapshot, build_registry
from brain.reload import RELOAD_REQUEST_KEY
from brain.report import clients_report, tree_report, trees_report
from brain.routing import Presence, Route, RouteKind, RouteRequest, client_tools, decide_route
from brain.schedule_view import schedules_report, schedules_table, shown_summary
from brain.service import Brain, unreachable
from brain.stack import (
    EmbeddedStack,
    beat_argv,
    gateway_argv,
    pool_service,
    running_stack_url,
    service_argvs,
    stack_env,
    without_agent,
)
from brain.store import Store, open_store
from brain.summary import render_markdown
from brain.supervisor import GaveUp, Supervisor
from brain.toolnames import clash_lines
from brain.toolpins import ToolPins
from brain.treefile import load_tree
from brain.validation import check_tree, unknown_tools
from brain.vault import SecretInfo, Vault, VaultError, check_name, key_file, load_keys, write_keys
from brain.watch import watch
from workers.contracts import DEFAULT_POOL, MCPServerFailure, client_queue

console = Console()
err = Console(stderr=True)

EXIT_OK, EXIT_TREE_FAILED, EXIT_BAD_INPUT, EXIT_STACK, EXIT_TIMED_OUT = 0, 1, 2, 3, 4
STDERR_LINES_SHOWN = 12
FLOWER_PORT = 5555
# How long `up` waits for the MCP gateway to listen before it says where to look.
GATEWAY_READY_S = 30.0


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--data-dir", type=click.Path(path_type=Path), help="State directory (default .vancetope).")
@click.option(
    "--registry",
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    help="Tool registry YAML (default from vancetope.toml / VANCETOPE_REGISTRY).",
)
@click.option(
    "--mcp-config",
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    help="The brain's server-side mcpServers JSON (VANCETOPE_MCP_CONFIG).",
)
@click.option("-v", "--verbose", is_flag=True, help="Log what the brain does.")
@click.pass_context
def cli(
    ctx: click.Context, data_dir: Path | None, registry: Path | None, mcp_config: Path | None, verbose: bool
) -> None:
    """Vancetope: run task trees whose tool calls go to a server worker pool or a client agent."""
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        ctx.obj = load_settings(data_dir=data_dir, registry=registry, mcp_config=mcp_config)
    except ConfigError as exc:
        _fail(str(exc), EXIT_BAD_INPUT)


@contextlib.contextmanager
def _stack(settings: Settings, *, quiet: bool = False, no_agent: bool = False) -> Iterator[str]:
    """Yield a Redis URL with a brain behind it: configured, running, or started here."""
    url = settings.redis_url or running_stack_url(settings)
    if url:
        yield url
        return
    if not quiet:
        err.print(
            f"[dim]starting the embedded stack in {settings.data_dir} (redis-server, brain, server pool)…[/]"
        )
    # A stack started for one run has no beat: schedules fire under `vancetope up` (or `beat`).
    services = without_agent(settings) if no_agent else tuple(n for n, _ in service_argvs(settings))
    stack = EmbeddedStack(settings, only=tuple(n for n in services if n != "beat"))
    try:
        stack.start()
        yield stack.redis_url
    finally:
        stack.stop()


def _fail(message: str, code: int) -> NoReturn:
    # soft_wrap: a one-line reason stays one line (copyable, greppable) whatever the width.
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    sys.exit(code)


@cli.command()
@click.argument("tree_file", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.option("--client", "client_id", help="Interactive session bound to this client agent.")
@click.option(
    "--autonomous/--interactive",
    default=None,
    help="Session kind (default: interactive with --client, else autonomous).",
)
@click.option("--user", help="Whose clients may run client tools (default: `user` in vancetope.toml).")
@click.option("--no-agent", is_flag=True, help="Start the embedded stack without its local client agent.")
@click.option("--timeout", type=float, default=None, help="Stop watching after this many seconds.")
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
    # Before anything starts: a tree that cannot run must not cost a stack start-up.
    _check_before_start(tree, settings, tree_file)
    if client_id is not None:
        _check_client_id(client_id)
    session = (
        SessionKind.AUTONOMOUS
        if (autonomous or (autonomous is None and not client_id))
        else SessionKind.INTERACTIVE
    )
    run_user = user or settings.user
    stack_url = settings.redis_url or ""
    try:
        with _stack(settings, no_agent=no_agent) as url:
            stack_url = url
            brain = Brain.connect(settings, url)
            try:
                if client_id is not None:
                    _check_enrolled(brain, client_id)
                registry = brain.scheduler.registry
                presence = brain.scheduler.presence.view(run_user, client_id)
                _validate_or_exit(tree, registry, tree_file, client_tools(presence))
                waiting = _tasks_waiting_for_a_client(tree, registry) if not (client_id or run_user) else []
                if waiting:
                    err.print(
                        f"[yellow]warning:[/] no --client and no --user: task(s) {', '.join(waiting)} can "
                        "only wait, since no client may take them (set `user` in vancetope.toml or "
                        "pass --user)",
                        highlight=False,
                    )
                record = brain.scheduler.submit(tree, session=session, client_id=client_id, user=run_user)
                if as_json:
                    status = watch(brain, record.tree_id, timeout, err, err, show_table=False)
                    tasks = brain.store.get_tasks(record.tree_id)
                    final = brain.store.get_tree(record.tree_id) or record
                    click.echo(json.dumps(_tree_json(brain.store, final, tasks), indent=2))
                else:
                    status = watch(brain, record.tree_id, timeout, console, err)
            finally:
                brain.close()
    except StackNotRunning as exc:
        _fail(str(exc), EXIT_STACK)
    except redis.RedisError as exc:
        # Redis failed outside the watcher's retries (e.g. while submitting): say so in one line.
        _fail(str(unreachable(stack_url, exc)), EXIT_STACK)
    sys.exit(run_exit_code(status))


def run_exit_code(status: TreeStatus | None) -> int:
    """None: the watch ended before the tree did (--timeout)."""
    if status is None:
        return EXIT_TIMED_OUT
    return EXIT_OK if status is TreeStatus.DONE else EXIT_TREE_FAILED


def _check_client_id(client_id: str) -> None:
    try:
        client_queue(client_id)
    except ValueError as exc:
        _fail(f"--client: {exc}", EXIT_BAD_INPUT)


def _check_enrolled(brain: Brain, client_id: str) -> None:
    """Enrollments are asked for once the stack is up: the embedded stack enrolls its own agent."""
    if brain.scheduler.presence.enrollment(client_id) is None:
        _fail(
            f"--client: client {client_id!r} is not enrolled, so no session can be bound to it; "
            f"`vancetope clients` lists the enrolled ones, `vancetope clients enroll {client_id} --user U` "
            "enrolls it",
            EXIT_BAD_INPUT,
        )


def _load_tree_or_exit(path: Path, settings: Settings) -> TaskTree:
    try:
        return load_tree(path, max_bytes=settings.max_tree_bytes)
    except (InvalidFile, InvalidTaskTree) as exc:
        _fail(str(exc), EXIT_BAD_INPUT)


def _check_before_start(tree: TaskTree, settings: Settings, path: Path) -> None:
    """Refuse a tree that is invalid against what is known without starting anything: the
    built-ins and the registry file (MCP tools are checked once the brain has listed them)."""
    try:
        declared = build_registry(settings, discover=False)
        # Pools are checked once the brain answers: a running stack may know pools this
        # directory's config does not.
        check_tree(tree, declared.tools, source=str(path), engines=declared.engines)
    except (InvalidRegistry, InvalidFile, InvalidTaskTree) as exc:
        _fail(str(exc), EXIT_BAD_INPUT)


def _validate_or_exit(
    tree: TaskTree, registry: RegistrySnapshot, path: Path, announced: frozenset[str] = frozenset()
) -> None:
    """``announced``: tools the run's connected clients offer, so they are not called unknown."""
    try:
        check_tree(tree, registry.tools, source=str(path), engines=registry.engines, pools=registry.pools)
    except InvalidTaskTree as exc:
        _fail(str(exc), EXIT_BAD_INPUT)
    for warning in unknown_tools(tree, registry.tools.keys() | announced):
        err.print(f"[yellow]warning:[/] {warning}{_failed_servers(registry)}", highlight=False)


def _failed_servers(registry: RegistrySnapshot) -> str:
    if not registry.mcp_failures:
        return ""
    names = ", ".join(repr(f.server) for f in registry.mcp_failures)
    return f" (MCP server(s) {names} failed to start, so their tools are missing)"


def _autonomous_routes(tree: TaskTree, registry: RegistrySnapshot) -> list[tuple[TaskSpec, Route]]:
    """Each task's route in an autonomous session with no client connected (what explain shows)."""
    engine = registry.engines.get(tree.engine) if tree.engine else None
    return [
        (
            spec,
            decide_route(
                RouteRequest(
                    tool=spec.tool,
                    execution_target=spec.execution_target,
                    session=SessionKind.AUTONOMOUS,
                    engine=engine,
                    pool=spec.pool,
                    tree_pool=tree.pool,
                    pools=frozenset(registry.pools),
                ),
                registry.tools,
                Presence(),
            ),
        )
        for spec in tree.tasks
    ]


def _tasks_waiting_for_a_client(tree: TaskTree, registry: RegistrySnapshot) -> list[str]:
    """Tasks the router parks for a client when none may take them: the router's own verdict,
    so server tools, fallbacks and skips never trigger the warning."""
    parked = (RouteKind.BLOCKED, RouteKind.PENDING_CLIENT)
    return [spec.id for spec, route in _autonomous_routes(tree, registry) if route.kind in parked]


@cli.command()
@click.argument("tree_file", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.pass_obj
def explain(settings: Settings, tree_file: Path) -> None:
    """Validate TREE_FILE and show, per task, the route the router would choose and why. Runs nothing.

    Exits 2 if the tree is invalid, 1 if it is valid but some task would fail as things
    stand (a missing tool, e.g. from an MCP server that failed to start), else 0.
    """
    tree = _load_tree_or_exit(tree_file, settings)
    registry = _registry_for_explain(settings)
    for failure in registry.mcp_failures:
        err.print(f"[yellow]warning:[/] {_describe_failure(failure)}", highlight=False)
    for line in clash_lines(registry.clashes):
        err.print(f"[yellow]warning:[/] {line}", highlight=False)
    _validate_or_exit(tree, registry, tree_file)
    for line in _held_tool_lines(settings, {spec.tool for spec in tree.tasks}):
        err.print(f"[yellow]warning:[/] {line}", highlight=False)
    routes = _autonomous_routes(tree, registry)
    failing = [(spec, route) for spec, route in routes if route.kind is RouteKind.FAIL]
    verdict = "valid" if not failing else f"valid, but {len(failing)} task(s) will fail"
    table = Table(title=f"{tree_file}: {len(tree.tasks)} task(s), {verdict}", title_justify="left")
    for col in ("task", "tool", "target", "route", "why"):
        table.add_column(col, overflow="fold")
    for spec, route in routes:
        table.add_row(spec.id, spec.tool, spec.execution_target.value, route.summary, route.reason)
    console.print(table)
    console.print("[dim]Routes assume an autonomous session with no client connected.[/]")
    if failing:
        missing = sorted({spec.tool for spec, route in failing if route.reason.startswith("Tool unknown")})
        if missing:
            err.print(
                f"[red]missing tools:[/] {', '.join(missing)}: not in the registry"
                f"{_failed_servers(registry)}; a client that announces them could still run them",
                highlight=False,
            )
        sys.exit(EXIT_TREE_FAILED)


def _describe_failure(failure: MCPServerFailure) -> str:
    """The server, its command (in the message) and the last lines it wrote to stderr."""
    text = f"MCP server {failure.server!r} failed to start: {failure.message}"
    if failure.stderr_tail:
        tail = failure.stderr_tail.splitlines()[-STDERR_LINES_SHOWN:]
        text += "\n  its stderr ended with:\n" + "\n".join(f"    {line}" for line in tail)
    return text


def _registry_for_explain(settings: Settings) -> RegistrySnapshot:
    url = settings.redis_url or running_stack_url(settings)
    if url:
        with contextlib.suppress(StackNotRunning):
            brain = Brain.connect(settings, url)
            brain.close()
            return brain.scheduler.registry
    try:
        return build_registry(settings)
    except (InvalidRegistry, InvalidFile) as exc:
        _fail(str(exc), EXIT_BAD_INPUT)


def _held_tool_lines(settings: Settings, tools: set[str]) -> list[str]:
    """Tools of the tree that a connected client announced with a changed definition (brain.toolpins)."""
    url = settings.redis_url or running_stack_url(settings)
    if not url:
        return []
    with contextlib.suppress(StackNotRunning, redis.RedisError):
        brain = Brain.connect(settings, url)
        try:
            sessions = brain.scheduler.presence.sessions()
        finally:
            brain.close()
        return [
            f"tool {t.name!r} of client {cid}: its definition changed since it was pinned; not routed to "
            f"until `vancetope clients approve-tools {cid} {t.name}`"
            for cid, session in sorted(sessions.items())
            for t in session.held_tools
            if t.name in tools
        ]
    return []


@cli.command()
@click.argument("tree_id", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print JSON (shape in the README) instead of a table.")
@click.option(
    "--queues",
    "queues_only",
    is_flag=True,
    help="Only the queues: per server pool, client and user, the work waiting and who takes it.",
)
@click.pass_obj
def status(settings: Settings, tree_id: str | None, as_json: bool, queues_only: bool) -> None:
    """Show recent task trees and the queues, or every task of TREE_ID with its state, route and result.

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
            _fail(f"no task tree {tree_id!r}; `vancetope status` lists them", EXIT_BAD_INPUT)
        tasks = store.get_tasks(tree_id)
        if as_json:
            click.echo(json.dumps(_tree_json(store, tree_rec, tasks), indent=2))
        else:
            console.print(task_table(tree_rec, tasks, {}))
            summary = shown_summary(tree_rec, tasks, store.get_summaries(tree_id), time.time())
            if summary is not None:
                console.print(Markdown(render_markdown(summary)))
    finally:
        store.close()


def _status_queues(settings: Settings, as_json: bool) -> None:
    url = settings.redis_url or running_stack_url(settings)
    if not url:
        _fail(
            "no stack is running here: start one with `vancetope up` (or set VANCETOPE_REDIS_URL)", EXIT_STACK
        )
    try:
        report = queues_report(settings, url)
    except StackNotRunning as exc:
        _fail(str(exc), EXIT_STACK)
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
        console.print(f"[dim]queues: {exc}[/]", highlight=False)


def _print_queues(report: QueuesReport) -> None:
    console.print(queues_table(report))
    for line in report.alarms():
        console.print(f"[bold red]work waiting, nobody consuming:[/] {line}", highlight=False, soft_wrap=True)


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
            "no schedules: add [[schedules]] tables to vancetope.toml (see the README, Night batches)"
        )


@cli.command()
@click.pass_obj
def beat(settings: Settings) -> None:
    """Run Celery beat for the [[schedules]] against VANCETOPE_REDIS_URL, in the foreground.

    `vancetope up` already runs it. Restart it after changing [[schedules]].
    """
    if not settings.redis_url:
        _fail("set VANCETOPE_REDIS_URL (or redis_url in vancetope.toml) to run beat alone", EXIT_BAD_INPUT)
    if not any(s.enabled for s in settings.schedules):
        _fail("no enabled [[schedules]] in vancetope.toml: beat would have nothing to fire", EXIT_BAD_INPUT)
    argv = beat_argv()
    os.execve(argv[0], argv, stack_env(settings, settings.redis_url))


@cli.command()
@click.option("--flower", is_flag=True, help=f"Also start Flower (default 127.0.0.1:{FLOWER_PORT}).")
@click.option(
    "--flower-port",
    type=click.IntRange(1, 65535),
    help=f"Start Flower on this port (implies --flower; default {FLOWER_PORT}).",
)
@click.option(
    "--flower-address",
    metavar="ADDRESS",
    help="Start Flower on this address (implies --flower; default 127.0.0.1). Beyond loopback "
    "(e.g. 0.0.0.0) Flower asks for a password: FLOWER_BASIC_AUTH=user:password if set, else user "
    "'vancetope' and a password generated into <data_dir>/flower.secret.",
)
@click.option("--no-agent", is_flag=True, help="Do not start the local client agent.")
@click.option(
    "--gateway-port",
    type=click.IntRange(1, 65535),
    help="Serve the MCP gateway on this port of gateway_host (default: gateway_port, 8765).",
)
@click.option("--no-gateway", is_flag=True, help="Do not start the MCP gateway.")
@click.pass_obj
def up(
    settings: Settings,
    flower: bool,
    flower_port: int | None,
    flower_address: str | None,
    no_agent: bool,
    gateway_port: int | None,
    no_gateway: bool,
) -> None:
    """Run the embedded stack in the foreground (Ctrl-C stops it) for repeated `vancetope run`.

    With an enabled [[schedules]] table it runs Celery beat too. A service that dies (brain,
    server pool, client agent, beat, Flower, redis-server) is restarted
    after a backoff (1 s doubling to 30 s); one that keeps failing at start stops the stack
    (exit 3) with the reason. Flower is optional: if it cannot start, the stack says why and
    keeps running.
    """
    wants_flower = flower or flower_port is not None or flower_address is not None
    access = _flower_access(settings, flower_address or "127.0.0.1") if wants_flower else None
    stack = EmbeddedStack(settings, only=without_agent(settings) if no_agent else None)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stack.start()
        if access is not None:
            _start_flower(stack, flower_port or FLOWER_PORT, access)
        if not no_gateway:
            _start_gateway(stack, gateway_port or settings.gateway_port)
        assert stack.redis is not None
        console.print(
            f"[green]stack up[/]: redis {stack.redis.address_url}, data in {settings.data_dir}, "
            f"logs in {settings.data_dir / 'logs'}. Ctrl-C to stop.\n"
            "Connect a client agent: `vancetope clients enroll ID --user U` prints its broker URL."
        )
        Supervisor(stack, say=lambda line: err.print(f"[yellow]{line}[/]", highlight=False)).run(stop)
    except KeyboardInterrupt:
        pass
    except (StackNotRunning, GaveUp) as exc:
        _fail(str(exc), EXIT_STACK)
    finally:
        stack.stop()


def _flower_access(settings: Settings, address: str) -> FlowerAccess:
    """Decided before anything starts: Flower beyond loopback without a password is bad input."""
    try:
        access = flower_access(address, settings.data_dir, os.environ)
        access.env()
    except FlowerUnprotected as exc:
        _fail(str(exc), EXIT_BAD_INPUT)
    return access


def _start_flower(stack: EmbeddedStack, port: int, access: FlowerAccess) -> None:
    address = access.address
    if not _port_free(port, address):
        err.print(
            f"[yellow]flower not started: {address}:{port} is already in use (another Flower or "
            "program) or not an address of this machine; pick a free port with --flower-port. "
            "The rest of the stack runs.[/]",
            highlight=False,
        )
        return
    stack.start_flower(port, access)
    if access.basic_auth:
        # The user and where the password is, never the password (this line may be logged).
        login = f"user {', '.join(access.users)}, password in {access.secret_file or 'FLOWER_BASIC_AUTH'}"
    else:
        login = "no password on loopback; its API needs one: FLOWER_BASIC_AUTH=user:password"
    host = f"[{address}]" if ":" in address else address  # an IPv6 address in a URL
    console.print(f"flower: http://{host}:{port} ({login})", highlight=False, soft_wrap=True)


def _start_gateway(stack: EmbeddedStack, port: int) -> None:
    host = stack.settings.gateway_host
    if not _port_free(port):
        err.print(
            f"[yellow]MCP gateway not started: 127.0.0.1:{port} is already in use; pick a free port with "
            "--gateway-port (or --no-gateway). The rest of the stack runs.[/]",
            highlight=False,
        )
        return
    service = stack.start_gateway(port)
    deadline = time.monotonic() + GATEWAY_READY_S
    while _port_free(port) and time.monotonic() < deadline:
        if service.process is not None and service.process.poll() is not None:
            break
        time.sleep(0.1)
    if _port_free(port):
        err.print(
            f"[yellow]MCP gateway not serving yet on {host}:{port}; see {service.log_path}. "
            "The rest of the stack runs.[/]",
            highlight=False,
        )
        return
    console.print(
        f"MCP gateway: http://{host}:{port}/mcp (a token: `vancetope users token U`)", highlight=False
    )


def _port_free(port: int, address: str = "127.0.0.1") -> bool:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((address, port))
        except OSError:
            return False
    return True


@contextlib.contextmanager
def _running_brain(settings: Settings) -> Iterator[Brain]:
    url = settings.redis_url or running_stack_url(settings)
    if not url:
        _fail(
            "no stack is running here: start one with `vancetope up` (or set VANCETOPE_REDIS_URL)", EXIT_STACK
        )
    try:
        brain = Brain.connect(settings, url)
    except StackNotRunning as exc:
        _fail(str(exc), EXIT_STACK)
    try:
        yield brain
    except redis.RedisError as exc:
        # Redis went away after the connect: one line saying what is unreachable, no traceback.
        _fail(str(unreachable(url, exc)), EXIT_STACK)
    finally:
        brain.close()


@cli.group(invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON (shape in the README) instead of a table.")
@click.pass_context
def clients(ctx: click.Context, as_json: bool) -> None:
    """Show enrolled client agents: who is connected, with which tools, and what waits for whom."""
    if ctx.invoked_subcommand is not None:
        return
    with _running_brain(ctx.obj) as brain:
        book = brain.scheduler.presence
        if as_json:
            report = clients_report(
                book.enrolled(), book.sessions(), brain.scheduler.parked.waiting(), brain.scheduler.registry
            )
            click.echo(json.dumps(report, indent=2))
            return
        console.print(clients_table(book.enrolled(), book.sessions(), brain.scheduler.parked.waiting()))
        registry = brain.scheduler.registry
        if registry.loaded_at:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(registry.loaded_at))
            console.print(f"registry: {len(registry.tools)} tools, loaded {when}", highlight=False)
            for line in registry.changes:
                console.print(f"  last reload: {line}", highlight=False)


@cli.command()
@click.option("--timeout", default=60.0, show_default=True, help="Seconds to wait for the brain to reload.")
@click.pass_obj
def reload(settings: Settings, timeout: float) -> None:
    """Reload the registry file and the server MCP config now, and say what changed.

    The brain also reloads by itself within seconds of either file changing. Calls already
    sent finish on the definitions they were sent with; new calls use the new ones.
    Exits 1 if the brain did not answer within --timeout.
    """
    with _running_brain(settings) as brain:
        before = brain.scheduler.registry.loaded_at
        brain.hot.r.set(RELOAD_REQUEST_KEY, b"1")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            snapshot = brain.hot.get_registry()
            if snapshot is not None and snapshot.get("loaded_at", 0.0) != before:
                registry = RegistrySnapshot.model_validate(snapshot)
                console.print(f"registry reloaded: {len(registry.tools)} tools")
                for line in registry.changes:
                    console.print(f"  {line}", highlight=False)
                return
            time.sleep(0.2)
    _fail(
        f"the brain did not reload within {timeout:g}s; is it running? (`vancetope up`, its log)",
        EXIT_TREE_FAILED,
    )


@clients.command("enroll")
@click.argument("client_id")
@click.option("--user", required=True, help="The user this client belongs to.")
@click.option(
    "--output",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Also write the credential to this file (mode 0600), for agent.toml's credential_file.",
)
@click.pass_obj
def clients_enroll(settings: Settings, client_id: str, user: str, output: Path | None) -> None:
    """Allow CLIENT_ID (a client agent of USER) to connect, with a credential of its own.

    Prints one line, VANCETOPE_AGENT_BROKER_URL=<url>: the agent's own Redis user and
    secret, which reach only that client's keys. The secret is shown once and stored
    nowhere else; enrolling again issues a new one and the old one stops working.
    """
    with _running_brain(settings) as brain:
        try:
            credential = enroll(
                brain.scheduler.presence, client_id, user, settings.agent_broker_url or brain.redis_url
            )
        except ValueError as exc:
            _fail(str(exc), EXIT_BAD_INPUT)
    if output is not None:
        write_private(output, credential.env_line + "\n")
        err.print(f"wrote the credential to {output} (mode 0600)", highlight=False)
    err.print(
        f"enrolled client [bold]{client_id}[/] for user [bold]{user}[/]; its queue is client.{client_id}. "
        "Give the agent this line (it is the client's password):",
        highlight=False,
    )
    click.echo(credential.env_line)


@clients.command("revoke")
@click.argument("client_id")
@click.pass_obj
def clients_revoke(settings: Settings, client_id: str) -> None:
    """Revoke CLIENT_ID: its credential stops working at once (open connections are dropped)
    and its unfinished calls come back as for a disconnect."""
    with _running_brain(settings) as brain:
        if not revoke(brain.clients, client_id):
            _fail(f"no enrolled client {client_id!r}; `vancetope clients` lists them", EXIT_BAD_INPUT)
    console.print(f"revoked client [bold]{client_id}[/]; its credential no longer connects")


@clients.command("approve-tools")
@click.argument("client_id")
@click.argument("tools", nargs=-1)
@click.pass_obj
def clients_approve_tools(settings: Settings, client_id: str, tools: tuple[str, ...]) -> None:
    """Accept the changed definitions of CLIENT_ID's TOOLS (all its held tools if none named):
    they are pinned as now announced and routed to again once the agent re-announces."""
    with _running_brain(settings) as brain:
        session = brain.scheduler.presence.session(client_id)
        held = session.held_tools if session else []
        unknown = sorted(set(tools) - {t.name for t in held})
        if unknown:
            _fail(f"client {client_id!r} holds no changed tool {', '.join(unknown)}; see `vancetope clients`",
                  EXIT_BAD_INPUT)  # fmt: skip
        approved = ToolPins(brain.hot.r).approve(client_id, held, tools)
    if not approved:
        console.print(f"client {client_id} has no tool whose definition changed")
        return
    console.print(
        f"approved the new definitions of {', '.join(approved)} on client {client_id}", highlight=False
    )


@cli.group()
def secrets() -> None:
    """The vault: server-side secrets, encrypted in the store, used as ${vault:NAME}.

    Works whether or not the stack runs (it talks to the store). Values are read from stdin
    or a hidden prompt, never from the command line, and never printed.
    """


@contextlib.contextmanager
def _vault(settings: Settings, *, create: bool = False) -> Iterator[Vault]:
    """The vault on the configured store; a VaultError inside is exit 2 with its message."""
    store = open_store(settings.store)
    try:
        yield Vault(store, load_keys(settings, create=create))
    except VaultError as exc:
        _fail(str(exc), EXIT_BAD_INPUT)
    finally:
        store.close()


@secrets.command("set")
@click.argument("name")
@click.pass_obj
def secrets_set(settings: Settings, name: str) -> None:
    """Store secret NAME: its value from stdin (piped) or a hidden prompt.

    The first secret of an embedded stack makes its key file (<data_dir>/vault.key, 0600)
    unless VANCETOPE_VAULT_KEY is set.
    """
    try:
        check_name(name)
    except VaultError as exc:
        _fail(str(exc), EXIT_BAD_INPUT)
    if sys.stdin.isatty():
        value = click.prompt(f"value of {name}", hide_input=True, confirmation_prompt=True, err=True)
    else:
        value = sys.stdin.read().removesuffix("\n")
    if not value:
        _fail(f"no value for secret {name!r}: pipe it on stdin or type it at the prompt", EXIT_BAD_INPUT)
    with _vault(settings, create=True) as vault:
        info = vault.set(name, value)
    verb = "updated" if info.updated_at != info.created_at else "stored"
    console.print(f"{verb} secret [bold]{name}[/]; use it as ${{vault:{name}}}", highlight=False)


@secrets.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: names and dates, never values.")
@click.pass_obj
def secrets_list(settings: Settings, as_json: bool) -> None:
    """List the secrets' names and dates (never their values)."""
    store = open_store(settings.store)
    try:
        infos = [
            SecretInfo(name=r.name, created_at=r.created_at, updated_at=r.updated_at)
            for r in store.list_secrets()
        ]
    finally:
        store.close()
    if as_json:
        click.echo(json.dumps([i.model_dump() for i in infos], indent=2))
        return
    if not infos:
        console.print("no secrets yet: `vancetope secrets set NAME`")
        return
    table = Table(title="secrets", title_justify="left")
    for col in ("name", "created", "updated"):
        table.add_column(col)
    for info in infos:
        table.add_row(info.name, _when(info.created_at), _when(info.updated_at))
    console.print(table)


def _when(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


@secrets.command("delete")
@click.argument("name")
@click.pass_obj
def secrets_delete(settings: Settings, name: str) -> None:
    """Delete secret NAME. A server that refers to it fails at its next start, naming it."""
    store = open_store(settings.store)
    try:
        check_name(name)
        deleted = store.delete_secret(name)
    except VaultError as exc:
        _fail(str(exc), EXIT_BAD_INPUT)
    finally:
        store.close()
    if not deleted:
        _fail(f"no secret {name!r}; `vancetope secrets list` shows them", EXIT_BAD_INPUT)
    console.print(f"deleted secret [bold]{name}[/]")


@secrets.command("rotate-key")
@click.pass_obj
def secrets_rotate_key(settings: Settings) -> None:
    """Re-encrypt every secret under a new key.

    With the key file: a new key is made, every secret re-encrypted, and the old key
    dropped. With VANCETOPE_VAULT_KEY: put the new key first in it (keeping the old ones)
    on every process, run this, then remove the old keys.
    """
    if settings.vault_key:
        with _vault(settings) as vault:
            count = vault.rotate()
        console.print(
            f"re-encrypted {count} secret(s) with the first key of VANCETOPE_VAULT_KEY; "
            "you can now remove the other keys from it"
        )
        return
    path = key_file(settings)
    store = open_store(settings.store)
    try:
        old = load_keys(settings)
        new = Fernet.generate_key()
        write_keys(path, [new, *old])  # a crash mid-way leaves keys that open every ciphertext
        count = Vault(store, [new, *old]).rotate()
        write_keys(path, [new])
    except VaultError as exc:
        _fail(str(exc), EXIT_BAD_INPUT)
    finally:
        store.close()
    console.print(f"re-encrypted {count} secret(s) with a new key in {path}; the old key is gone")


@cli.command("submit-url")
@click.pass_obj
def submit_url(settings: Settings) -> None:
    """Print VANCETOPE_SUBMIT_URL=<url>: the Redis URL another Celery app uses to submit trees.

    Its user (vt-submit) may only put messages on queue `submit`, which the brain reads as
    `vancetope.submit_tree` jobs (README "Python API"). For the stack of `vancetope up`; with
    an external Redis, create vt-submit with the rules in compose.yaml instead.
    """
    if settings.redis_url:
        _fail(
            "VANCETOPE_REDIS_URL points at an external Redis: give your app a vt-submit user made with "
            "the rules in compose.yaml (brain/acl.py COMPONENT_RULES), not an admin URL",
            EXIT_BAD_INPUT,
        )
    url = running_stack_url(settings)
    if not url:
        _fail("no stack is running here: start one with `vancetope up`", EXIT_STACK)
    click.echo(f"VANCETOPE_SUBMIT_URL={submitter_url(url)}")


@cli.command()
@click.argument("tree_id")
@click.argument("task_id", required=False)
@click.pass_obj
def cancel(settings: Settings, tree_id: str, task_id: str | None) -> None:
    """Cancel TREE_ID (or only its TASK_ID): unfinished tasks end as skipped (cancelled by user).

    Parked work is cancelled too; a run already sent to an offline client is never started
    when that client comes back.
    """
    with _running_brain(settings) as brain:
        if brain.store.get_tree(tree_id) is None:
            _fail(f"no task tree {tree_id!r}; `vancetope status` lists them", EXIT_BAD_INPUT)
        if task_id is not None and brain.store.get_task(tree_id, task_id) is None:
            known = ", ".join(r.task_id for r in brain.store.get_tasks(tree_id))
            _fail(f"tree {tree_id!r} has no task {task_id!r}; its tasks: {known}", EXIT_BAD_INPUT)
        done = brain.sweeps.cancel(tree_id, task_id)
    console.print(f"cancelled {len(done)} task(s): {', '.join(done) or 'none were unfinished'}")


@cli.command()
@click.pass_obj
def brain(settings: Settings) -> None:
    """Run the brain (result consumer + reconciler) against VANCETOPE_REDIS_URL, in the foreground."""
    if not settings.redis_url:
        _fail(
            "set VANCETOPE_REDIS_URL (or redis_url in vancetope.toml) to run the brain alone", EXIT_BAD_INPUT
        )
    _exec(settings, "brain")


@cli.command()
@click.option("--pool", default=DEFAULT_POOL, show_default=True, help="The server pool to serve ([[pools]]).")
@click.pass_obj
def worker(settings: Settings, pool: str) -> None:
    """Run a server worker pool against VANCETOPE_REDIS_URL, in the foreground.

    --pool NAME serves the named pool's queue (server.NAME) with the concurrency of its
    [[pools]] table; without it, the default pool (queue server, server_concurrency).
    """
    if not settings.redis_url:
        _fail("set VANCETOPE_REDIS_URL (or redis_url in vancetope.toml) to run a worker pool", EXIT_BAD_INPUT)
    if pool != DEFAULT_POOL and settings.pool(pool) is None:
        _fail(f"--pool: {unknown_pool(pool, [p.name for p in settings.pools])}", EXIT_BAD_INPUT)
    _exec(settings, pool_service(pool))


@cli.command()
@click.pass_obj
def gateway(settings: Settings) -> None:
    """Run the MCP gateway (/mcp on gateway_host:gateway_port) against VANCETOPE_REDIS_URL."""
    if not settings.redis_url:
        _fail(
            "set VANCETOPE_REDIS_URL (or redis_url in vancetope.toml) to run the gateway alone; "
            "`vancetope up` runs one in the embedded stack",
            EXIT_BAD_INPUT,
        )
    argv = gateway_argv()
    os.execve(argv[0], argv, stack_env(settings, settings.redis_url))


@cli.group()
def users() -> None:
    """Users of the MCP gateway: their tokens."""


@users.command("token")
@click.argument("user")
@click.option("--revoke", is_flag=True, help="Revoke USER's token instead of issuing one.")
@click.pass_obj
def users_token(settings: Settings, user: str, revoke: bool) -> None:
    """Issue USER's gateway token (printed once as VANCETOPE_GATEWAY_TOKEN=<token>; a new one
    replaces the old), or --revoke it. MCP clients send it as `Authorization: Bearer <token>`."""
    from brain.gateway import tokens

    if not user.strip() or len(user) > 128:
        _fail("a user name is 1 to 128 characters", EXIT_BAD_INPUT)
    store = open_store(settings.store)
    try:
        if revoke:
            if not tokens.revoke(store, user):
                _fail(f"user {user!r} has no gateway token", EXIT_BAD_INPUT)
            err.print(f"revoked the gateway token of {user}; requests with it get 401", highlight=False)
            return
        token = tokens.issue(store, user)
    finally:
        store.close()
    click.echo(f"{tokens.TOKEN_VARIABLE}={token}")


def _exec(settings: Settings, service: str) -> None:
    assert settings.redis_url is not None
    argv = dict(service_argvs(settings))[service]
    os.execve(argv[0], argv, stack_env(settings, settings.redis_url))


def main() -> None:
    # MCP servers installed beside Vancetope (mcp-server-time, ...) are found by name even when
    # its virtualenv is not activated: the same rule the stack's processes get (stack_env).
    bin_dir = os.path.dirname(sys.executable)
    os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    try:
        cli()
    except StoreError as exc:
        # The store is part of the stack: its failure is "unreachable", not the caller's input.
        _fail(f"the store failed: {exc}", EXIT_STACK)
    except BrainError as exc:
        _fail(str(exc), EXIT_BAD_INPUT)
    except (sqlite3.Error, pymongo.errors.PyMongoError) as exc:
        _fail(
            f"the store failed: {exc}; check VANCETOPE_STORE_URL / VANCETOPE_MONGO_URL and that the "
            "database is up",
            EXIT_STACK,
        )
    except redis.RedisError as exc:
        # Last resort: every command maps Redis errors itself; none may end in a traceback.
        _fail(f"Redis failed: {exc}; is the stack running (`vancetope up`)?", EXIT_STACK)


__all__ = ["cli", "main"]
