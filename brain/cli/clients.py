"""Commands about client agents and users (layer: brain/cli): clients, enroll, revoke,
approve-tools; users token for the MCP gateway."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click
from rich.markup import escape

from brain.cli.base import (
    EXIT_BAD_INPUT,
    EXIT_STACK,
    cli,
    console,
    err,
    fail,
    running_brain,
)
from brain.cli.display import clients_table
from brain.config import Settings
from brain.core.toolnames import clash_lines
from brain.errors import NotFound
from brain.runtime import operations
from brain.runtime.enrollment import enroll, revoke
from brain.stack.embedded import running_stack_url
from brain.stack.redis_server import write_private
from brain.store import open_store


@cli.group(invoke_without_command=True)
@click.option(
    "--json", "as_json", is_flag=True, help="Print JSON (shape in docs/output.md) instead of a table."
)
@click.pass_context
def clients(ctx: click.Context, as_json: bool) -> None:
    """Show enrolled client agents: who is connected, with which tools, and what waits for whom."""
    if ctx.invoked_subcommand is not None:
        return
    with running_brain(ctx.obj) as brain:
        if as_json:
            click.echo(json.dumps(operations.clients_view(brain), indent=2))
            return
        book = brain.scheduler.presence
        marks = brain.clients.misbehaving.all()
        sessions = book.sessions()
        rtts = book.round_trips(sessions)
        console.print(
            clients_table(
                book.enrolled(), sessions, brain.scheduler.parked.waiting(), marks, rtts, book.last_seen()
            )
        )
        registry = brain.scheduler.registry
        for cid, session in sorted(sessions.items()):
            # A client's MCP tool the registry's bare name does not mean (brain.core.toolnames).
            for line in clash_lines(session.clashes(registry.tools)):
                console.print(f"[yellow]clash:[/] {escape(f'client {cid}: {line}')}", highlight=False)
        if registry.loaded_at:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(registry.loaded_at))
            console.print(escape(f"registry: {len(registry.tools)} tools, loaded {when}"), highlight=False)
            for line in registry.changes:
                console.print(f"  last reload: {escape(line)}", highlight=False)
            for line in clash_lines(registry.clashes):
                console.print(f"  [yellow]clash:[/] {escape(line)}", highlight=False)


@clients.command("enroll")
@click.argument("client_id")
@click.option("--user", required=True, help="The user this client belongs to.")
@click.option(
    "--output",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Write the credential to this file (mode 0600), for agent.toml's credential_file, "
    "instead of printing it.",
)
@click.pass_obj
def clients_enroll(settings: Settings, client_id: str, user: str, output: Path | None) -> None:
    """Allow CLIENT_ID (a client agent of USER) to connect, with a credential of its own.

    Prints one line, VANCETOPE_AGENT_BROKER_URL=<url>: the agent's own Redis user and
    secret, which reach only that client's keys (with --output, writes it to that file
    instead and prints no secret). The secret is shown once and stored nowhere else;
    enrolling again issues a new one and the old one stops working.
    """
    with running_brain(settings) as brain:
        try:
            credential = enroll(
                brain.scheduler.presence, client_id, user, settings.agent_broker_url or brain.redis_url
            )
        except ValueError as exc:
            fail(str(exc), EXIT_BAD_INPUT)
    if output is not None:
        # The file is the one copy: a terminal's scrollback, a CI log or `script` would keep
        # another if the line were printed as well.
        write_private(output, credential.env_line + "\n")
        err.print(
            escape(
                f"enrolled client {client_id} for user {user}; its queue is client.{client_id}. Its credential "
                f"is in {output} (mode 0600, printed nowhere): copy it beside the agent's agent.toml and set "
                f"credential_file = {output.name!r} there."
            ),
            highlight=False,
        )
        return
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
    with running_brain(settings) as brain:
        if not revoke(brain.clients, client_id):
            fail(f"no enrolled client {client_id!r}; `vancetope clients` lists them", EXIT_BAD_INPUT)
    console.print(f"revoked client [bold]{client_id}[/]; its credential no longer connects")


@clients.command("approve-tools")
@click.argument("client_id")
@click.argument("tools", nargs=-1)
@click.pass_obj
def clients_approve_tools(settings: Settings, client_id: str, tools: tuple[str, ...]) -> None:
    """Accept the changed definitions of CLIENT_ID's TOOLS (all its held tools if none named):
    they are pinned as now announced and routed to again once the agent re-announces."""
    with running_brain(settings) as brain:
        try:
            approved = operations.approve_tools(brain, client_id, tools)
        except NotFound as exc:
            fail(str(exc), EXIT_BAD_INPUT)
    if not approved:
        console.print(f"client {client_id} has no tool whose definition changed")
        return
    console.print(
        f"approved the new definitions of {', '.join(approved)} on client {client_id}", highlight=False
    )


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
    from brain.runtime import gateway_tokens as tokens

    if not user.strip() or len(user) > 128:
        fail("a user name is 1 to 128 characters", EXIT_BAD_INPUT)
    if not revoke and not (settings.redis_url or running_stack_url(settings)):
        # The store alone would take it, and the token every MCP client of USER holds would stop
        # working with nobody told, against a stack that is not even there (issue 22).
        fail(
            f"no stack is running here, so no gateway token was issued (the one {user} has, if any, "
            "still works): start one with `vancetope up` (or set VANCETOPE_REDIS_URL), then issue it",
            EXIT_STACK,
        )
    store = open_store(settings.store)
    try:
        if revoke:
            if not tokens.revoke(store, user):
                fail(f"user {user!r} has no gateway token", EXIT_BAD_INPUT)
            err.print(
                escape(f"revoked the gateway token of {user}; requests with it get 401"), highlight=False
            )
            return
        token = tokens.issue(store, user)
    finally:
        store.close()
    click.echo(f"{tokens.TOKEN_VARIABLE}={token}")
