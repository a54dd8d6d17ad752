"""The ``vancetope`` command group and what every command shares (layer: brain/cli): the
settings, the one-line failure with its exit code, reaching a running stack.

Exit codes (a contract for scripts, docs/output.md; docs/cli.md, "Exit codes"): 0 every task done; 1 the
tree ended otherwise (failed, skipped or cancelled tasks); 2 bad input (file, tree, config,
unknown id); 3 the stack or its store could not be reached or started; 4 the tree was still
running at --timeout; 130 `run` was stopped by Ctrl-C (SIGINT).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import click
import redis
from rich.console import Console
from rich.markup import escape

from brain.config import CONFIG_FILE, Settings, find_config, load_settings
from brain.core.treefile import load_registry
from brain.errors import (
    BrainError,
    ConfigError,
    StackNotRunning,
    StoreError,
)
from brain.hot.boundary import unreachable
from brain.runtime.service import Brain
from brain.stack.embedded import (
    EmbeddedStack,
    running_stack_url,
    service_argvs,
    without_agent,
)
from workers.mcp_config import MCPConfigError, load_mcp_config

console = Console()
err = Console(stderr=True)

EXIT_OK, EXIT_TREE_FAILED, EXIT_BAD_INPUT, EXIT_STACK, EXIT_TIMED_OUT = 0, 1, 2, 3, 4
# The shell's code for a process ended by SIGINT (128 + 2): `run` stopped by Ctrl-C.
EXIT_INTERRUPTED = 130


def _settings_options() -> list[click.Option]:
    # Fresh objects each call: the group and every command get their own copies.
    return [
        click.Option(
            ["--data-dir"], type=click.Path(path_type=Path), help="State directory (default .vancetope)."
        ),
        click.Option(
            ["--registry"],
            type=click.Path(path_type=Path, exists=True, dir_okay=False),
            help="Tool registry YAML (default from vancetope.toml / VANCETOPE_REGISTRY).",
        ),
        click.Option(
            ["--mcp-config"],
            type=click.Path(path_type=Path, exists=True, dir_okay=False),
            help="The brain's server-side mcpServers JSON (VANCETOPE_MCP_CONFIG).",
        ),
    ]


_SETTINGS_KEYS = ("data_dir", "registry", "mcp_config")
_GIVEN_AFTER = "vancetope.settings_after_command"


@click.group(
    context_settings={"help_option_names": ["-h", "--help"]},
    params=[
        *_settings_options(),
        click.Option(["-v", "--verbose"], is_flag=True, help="Log what the brain does."),
    ],
)
@click.pass_context
def cli(
    ctx: click.Context, data_dir: Path | None, registry: Path | None, mcp_config: Path | None, verbose: bool
) -> None:
    """Vancetope: run task trees whose tool calls go to a server worker pool or a client agent."""
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    if find_config() is None:
        # Once per command, before anything runs: from the wrong folder, a run would otherwise
        # start an empty stack in silence (every task "Tool unknown"; issue 22).
        err.print(f"[yellow]no {CONFIG_FILE} here or above; using the defaults[/]", highlight=False)
    ctx.obj = _settings(data_dir=data_dir, registry=registry, mcp_config=mcp_config)


def _settings(data_dir: Path | None, registry: Path | None, mcp_config: Path | None) -> Settings:
    try:
        return load_settings(data_dir=data_dir, registry=registry, mcp_config=mcp_config)
    except ConfigError as exc:
        fail(str(exc), EXIT_BAD_INPUT)


def settings_options_given(ctx: click.Context) -> dict[str, Path | None]:
    """``--data-dir``, ``--registry`` and ``--mcp-config`` as given on the command line, before
    or after the command name (None: not given)."""
    root = ctx.find_root()
    given = {key: root.params.get(key) for key in _SETTINGS_KEYS}
    given.update(root.meta.get(_GIVEN_AFTER, {}))
    return given


def _settings_override(ctx: click.Context, param: click.Parameter, value: Path | None) -> None:
    """``vancetope up --data-dir X`` means what ``vancetope --data-dir X up`` does: the value
    given after the command wins over one given before it (issue 22)."""
    if value is None or param.name is None:
        return
    ctx.find_root().meta.setdefault(_GIVEN_AFTER, {})[param.name] = value
    ctx.obj = _settings(**settings_options_given(ctx))


def accept_settings_options(group: click.Group) -> None:
    """Give every command under ``group`` the group's settings options too, so that they may
    follow the command name, as users type them (``vancetope up --data-dir /srv/v``)."""
    for command in group.commands.values():
        if isinstance(command, click.Group):
            accept_settings_options(command)
            continue
        names = {name for p in command.params for name in p.opts}
        for option in _settings_options():
            if names.isdisjoint(option.opts):
                option.expose_value = False
                option.callback = _settings_override
                command.params.append(option)


@contextlib.contextmanager
def stack_for(
    settings: Settings, *, quiet: bool = False, no_agent: bool = False
) -> Iterator[tuple[str, bool]]:
    """Yield a Redis URL with a brain behind it: configured, running, or started here; and
    whether it was started here (it stops when the block ends)."""
    url = settings.redis_url or running_stack_url(settings)
    if url:
        yield url, False
        return
    check_config_files(settings)
    if not quiet:
        err.print(
            f"[dim]starting the embedded stack in {settings.data_dir} (redis-server, brain, server pool)…[/]"
        )
    # A stack started for one run has no beat: schedules fire under `vancetope up` (or `beat`).
    services = without_agent(settings) if no_agent else tuple(n for n, _ in service_argvs(settings))
    stack = EmbeddedStack(settings, only=tuple(n for n in services if n != "beat"))
    try:
        stack.start()
        yield stack.redis_url, True
    finally:
        stack.stop()


def check_config_files(settings: Settings) -> None:
    """Load the registry and the server mcpServers file before a stack starts: one that does
    not load is the caller's input (one line, exit 2 from ``main``), not a brain that dies at
    start (exit 3 and its log)."""
    if settings.registry is not None:
        load_registry(settings.registry)
    if settings.mcp_config is not None:
        load_mcp_config(settings.mcp_config)


def fail(message: str, code: int) -> NoReturn:
    # soft_wrap: a one-line reason stays one line (copyable, greppable) whatever the width.
    # escape: a reason quotes paths and tool output, and "[/tmp/x]" is rich markup.
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    sys.exit(code)


@contextlib.contextmanager
def running_brain(settings: Settings) -> Iterator[Brain]:
    url = settings.redis_url or running_stack_url(settings)
    if not url:
        fail(
            "no stack is running here: start one with `vancetope up` (or set VANCETOPE_REDIS_URL)", EXIT_STACK
        )
    try:
        brain = Brain.connect(settings, url)
    except StackNotRunning as exc:
        fail(str(exc), EXIT_STACK)
    try:
        yield brain
    except redis.RedisError as exc:
        # Redis went away after the connect: one line saying what is unreachable, no traceback.
        fail(str(unreachable(url, exc)), EXIT_STACK)
    finally:
        brain.close()


def main() -> None:
    # MCP servers installed beside Vancetope (mcp-server-time, ...) are found by name even when
    # its virtualenv is not activated: the same rule the stack's processes get (stack_env).
    bin_dir = os.path.dirname(sys.executable)
    os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    try:
        cli()
    except StoreError as exc:
        # The store is part of the stack: its failure is "unreachable", not the caller's input.
        fail(f"the store failed: {exc}", EXIT_STACK)
    except (BrainError, MCPConfigError) as exc:
        # An MCP config file that does not load is the caller's input, like a bad tree.
        fail(str(exc), EXIT_BAD_INPUT)
    except redis.RedisError as exc:
        # Last resort: every command maps Redis errors itself; none may end in a traceback.
        fail(f"Redis failed: {exc}; is the stack running (`vancetope up`)?", EXIT_STACK)
    except Exception as exc:
        if not is_store_failure(exc):
            raise
        fail(
            f"the store failed: {exc}; check VANCETOPE_STORE_URL / VANCETOPE_MONGO_URL and that the "
            "database is up",
            EXIT_STACK,
        )


def is_store_failure(exc: BaseException) -> bool:
    """A SQLite or MongoDB error. pymongo is looked up, not imported: it is loaded only when a
    MongoDB store was opened (0.5 s of every command's start otherwise), and without it no
    error can be pymongo's."""
    mongo_errors = sys.modules.get("pymongo.errors")
    mongo_error = getattr(mongo_errors, "PyMongoError", None)
    return isinstance(exc, sqlite3.Error) or (mongo_error is not None and isinstance(exc, mongo_error))
