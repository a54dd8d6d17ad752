"""`vancetope web` (layer: brain/cli): the web view alone, beside a stack that runs elsewhere
(compose.yaml's `web` service). `vancetope up` runs the same process beside its own stack."""

from __future__ import annotations

import os

import click
from rich.markup import escape

from brain.cli.base import EXIT_BAD_INPUT, cli, err, fail
from brain.config import Settings
from brain.stack.embedded import stack_env, web_argv
from brain.stack.webauth import WEB_PORT, WebUnprotected, web_access


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Serve on this address.")
@click.option("--port", type=click.IntRange(1, 65535), default=WEB_PORT, show_default=True)
@click.pass_obj
def web(settings: Settings, host: str, port: int) -> None:
    """Serve the web view (trees, a tree's graph and timeline, live) in the foreground.

    It reads the store (the `store` setting) read-only and needs no Redis. It asks for a
    password on every address, loopback too: VANCETOPE_WEB_BASIC_AUTH=user:password if set,
    else user 'vancetope' and a password generated into <data_dir>/web.secret.
    """
    try:
        access = web_access(host, settings.data_dir, os.environ)
    except WebUnprotected as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    env = stack_env(settings, "")
    for variable in ("VANCETOPE_REDIS_URL", "VANCETOPE_VAULT_KEY"):
        env.pop(variable, None)
    env.update(access.env())
    shown = f"[{host}]" if ":" in host else host
    err.print(escape(f"web: http://{shown}:{port}/ ({access.login()})"), highlight=False, soft_wrap=True)
    argv = web_argv(port, host)
    os.execve(argv[0], argv, env)
