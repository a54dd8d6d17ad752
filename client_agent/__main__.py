"""``vancetope-agent``: the client agent's command line (layer: client_agent).

One job: parse the command, load the config, and either run the agent (``run``) or show
what it would announce without connecting anywhere (``tools``).
"""

from __future__ import annotations

import json
import logging
import shlex
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.console import Console
from rich.table import Table

from client_agent.approvals import ConsentDir
from client_agent.config import AgentConfig, load_config
from client_agent.consent import PendingRequest, RequestKind, server_command, server_digest
from client_agent.errors import AgentConfigError, AgentError, NotEnrolled
from client_agent.policy import Policy
from workers.errors import WorkerError
from workers.mcp_config import load_mcp_config

if TYPE_CHECKING:
    from client_agent.mcp_json import MCPTools

_CONFIG = click.option(
    "--config", "config_path", required=True, type=click.Path(dir_okay=False, path_type=Path),
    help="The agent's TOML file ([agent] table); VANCETOPE_AGENT_<FIELD> variables override it.",
)  # fmt: skip


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Vancetope client agent: runs the brain's tool calls for this workstation."""


@main.command()
@_CONFIG
@click.option("--log-level", default=None, help="Override log_level from the config (DEBUG, INFO, ...).")
def run(config_path: Path, log_level: str | None) -> None:
    """Connect to the broker, announce this workstation's tools and run tool calls until stopped."""
    config = _load(config_path)
    _setup_logging(log_level or config.log_level)
    from client_agent.agent import EXIT_NOT_ENROLLED, Agent  # slow (Celery); `tools` does not need it

    try:
        code = Agent(config).run()
    except NotEnrolled as exc:
        logging.getLogger("vancetope.agent").error("%s", exc)
        sys.exit(EXIT_NOT_ENROLLED)
    except AgentError as exc:
        logging.getLogger("vancetope.agent").error("%s", exc)
        sys.exit(1)
    sys.exit(code)


@main.command()
@_CONFIG
def tools(config_path: Path) -> None:
    """Show the tools this agent would announce (starting its MCP servers), without connecting."""
    from client_agent.mcp_json import load_mcp_tools  # slow (the MCP SDK); pending/approve do not need it

    config = _load(config_path)
    _setup_logging("WARNING")
    # Its failures and notes are printed in the tables below; do not print them twice.
    logging.getLogger("vancetope.agent.mcp").setLevel(logging.CRITICAL)
    policy = Policy.from_config(config)
    native = policy.native()
    consent = _consent(config)
    mcp = load_mcp_tools(
        config.mcp_json, policy, native, config.default_timeout_s, consent, config.trust_mcp_servers
    )
    try:
        _print_tools(config, policy, mcp)
    finally:
        mcp.close()


# --- consent: pending / approve / deny (README "Consent on the workstation") ---------------------
# They talk to the running agent through its 0700 state directory, never through Redis.


@main.command()
@_CONFIG
@click.option("--json", "as_json", is_flag=True, help="Print the requests as JSON.")
def pending(config_path: Path, as_json: bool) -> None:
    """List what waits for your approval: tool calls (with their arguments in full), MCP servers
    (with their exact command) and MCP tools whose definition changed (with the diff)."""
    consent = _consent(_load(config_path))
    requests = consent.pending()
    if as_json:
        click.echo(json.dumps([r.model_dump(mode="json") for r in requests], indent=2))
        return
    if not requests:
        click.echo("nothing waits for approval")
        return
    for request in requests:
        click.echo(describe_request(request, time.time()))
        click.echo("")
    click.echo("approve with: vancetope-agent approve ID --config ...   deny with: vancetope-agent deny ID")


@main.command()
@_CONFIG
@click.argument("ids", nargs=-1)
@click.option(
    "--all-servers", is_flag=True,
    help="Approve the current command of every server in mcp.json (for setups without a person at "
    "the keyboard: run it yourself after reading mcp.json; later changes are asked again).",
)  # fmt: skip
def approve(config_path: Path, ids: tuple[str, ...], all_servers: bool) -> None:
    """Approve pending requests by ID (see `vancetope-agent pending`)."""
    config = _load(config_path)
    consent = _consent(config)
    if all_servers:
        _approve_all_servers(config, consent)
    if not ids and not all_servers:
        click.echo(
            "error: give the ID of a pending request (vancetope-agent pending), or --all-servers", err=True
        )
        sys.exit(2)
    for request_id in ids:
        request = _pending(consent, request_id)
        consent.approve(request)
        click.echo(f"approved {request.id} ({_what(request)})")


