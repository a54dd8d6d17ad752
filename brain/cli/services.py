"""Commands that run the stack or one of its services (layer: brain/cli): up, brain, worker,
beat, gateway; reload and submit-url speak to a running brain."""

from __future__ import annotations

import os
import signal
import threading
import time

import click
import redis
from rich.markup import escape

from brain.cli.base import (
    EXIT_BAD_INPUT,
    EXIT_STACK,
    EXIT_TREE_FAILED,
    check_config_files,
    cli,
    console,
    err,
    fail,
    running_brain,
)
from brain.config import Settings
from brain.core.models import TreeStatus
from brain.core.pools import unknown_pool
from brain.core.snapshot import RegistrySnapshot
from brain.errors import (
    BrainError,
    StackAlreadyRunning,
    StackNotRunning,
)
from brain.runtime import submitters
from brain.runtime.reload import NO_CHANGE, RELOAD_FAILED, RELOAD_REQUEST_KEY
from brain.stack.embedded import (
    BRAIN_NODE,
    EmbeddedStack,
    beat_argv,
    brain_argv,
    gateway_argv,
    pool_service,
    service_argvs,
    stack_env,
    without_agent,
)
from brain.stack.flowerauth import FlowerAccess, FlowerUnprotected, flower_access
from brain.stack.redis_server import port_free
from brain.stack.supervisor import GaveUp, Supervisor
from brain.stack.webauth import WEB_PORT, WebAccess, WebUnprotected, web_access
from brain.store import open_store
from workers.contracts import DEFAULT_POOL, submit_queue_of
from workers.urls import with_credentials

FLOWER_PORT = 5555
# How long `up` waits for the MCP gateway to listen before it says where to look.
GATEWAY_READY_S = 30.0


