"""``vancetope-agent``: the client agent's command line (layer: client_agent).

One job: parse the command, load the config, and either run the agent (``run``) or show
what it would announce without connecting anywhere (``tools``).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from client_agent.config import AgentConfig, load_config
from client_agent.errors import AgentConfigError, AgentError, NotEnrolled
from client_agent.mcp_json import MCPTools, load_mcp_tools
from client_agent.policy import Policy

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
    config = _load(config_path)
    _setup_logging("WARNING")
    # Its failures and notes are printed in the tables below; do not print them twice.
    logging.getLogger("vancetope.agent.mcp").setLevel(logging.CRITICAL)
    policy = Policy.from_config(config)
    native = policy.native()
    mcp = load_mcp_tools(config.mcp_json, policy, native, config.default_timeout_s)
    try:
        _print_tools(config, policy, mcp)
    finally:
        mcp.close()


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