@main.command()
@_CONFIG
@click.argument("request_id", metavar="ID")
@click.option("--reason", default="", help="Why; recorded in the task's error.")
def deny(config_path: Path, request_id: str, reason: str) -> None:
    """Deny a pending request: a tool call fails ("denied by the workstation's user"); a server
    stays stopped and a changed tool unoffered (asked again when the agent restarts)."""
    consent = _consent(_load(config_path))
    request = _pending(consent, request_id)
    if request.kind is RequestKind.CALL:
        consent.decide(request.id, False, reason)
    else:
        consent.remove_pending(request.id)
    click.echo(f"denied {request.id} ({_what(request)})")


def describe_request(request: PendingRequest, now: float) -> str:
    """What the user approves, in full."""
    waited = f"waiting since {time.strftime('%H:%M:%S', time.localtime(request.since))} ({now - request.since:.0f}s)"
    head = f"{request.id}  {request.kind.value}  {_what(request)}  {waited}"
    if request.kind is RequestKind.CALL:
        lines = [head, f"  tree {request.tree_id}  task {request.task_id}  run {request.run_id}"]
        if request.expires_at is not None:
            lines.append(f"  denied without an answer in {max(0.0, request.expires_at - now):.0f}s")
        lines.append("  arguments:")
        lines += [
            "    " + line for line in json.dumps(request.args, indent=2, ensure_ascii=False).splitlines()
        ]
        return "\n".join(lines)
    if request.kind is RequestKind.SERVER:
        d = request.definition
        lines = [head, f"  command: {shlex.join(request.command)}"]
        if d.get("cwd"):
            lines.append(f"  in: {d['cwd']}")
        if d.get("env"):
            lines.append(f"  environment variables: {', '.join(d['env'])}")
        if d.get("headers"):
            lines.append(f"  headers: {', '.join(d['headers'])}")
        return "\n".join(lines)
    return "\n".join(
        [
            head,
            "  definition changed since you approved it:",
            *("    " + x for x in request.diff.splitlines()),
        ]
    )


def _what(request: PendingRequest) -> str:
    if request.kind is RequestKind.SERVER:
        return f"MCP server {request.mcp_server!r}"
    where = f" of MCP server {request.mcp_server!r}" if request.mcp_server else ""
    return f"tool {request.tool!r}{where}"


def _pending(consent: ConsentDir, request_id: str) -> PendingRequest:
    request = consent.get(request_id)
    if request is None:
        click.echo(
            f"error: no pending request {request_id!r} (it was answered, timed out, or never existed); "
            "see vancetope-agent pending",
            err=True,
        )
        sys.exit(1)
    return request


def _approve_all_servers(config: AgentConfig, consent: ConsentDir) -> None:
    from client_agent.mcp_json import localize

    if config.mcp_json is None:
        click.echo("no mcp_json in the config: no servers to approve")
        return
    try:
        servers = localize(load_mcp_config(config.mcp_json), config.mcp_json.parent).servers
    except WorkerError as exc:
        click.echo(f"error: {exc.message}", err=True)
        sys.exit(2)
    consent.approve_servers({name: server_digest(spec) for name, spec in servers.items()})
    for name, spec in servers.items():
        click.echo(f"approved MCP server {name!r}: {shlex.join(server_command(spec))}")


def _consent(config: AgentConfig) -> ConsentDir:
    try:
        return ConsentDir.for_config(config)
    except AgentError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)


def _print_tools(config: AgentConfig, policy: Policy, mcp: MCPTools) -> None:
    console = Console()
    table = Table(title=f"Tools client agent {config.client_id!r} would announce")
    for column in ("tool", "type", "MCP server", "description"):
        table.add_column(column, overflow="fold")
    for tool in [*policy.announced_native(), *mcp.tools]:
        table.add_row(tool.name, tool.type.value, tool.mcp_server or "", _first_line(tool.description))
    console.print(table)
    if not policy.shell_enabled:
        console.print("shell_execute is not offered: shell_enabled = false")
    for note in mcp.notes:
        console.print(f"[yellow]note:[/] {note}")
    if mcp.failures:
        failed = Table(title="MCP servers that failed (not announced)")
        for column in ("server", "problem", "stderr tail"):
            failed.add_column(column, overflow="fold")
        for failure in mcp.failures:
            failed.add_row(failure.server, failure.message, failure.stderr_tail)
        console.print(failed)


def _first_line(text: str, limit: int = 100) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _load(path: Path) -> AgentConfig:
    try:
        return load_config(path)
    except AgentConfigError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(), stream=sys.stderr, format="%(asctime)s %(levelname)-7s %(name)s: %(message)s"
    )


if __name__ == "__main__":
    main(prog_name="vancetope-agent")
