"""The ``vancetope`` command (layer: brain, CLI). Parses flags, calls the brain, shows results.

Exit codes: 0 every task done; 1 the tree ended otherwise (or is still running at
--timeout); 2 bad input (file, tree, config); 3 the stack could not be reached or started.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import click
from rich.console import Console
from rich.live import Live
from rich.table import Table

from brain.config import Settings, load_settings
from brain.display import clients_table, progress, task_table, trees_table
from brain.errors import (
    BrainError,
    ConfigError,
    InvalidFile,
    InvalidRegistry,
    InvalidTaskTree,
    StackNotRunning,
)
from brain.models import Location, SessionKind, TaskRecord, TaskTree, TreeStatus
from brain.registry import RegistrySnapshot, build_registry
from brain.routing import Presence, RouteRequest, decide_route
from brain.service import Brain
from brain.stack import EmbeddedStack, Service, running_stack_url, service_argvs, stack_env
from brain.store import open_store
from brain.treefile import load_tree
from brain.validation import check_tree, unknown_tools
from workers.contracts import channel_tree_events

console = Console()
err = Console(stderr=True)

EXIT_OK, EXIT_TREE_FAILED, EXIT_BAD_INPUT, EXIT_STACK = 0, 1, 2, 3


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


NO_AGENT = ("brain", "server-pool")


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
    stack = EmbeddedStack(settings, only=NO_AGENT if no_agent else None)
    try:
        stack.start()
        yield stack.redis_url
    finally:
        stack.stop()


def _fail(message: str, code: int) -> NoReturn:
    err.print(f"[bold red]error:[/] {message}", highlight=False)
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
@click.pass_obj
def run(
    settings: Settings,
    tree_file: Path,
    client_id: str | None,
    autonomous: bool | None,
    user: str | None,
    no_agent: bool,
    timeout: float | None,
) -> None:
    """Run TREE_FILE to the end with a live progress display, then print every task.

    Uses a stack started by `vancetope up` (or VANCETOPE_REDIS_URL); without one it
    starts the embedded stack — with its local client agent unless --no-agent — for the
    length of the run. Tasks waiting for an offline client show as blocked or
    pending_client and run when it connects. Exits 0 only if every task is done.
    """
    tree = _load_tree_or_exit(tree_file)
    session = (
        SessionKind.AUTONOMOUS
        if (autonomous or (autonomous is None and not client_id))
        else SessionKind.INTERACTIVE
    )
    try:
        with _stack(settings, no_agent=no_agent) as url:
            brain = Brain.connect(settings, url)
            try:
                _validate_or_exit(tree, brain.scheduler.registry, tree_file)
                run_user = user or settings.user
                if not client_id and not run_user and _uses_client_tools(tree, brain.scheduler.registry):
                    err.print(
                        "[yellow]warning:[/] no --client and no --user: this run's client tools can only "
                        "wait, since no client may take them (set `user` in vancetope.toml or pass --user)"
                    )
                record = brain.scheduler.submit(tree, session=session, client_id=client_id, user=run_user)
                status = _watch(brain, record.tree_id, timeout)
            finally:
                brain.close()
    except StackNotRunning as exc:
        _fail(str(exc), EXIT_STACK)
    sys.exit(EXIT_OK if status is TreeStatus.DONE else EXIT_TREE_FAILED)


def _load_tree_or_exit(path: Path) -> TaskTree:
    try:
        return load_tree(path)
    except (InvalidFile, InvalidTaskTree) as exc:
        _fail(str(exc), EXIT_BAD_INPUT)


def _validate_or_exit(tree: TaskTree, registry: RegistrySnapshot, path: Path) -> None:
    try:
        check_tree(tree, registry.tools, source=str(path), engines=registry.engines)
    except InvalidTaskTree as exc:
        _fail(str(exc), EXIT_BAD_INPUT)
    for warning in unknown_tools(tree, registry.tools):
        err.print(f"[yellow]warning:[/] {warning}{registry.failure_hint()}", highlight=False)


REDRAW_EVERY_S = 0.2


def _wait_for_events(pubsub: Any) -> None:
    """Wait for a wake-up, then let a burst of them coalesce: a big tree sends one per result,
    and redrawing on each would spend the cores the workers need."""
    if pubsub.get_message(timeout=0.5) is None:
        return
    settle = time.monotonic() + REDRAW_EVERY_S
    while time.monotonic() < settle:
        pubsub.get_message(timeout=max(settle - time.monotonic(), 0.0))


def _watch(brain: Brain, tree_id: str, timeout: float | None) -> TreeStatus | None:
    """Redraw on every tree event (pub/sub is only a wake-up; the store is read each time)."""
    pubsub = brain.hot.r.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(channel_tree_events(tree_id))
    deadline = time.monotonic() + timeout if timeout else None
    try:
        with Live(console=console, refresh_per_second=8, transient=True) as live:
            while True:
                tree_rec = brain.store.get_tree(tree_id)
                assert tree_rec is not None
                records = brain.store.get_tasks(tree_id)
                running = brain.hot.running(tree_id, _clients_of(records))
                live.update(progress(tree_rec, records, running))
                if tree_rec.status is not TreeStatus.RUNNING:
                    break
                if deadline and time.monotonic() > deadline:
                    err.print(
                        f"[yellow]still running after {timeout:g}s; see `vancetope status {tree_id}`[/]"
                    )
                    break
                _wait_for_events(pubsub)
    except KeyboardInterrupt:
        err.print(f"[yellow]stopped watching; the tree goes on: `vancetope status {tree_id}`[/]")
    finally:
        pubsub.close()
    tree_rec = brain.store.get_tree(tree_id)
    assert tree_rec is not None
    records = brain.store.get_tasks(tree_id)
    console.print(task_table(tree_rec, records, brain.hot.running(tree_id, _clients_of(records))))
    if tree_rec.status is TreeStatus.RUNNING:
        return None
    return tree_rec.status


def _uses_client_tools(tree: TaskTree, registry: RegistrySnapshot) -> bool:
    known = registry.tools
    return any(
        t not in known or known[t].location is not Location.SERVER
        for task in tree.tasks
        for t in task.toolset
    )


def _clients_of(records: list[TaskRecord]) -> set[str]:
    return {r.client_id for r in records if r.client_id is not None}


@cli.command()
@click.argument("tree_file", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.pass_obj
def explain(settings: Settings, tree_file: Path) -> None:
    """Validate TREE_FILE and show, per task, the route the router would choose and why. Runs nothing."""
    tree = _load_tree_or_exit(tree_file)
    registry = _registry_for_explain(settings)
    _validate_or_exit(tree, registry, tree_file)
    table = Table(title=f"{tree_file}: {len(tree.tasks)} task(s), valid", title_justify="left")
    for col in ("task", "tool", "target", "route", "why"):
        table.add_column(col, overflow="fold")
    for spec in tree.tasks:
        engine = registry.engines.get(tree.engine) if tree.engine else None
        route = decide_route(
            RouteRequest(
                tool=spec.tool,
                execution_target=spec.execution_target,
                session=SessionKind.AUTONOMOUS,
                engine=engine,
            ),
            registry.tools,
            Presence(),
        )
        table.add_row(spec.id, spec.tool, spec.execution_target.value, route.kind.value, route.reason)
    console.print(table)
    for failure in registry.mcp_failures:
        err.print(
            f"[yellow]warning:[/] MCP server {failure.server!r} failed to start: {failure.message}",
            highlight=False,
        )
    console.print("[dim]Routes assume an autonomous session with no client connected.[/]")


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


@cli.command()
@click.argument("tree_id", required=False)
@click.pass_obj
def status(settings: Settings, tree_id: str | None) -> None:
    """Show recent task trees, or every task of TREE_ID with its state, route and result."""
    store = open_store(settings.store)
    try:
        if tree_id is None:
            trees = store.list_trees(limit=20)
            counts = {t.tree_id: Counter(r.state.value for r in store.get_tasks(t.tree_id)) for t in trees}
            console.print(trees_table(trees, counts) if trees else "no task trees yet")
            return
        tree_rec = store.get_tree(tree_id)
        if tree_rec is None:
            _fail(f"no task tree {tree_id!r}; `vancetope status` lists them", EXIT_BAD_INPUT)
        console.print(task_table(tree_rec, store.get_tasks(tree_id), {}))
    finally:
        store.close()


@cli.command()
@click.option("--flower", is_flag=True, help="Also start Flower on 127.0.0.1:5555.")
@click.option("--no-agent", is_flag=True, help="Do not start the local client agent.")
@click.pass_obj
def up(settings: Settings, flower: bool, no_agent: bool) -> None:
    """Run the embedded stack in the foreground (Ctrl-C stops it) for repeated `vancetope run`."""
    stack = EmbeddedStack(settings, only=NO_AGENT if no_agent else None)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stack.start()
        if flower:
            _start_flower(stack, settings)
        console.print(
            f"[green]stack up[/]: redis {stack.redis_url}, data in {settings.data_dir}, "
            f"logs in {settings.data_dir / 'logs'}. Ctrl-C to stop."
        )
        while not stop.wait(1.0):
            for s in stack.services:
                if s.process is not None and s.process.poll() is not None:
                    err.print(f"[red]{s.name} exited ({s.process.returncode}); stopping[/]")
                    stop.set()
    except KeyboardInterrupt:
        pass
    except StackNotRunning as exc:
        _fail(str(exc), EXIT_STACK)
    finally:
        stack.stop()


def _start_flower(stack: EmbeddedStack, settings: Settings) -> None:
    argv = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "workers.server_worker",
        "flower",
        "--address=127.0.0.1",
        "--port=5555",
    ]
    env = {**stack_env(settings, stack.redis_url), "FLOWER_UNAUTHENTICATED_API": "true"}
    log_path = settings.data_dir / "logs" / "flower.log"
    with open(log_path, "ab") as log_file:
        proc = subprocess.Popen(
            argv, env=env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
        )
    stack.services.append(Service("flower", argv, proc, log_path))


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
    finally:
        brain.close()


@cli.group(invoke_without_command=True)
@click.pass_context
def clients(ctx: click.Context) -> None:
    """Show enrolled client agents: who is connected, with which tools, and what waits for whom."""
    if ctx.invoked_subcommand is not None:
        return
    with _running_brain(ctx.obj) as brain:
        book = brain.scheduler.presence
        console.print(clients_table(book.enrolled(), book.sessions(), brain.scheduler.parked.waiting()))


@clients.command("enroll")
@click.argument("client_id")
@click.option("--user", required=True, help="The user this client belongs to.")
@click.pass_obj
def clients_enroll(settings: Settings, client_id: str, user: str) -> None:
    """Allow CLIENT_ID (a client agent of USER) to connect and take that user's client work."""
    with _running_brain(settings) as brain:
        try:
            brain.scheduler.presence.enroll(client_id, user)
        except ValueError as exc:
            _fail(str(exc), EXIT_BAD_INPUT)
    console.print(
        f"enrolled client [bold]{client_id}[/] for user [bold]{user}[/]; its queue is client.{client_id}"
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
    with _running_brain(settings) as brain:
        if brain.store.get_tree(tree_id) is None:
            _fail(f"no task tree {tree_id!r}; `vancetope status` lists them", EXIT_BAD_INPUT)
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
@click.pass_obj
def worker(settings: Settings) -> None:
    """Run a server worker pool against VANCETOPE_REDIS_URL, in the foreground."""
    if not settings.redis_url:
        _fail("set VANCETOPE_REDIS_URL (or redis_url in vancetope.toml) to run a worker pool", EXIT_BAD_INPUT)
    _exec(settings, "server-pool")


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
    except BrainError as exc:
        _fail(str(exc), EXIT_BAD_INPUT)


__all__ = ["cli", "main"]