@cli.command()
@click.pass_obj
def beat(settings: Settings) -> None:
    """Run Celery beat for the [[schedules]] against VANCETOPE_REDIS_URL, in the foreground.

    `vancetope up` already runs it. Restart it after changing [[schedules]].
    """
    if not settings.redis_url:
        fail("set VANCETOPE_REDIS_URL (or redis_url in vancetope.toml) to run beat alone", EXIT_BAD_INPUT)
    if not any(s.enabled for s in settings.schedules):
        fail("no enabled [[schedules]] in vancetope.toml: beat would have nothing to fire", EXIT_BAD_INPUT)
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
    help="Start Flower on this address (implies --flower; default 127.0.0.1). On every address "
    "Flower asks for a password: FLOWER_BASIC_AUTH=user:password if set, else user "
    "'vancetope' and a password generated into <data_dir>/flower.secret.",
)
@click.option("--no-agent", is_flag=True, help="Do not start the local client agent.")
@click.option(
    "--gateway-port",
    type=click.IntRange(1, 65535),
    help="Serve the MCP gateway on this port of gateway_host (default: gateway_port, 8765).",
)
@click.option("--no-gateway", is_flag=True, help="Do not start the MCP gateway.")
@click.option(
    "--web-port",
    type=click.IntRange(1, 65535),
    envvar="VANCETOPE_WEB_PORT",
    help=f"Serve the web view (trees, graphs, timelines) on this port of 127.0.0.1 (default {WEB_PORT}; "
    "env VANCETOPE_WEB_PORT). It asks for a password on loopback too: user 'vancetope' and a password "
    "generated into <data_dir>/web.secret; result values only for the logins in web_result_users.",
)
@click.option("--no-web", is_flag=True, help="Do not start the web view.")
@click.pass_obj
def up(
    settings: Settings,
    flower: bool,
    flower_port: int | None,
    flower_address: str | None,
    no_agent: bool,
    gateway_port: int | None,
    no_gateway: bool,
    web_port: int | None,
    no_web: bool,
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
    web = None if no_web else _web_access(settings, "127.0.0.1")
    check_config_files(settings)
    stack = EmbeddedStack(settings, only=without_agent(settings) if no_agent else None)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    # Ctrl-C stops the stack even when `up` was started in the background of a script: the
    # shell then hands it SIGINT ignored, and the stack would not stop on it.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        stack.start()
        web_port = web_port or WEB_PORT
        if access is not None:
            # Flower's navigation bar links the web view, which starts after it on a port
            # decided now (if that port is taken, the web view does not start: no link).
            linked = _web_url(web, web_port) if web is not None and port_free(web_port, web.address) else None
            _start_flower(stack, flower_port or FLOWER_PORT, access, linked)
        if not no_gateway:
            _start_gateway(stack, gateway_port or settings.gateway_port)
        if web is not None:
            _start_web(stack, web_port, web)
        assert stack.redis is not None
        # soft_wrap: whole lines in a log file, whatever the terminal's width (grep finds them).
        console.print(
            f"[green]stack up[/]: redis {escape(stack.redis.address_url)}, data in {escape(str(settings.data_dir))}, "
            f"logs in {escape(str(settings.data_dir / 'logs'))}. Ctrl-C to stop.\n"
            "Connect a client agent: `vancetope clients enroll ID --user U` prints its broker URL.",
            soft_wrap=True,
        )
        if any(s.name == "beat" for s in stack.services):
            names = [s.name for s in settings.schedules if s.enabled]
            console.print(
                escape(f"beat: fires {len(names)} schedule(s) ({', '.join(names)}); "
                       "`vancetope schedules` shows when"),
                highlight=False,
                soft_wrap=True,
            )  # fmt: skip
        Supervisor(
            stack, say=lambda line: err.print(f"[yellow]{escape(line)}[/]", highlight=False, soft_wrap=True)
        ).run(stop)
    except KeyboardInterrupt:
        pass
    except (StackNotRunning, StackAlreadyRunning, GaveUp) as exc:
        fail(str(exc), EXIT_STACK)
    finally:
        if stack.started_at:
            err.print("stopping the stack…", highlight=False)
        stack.stop()
        if stack.started_at:
            err.print(_unfinished_note(settings), highlight=False, soft_wrap=True)


def _unfinished_note(settings: Settings) -> str:
    """What the operator should know once the stack stopped: the trees it leaves unfinished."""
    try:
        store = open_store(settings.store)
        try:
            running = [t.tree_id for t in store.list_trees(limit=200) if t.status is TreeStatus.RUNNING]
        finally:
            store.close()
    except BrainError:
        return "stack stopped."
    if not running:
        return "stack stopped; no tree was left unfinished."
    shown = ", ".join(running[:5]) + (f" and {len(running) - 5} more" if len(running) > 5 else "")
    return (
        f"stack stopped; {len(running)} tree(s) unfinished: {shown}. They go on at the next "
        "`vancetope up` (`vancetope status` follows them)."
    )


def _flower_access(settings: Settings, address: str) -> FlowerAccess:
    """Decided before anything starts: malformed FLOWER_BASIC_AUTH is bad input."""
    try:
        access = flower_access(address, settings.data_dir, os.environ)
        access.env()
    except FlowerUnprotected as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    return access


def _start_flower(stack: EmbeddedStack, port: int, access: FlowerAccess, web_url: str | None) -> None:
    address = access.address
    if not port_free(port, address):
        err.print(
            f"[yellow]flower not started: {address}:{port} is already in use (another Flower or "
            "program) or not an address of this machine; pick a free port with --flower-port. "
            "The rest of the stack runs.[/]",
            highlight=False,
        )
        return
    stack.start_flower(port, access, web_url)
    # The user and where the password is, never the password (this line may be logged).
    login = access.login()
    host = f"[{address}]" if ":" in address else address  # an IPv6 address in a URL
    console.print(escape(f"flower: http://{host}:{port} ({login})"), highlight=False, soft_wrap=True)


def _web_access(settings: Settings, address: str) -> WebAccess:
    """Decided before anything starts: a malformed VANCETOPE_WEB_BASIC_AUTH is bad input."""
    try:
        return web_access(address, settings.data_dir, os.environ)
    except WebUnprotected as exc:
        fail(str(exc), EXIT_BAD_INPUT)


def _start_web(stack: EmbeddedStack, port: int, access: WebAccess) -> None:
    address = access.address
    if not port_free(port, address):
        err.print(
            f"[yellow]web view not started: {address}:{port} is already in use; pick a free port with "
            "--web-port (or --no-web). The rest of the stack runs.[/]",
            highlight=False,
        )
        return
    service = stack.start_web(port, access)
    deadline = time.monotonic() + GATEWAY_READY_S
    while port_free(port, address) and time.monotonic() < deadline:
        if service.process is not None and service.process.poll() is not None:
            break
        time.sleep(0.1)
    if port_free(port, address):
        err.print(
            f"[yellow]web view not serving yet on {address}:{port}; see {service.log_path}. "
            "The rest of the stack runs.[/]",
            highlight=False,
        )
        return
    # The user and where the password is, never the password (this line may be logged).
    console.print(
        escape(f"web: {_web_url(access, port)} ({access.login()})"), highlight=False, soft_wrap=True
    )


def _web_url(access: WebAccess, port: int) -> str:
    return f"http://{access.address}:{port}/"


def _start_gateway(stack: EmbeddedStack, port: int) -> None:
    host = stack.settings.gateway_host
    if not port_free(port):
        err.print(
            f"[yellow]MCP gateway not started: 127.0.0.1:{port} is already in use; pick a free port with "
            "--gateway-port (or --no-gateway). The rest of the stack runs.[/]",
            highlight=False,
        )
        return
    service = stack.start_gateway(port)
    deadline = time.monotonic() + GATEWAY_READY_S
    while port_free(port) and time.monotonic() < deadline:
        if service.process is not None and service.process.poll() is not None:
            break
        time.sleep(0.1)
    if port_free(port):
        err.print(
            f"[yellow]MCP gateway not serving yet on {host}:{port}; see {service.log_path}. "
            "The rest of the stack runs.[/]",
            highlight=False,
        )
        return
    console.print(
        f"MCP gateway: http://{host}:{port}/mcp (a token: `vancetope users token U`)", highlight=False
    )


@cli.command()
@click.option("--timeout", default=60.0, show_default=True, help="Seconds to wait for the brain to reload.")
@click.pass_obj
def reload(settings: Settings, timeout: float) -> None:
    """Reload the registry file and the server MCP config now, and say what changed.

    The brain also reloads by itself within seconds of either file changing. Calls already
    sent finish on the definitions they were sent with; new calls use the new ones.
    Exits 1 if the brain did not answer within --timeout.
    """
    with running_brain(settings) as brain:
        previous = brain.hot.get_registry()
        before = RegistrySnapshot.model_validate(previous) if previous else brain.scheduler.registry
        brain.hot.r.set(RELOAD_REQUEST_KEY, b"1")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            snapshot = brain.hot.get_registry()
            if snapshot is not None and snapshot.get("loaded_at", 0.0) != before.loaded_at:
                _say_reloaded(before, RegistrySnapshot.model_validate(snapshot))
                return
            time.sleep(0.2)
    fail(
        f"the brain did not reload within {timeout:g}s; is it running? (`vancetope up`, its log)",
        EXIT_TREE_FAILED,
    )


def _say_reloaded(before: RegistrySnapshot, after: RegistrySnapshot) -> None:
    failed = [line for line in after.changes if line.startswith(RELOAD_FAILED)]
    if failed:
        fail(
            f"{'; '.join(failed)}; the registry in use is unchanged (fix the file and reload)", EXIT_BAD_INPUT
        )
    console.print(f"registry reloaded: {len(after.tools)} tools")
    applied = [line for line in before.changes if line != NO_CHANGE and not line.startswith(RELOAD_FAILED)]
    if after.changes == [NO_CHANGE] and applied:
        # The brain reloads by itself within seconds of a file changing: by the time a user
        # types `reload`, the change is usually applied. Say so, not "no tool changed".
        when = time.strftime("%H:%M:%S", time.localtime(before.loaded_at))
        console.print(f"  no tool changed since the last reload at {when}, which applied:")
        lines = applied
    else:
        lines = after.changes
    for line in lines:
        console.print(f"  {escape(line)}", highlight=False)


@cli.command("submit-url")
@click.option(
    "--user", "user", help="The user whose trees this credential submits (default: the `user` setting)."
)
@click.option("--revoke", is_flag=True, help="Revoke the user's submit credential instead.")
@click.pass_obj
def submit_url(settings: Settings, user: str | None, revoke: bool) -> None:
    """Print VANCETOPE_SUBMIT_URL=<url>: the credential another Celery app submits trees with,
    for one user only.

    Its Redis user (vts-<user>) may only put messages on queue `submit.<user>`; the brain
    runs every tree from that queue as <user>, whatever the message says (docs/python-api.md).
    Without --user: the stack's `user` setting. Issuing again replaces the old secret.
    """
    user = user or settings.user
    if not user:
        fail(
            "a submit credential submits for one user: pass --user U (or set `user` in vancetope.toml)",
            EXIT_BAD_INPUT,
        )
    try:
        queue = submit_queue_of(user)
    except ValueError as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    with running_brain(settings) as brain:
        try:
            if revoke:
                found = submitters.revoke(brain.store, brain.hot.r, user)
                err.print(escape(f"revoked the submit credential of user {user}" if found else
                                 f"user {user} had no submit credential"), highlight=False)  # fmt: skip
                return
            secret = submitters.issue(brain.store, brain.hot.r, user)
        except redis.exceptions.NoPermissionError as exc:
            fail(
                f"Redis refused to create ACL user {submitters.submit_username(user)} ({exc}): run this "
                "with the admin's or the brain's Redis URL",
                EXIT_STACK,
            )
        address = settings.agent_broker_url or brain.redis_url
    err.print(
        escape(f"submit credential of user {user}: send vancetope.submit_tree on queue {queue}; "
               "the old one, if any, stopped working"),
        highlight=False,
    )  # fmt: skip
    click.echo(f"VANCETOPE_SUBMIT_URL={with_credentials(address, submitters.submit_username(user), secret)}")


@cli.command()
@click.option(
    "--node",
    default=BRAIN_NODE,
    show_default=True,
    help="Celery node name; a second brain on the same host needs its own (e.g. brain2@%h).",
)
@click.pass_obj
def brain(settings: Settings, node: str) -> None:
    """Run the brain (result consumer + reconciler) against VANCETOPE_REDIS_URL, in the foreground.

    Run it on two hosts (or twice on one, with --node) for a brain that survives losing one:
    both take work, and each periodic job runs once across them (docs/reliability.md).
    """
    if not settings.redis_url:
        fail(
            "set VANCETOPE_REDIS_URL (or redis_url in vancetope.toml) to run the brain alone", EXIT_BAD_INPUT
        )
    argv = brain_argv(node)
    os.execve(argv[0], argv, stack_env(settings, settings.redis_url))


@cli.command()
@click.option("--pool", default=DEFAULT_POOL, show_default=True, help="The server pool to serve ([[pools]]).")
@click.pass_obj
def worker(settings: Settings, pool: str) -> None:
    """Run a server worker pool against VANCETOPE_REDIS_URL, in the foreground.

    --pool NAME serves the named pool's queue (server.NAME) with the concurrency of its
    [[pools]] table; without it, the default pool (queue server, server_concurrency).
    """
    if not settings.redis_url:
        fail("set VANCETOPE_REDIS_URL (or redis_url in vancetope.toml) to run a worker pool", EXIT_BAD_INPUT)
    if pool != DEFAULT_POOL and settings.pool(pool) is None:
        fail(f"--pool: {unknown_pool(pool, [p.name for p in settings.pools])}", EXIT_BAD_INPUT)
    _exec(settings, pool_service(pool))


@cli.command()
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    help="Serve on this port (default: the gateway_port setting, 8765).",
)
@click.option(
    "--host", metavar="HOST", help="Serve on this address (default: the gateway_host setting, 127.0.0.1)."
)
@click.pass_obj
def gateway(settings: Settings, port: int | None, host: str | None) -> None:
    """Run the MCP gateway (/mcp on gateway_host:gateway_port) against VANCETOPE_REDIS_URL."""
    settings = settings.model_copy(
        update={k: v for k, v in (("gateway_port", port), ("gateway_host", host)) if v is not None}
    )
    if not settings.redis_url:
        fail(
            "set VANCETOPE_REDIS_URL (or redis_url in vancetope.toml) to run the gateway alone; "
            "`vancetope up` runs one in the embedded stack",
            EXIT_BAD_INPUT,
        )
    argv = gateway_argv()
    os.execve(argv[0], argv, stack_env(settings, settings.redis_url))


def _exec(settings: Settings, service: str) -> None:
    assert settings.redis_url is not None
    argv = dict(service_argvs(settings))[service]
    os.execve(argv[0], argv, stack_env(settings, settings.redis_url))
