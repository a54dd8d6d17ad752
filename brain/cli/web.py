"""`vancetope web` (layer: brain/cli): the web view alone, beside a stack that runs elsewhere
(compose.yaml's `web` service). `vancetope up` runs the same process beside its own stack."""

from __future__ import annotations

import os

import click
from rich.markup import escape

from brain.cli.base import EXIT_BAD_INPUT, cli, err, fail
from brain.config import Settings
from brain.stack.embedded import running_stack_url, stack_env, web_argv
from brain.stack.webauth import WEB_PORT, WebUnprotected, web_access


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Serve on this address.")
@click.option("--port", type=click.IntRange(1, 65535), default=WEB_PORT, show_default=True)
@click.pass_obj
def web(settings: Settings, host: str, port: int) -> None:
    """Serve the web view (trees, a tree's graph and timeline, live) in the foreground.

    It reads the store (the `store` setting) for its pages; with the brain's Redis URL
    (VANCETOPE_REDIS_URL, or the stack `vancetope up` runs here) it also cancels, approves
    changed tools and shows the clients page. It asks for a
    password on every address, loopback too: VANCETOPE_WEB_BASIC_AUTH=user:password if set,
    else user 'vancetope' and a password generated into <data_dir>/web.secret.
    """
    try:
        access = web_access(host, settings.data_dir, os.environ)
    except WebUnprotected as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    # The brain's Redis URL, when a stack answers here, for the actions and the clients page.
    env = stack_env(settings, settings.redis_url or running_stack_url(settings) or "")
    env.pop("VANCETOPE_VAULT_KEY", None)
    if not env["VANCETOPE_REDIS_URL"]:
        env.pop("VANCETOPE_REDIS_URL")
    env.update(access.env())
    shown = f"[{host}]" if ":" in host else host
    err.print(escape(f"web: http://{shown}:{port}/ ({access.login()})"), highlight=False, soft_wrap=True)
    argv = web_argv(port, host)
    os.execve(argv[0], argv, env)
