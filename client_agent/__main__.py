"""``vancetope-agent``: the client agent's command line (layer: client_agent).

One job: parse the command, load the config, and run the agent (``run``), show what it
would announce without connecting anywhere (``tools``), install or remove it as a login
service (``install``/``uninstall``: service.py decides, service_manager.py acts) or say
whether it runs, is connected and enrolled (``status``).
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import sys
import time
from logging.handlers import RotatingFileHandler
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from client_agent import service_manager
from client_agent.approvals import ConsentDir
from client_agent.config import ENV_PREFIX, AgentConfig, load_config
from client_agent.consent import PendingRequest, RequestKind, server_command, server_digest
from client_agent.errors import AgentConfigError, AgentError, NoCredential, NotEnrolled
from client_agent.policy import Policy
from client_agent.service import (
    ServiceKind,
    ServiceSpec,
    default_log_file,
    install_commands,
    option_value,
    prepare_commands,
    program_of,
    service_file,
    service_kind,
    shell_line,
)
from client_agent.status import assess, describe, gather
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
@click.option(
    "--log-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
    help="Log to this file (rotated at 10 MB, 3 kept) instead of stderr; overrides log_file from the config.",
)  # fmt: skip
def run(config_path: Path, log_level: str | None, log_file: Path | None) -> None:
    """Connect to the broker, announce this workstation's tools and run tool calls until stopped.

    \b
    Exit codes: 0 stopped by SIGTERM/SIGINT, 1 failed, 2 bad config or no credential
    (enroll the client first), 3 the broker refused the credential (not enrolled, or revoked).
    """
    config = _load(config_path)
    _require_credential(config)
    if log_file is not None:
        config = config.model_copy(update={"log_file": log_file.expanduser().absolute()})
    _setup_logging(log_level or config.log_level, config.log_file)
    from client_agent.agent import EXIT_NOT_ENROLLED, Agent  # slow (Celery); `tools` does not need it

    try:
        code = Agent(config, config_file=config_path.expanduser().absolute()).run()
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
    """Show the tools this agent would announce (starting its MCP servers), without connecting.

    It needs no broker_url nor credential: it lists tools on a workstation not enrolled yet."""
    from client_agent.mcp_json import load_mcp_tools  # slow (the MCP SDK); pending/approve do not need it

    config = _load(config_path)
    _setup_logging("WARNING")
    # Its failures and notes are printed in the tables below; do not print them twice.
    logging.getLogger("vancetope.agent.mcp").setLevel(logging.CRITICAL)
    policy = Policy.from_config(config, config_path.expanduser().absolute())
    native = policy.native()
    consent = _consent(config)
    mcp = load_mcp_tools(
        config.mcp_json, policy, native, config.default_timeout_s, consent, config.trust_mcp_servers
    )
    try:
        _print_tools(config, policy, mcp)
    finally:
        mcp.close()


# Exit codes of install/uninstall (run and status document their own).
EXIT_BAD_INPUT = 2
EXIT_SERVICE_MANAGER = 5


@main.command()
@_CONFIG
@click.option(
    "--dry-run",
    "--print",
    "dry_run",
    is_flag=True,
    help="Show the unit/plist and the commands install would run; write and run nothing.",
)
@click.option(
    "--no-start",
    is_flag=True,
    help="Write and enable the service (it starts at next login), do not start it now.",
)
def install(config_path: Path, dry_run: bool, no_start: bool) -> None:
    """Run this agent as a login service: a systemd user unit (Linux) or a launchd agent (macOS).

    It starts at login, is restarted when it fails (not after a bad config or a refused
    credential), and logs to log_file (default: ~/.local/state/vancetope/agent-<id>.log,
    on macOS ~/Library/Logs/vancetope/). The service sees agent.toml only, not this shell's
    VANCETOPE_AGENT_* variables: put the credential in credential_file.

    \b
    Exit codes: 0 installed (and started), 2 bad config, no credential or unsupported platform,
    5 the file is written but the service manager could not enable or start it
    (the commands to run are printed).
    """
    kind = _kind()
    config = _load_for_service(config_path)
    spec = ServiceSpec(
        python=Path(sys.executable).absolute(),  # not resolved: a venv's python must stay the venv's
        config=config_path.expanduser().absolute(),
        log_file=config.log_file or default_log_file(kind, Path.home(), os.environ, config.client_id),
        working_dir=config_path.expanduser().absolute().parent,
        client_id=config.client_id,
    )
    path = service_file(kind, Path.home(), os.environ)
    previous = _installed_config(kind, path) if path.exists() else None
    if previous is not None and previous != str(spec.config):
        click.echo(f"note: {path} ran {previous}; it will run {spec.config} instead")
    if dry_run:
        click.echo(f"# {path} (not written: --dry-run)")
        click.echo(service_manager.render(kind, spec), nl=False)
        commands = prepare_commands(kind, os.getuid(), not no_start) + install_commands(
            kind, path, os.getuid(), not no_start
        )
        click.echo(f"# then: {shell_line(commands) or '(nothing: it loads at the next login)'}")
        return
    try:
        report = service_manager.install(kind, spec, path, os.getuid(), start=not no_start)
    except OSError as exc:
        click.echo(f"error: cannot write {path}: {exc.strerror or exc}", err=True)
        sys.exit(EXIT_BAD_INPUT)
    click.echo(f"wrote {path}")
    _print_ran(report)
    if report.failed is not None:
        _print_todo(kind, "enable the service", report)
        sys.exit(EXIT_SERVICE_MANAGER)
    started = "started now" if not no_start else "not started now (--no-start)"
    click.echo(f"client agent {config.client_id}: starts at login, restarts on failure; {started}")
    click.echo(f"log: {spec.log_file}")
    click.echo(f"check it: vancetope-agent status --config {spec.config}")


@main.command()
def uninstall() -> None:
    """Stop and disable the login service and remove its unit/plist.

    Your agent.toml, credential file, state folder (data_dir) and log are left in place;
    the output names them.

    \b
    Exit codes: 0 removed (or nothing was installed), 2 unsupported platform,
    5 the file is removed but the service manager could not be told (commands printed).
    """
    kind = _kind()
    path = service_file(kind, Path.home(), os.environ)
    if not path.exists():
        click.echo(f"nothing to remove: {path} does not exist")
        return
    program = program_of(kind, path.read_text(encoding="utf-8", errors="replace"))
    report = service_manager.uninstall(kind, path, os.getuid())
    _print_ran(report)
    for removed in report.removed:
        click.echo(f"removed {removed}")
    left = [option_value(program, "--config"), option_value(program, "--log-file")]
    if any(left):
        click.echo("left in place (delete them if this workstation is done with the agent): "
                   + ", ".join(p for p in left if p) + ", and the config's credential_file and data_dir")  # fmt: skip
    if report.failed is not None:
        _print_todo(kind, "tell the service manager", report)
        sys.exit(EXIT_SERVICE_MANAGER)


@main.command()
@_CONFIG
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the text.")
def status(config_path: Path, as_json: bool) -> None:
    """Say whether this agent runs, is connected to the brain and is enrolled.

    Running: its service is active, or the agent process recorded in data_dir is alive.
    Connected: the broker took a heartbeat within heartbeat_ttl_s and the brain accepted
    its announcement. Enrolled: the broker accepts its credential (one PING).

    \b
    Exit codes: 0 running, connected and enrolled; 1 running but not connected;
    2 bad config; 3 not enrolled or revoked; 4 not running.
    """
    config = _load(config_path)
    kind = service_kind(sys.platform)
    path = None if kind is None else service_file(kind, Path.home(), os.environ)
    service = error = None
    here = config_path.expanduser().absolute()
    if kind is not None and path is not None and path.exists():
        installed_for = _installed_config(kind, path)
        if installed_for != str(here):
            error = f"it runs another config ({installed_for or 'unreadable'}), not this one"
        else:
            answer = service_manager.query(kind, path, os.getuid())
            if isinstance(answer, service_manager.CommandOutcome):
                error = f"{kind.value} cannot be asked: `{shlex_join(answer.argv)}` failed: {answer.output}"
            else:
                service = answer
    log_file = config.log_file or (
        None if kind is None else default_log_file(kind, Path.home(), os.environ, config.client_id)
    )
    facts = gather(config, here, kind, path, service, error, log_file)
    result = assess(facts)
    click.echo(json.dumps(result.to_json()) if as_json else describe(result))
    sys.exit(result.exit_code)


def _installed_config(kind: ServiceKind, path: Path) -> str | None:
    """The --config an installed unit/plist runs (one service per user: install replaces it)."""
    try:
        return option_value(program_of(kind, path.read_text(encoding="utf-8", errors="replace")), "--config")
    except OSError:
        return None


def shlex_join(argv: tuple[str, ...]) -> str:
    return shell_line([list(argv)])


def _kind() -> ServiceKind:
    kind = service_kind(sys.platform)
    if kind is None:
        click.echo(
            f"error: install/uninstall know systemd (Linux) and launchd (macOS), not {sys.platform}", err=True
        )
        sys.exit(EXIT_BAD_INPUT)
    return kind


def _load_for_service(path: Path) -> AgentConfig:
    """The config as the service will see it: from the file alone, without this shell's environment."""
    try:
        config = load_config(path, environ={})
        config.own_broker_url()  # the service cannot run without this client's own credential
    except (AgentConfigError, NoCredential) as exc:
        click.echo(f"error: {exc}", err=True)
        if any(k.startswith(ENV_PREFIX) for k in os.environ):
            click.echo("(the service does not see this shell's VANCETOPE_AGENT_* variables: "
                       "put every setting, and credential_file, in the agent's TOML file)", err=True)  # fmt: skip
        sys.exit(EXIT_BAD_INPUT)
    if set_here := sorted(k for k in os.environ if k.startswith(ENV_PREFIX)):
        click.echo(
            f"note: the service will not see {', '.join(set_here)} from this shell; it reads {path} only"
        )
    return config


def _print_ran(report: service_manager.Report) -> None:
    for outcome in report.ran:
        verdict = "ok" if outcome.ok else f"failed: {outcome.output or f'exit {outcome.returncode}'}"
        click.echo(f"ran {shlex_join(outcome.argv)}: {verdict}")


def _print_todo(kind: ServiceKind, what: str, report: service_manager.Report) -> None:
    manager = "systemctl --user" if kind is ServiceKind.SYSTEMD else "launchctl"
    click.echo(
        f"could not {what}: {manager} cannot be used here ({report.failed.output if report.failed else ''}).",
        err=True,
    )
    hint = (
        " (a desktop login session, or `loginctl enable-linger $USER`)" if kind is ServiceKind.SYSTEMD else ""
    )
    click.echo(f"Once {manager} works{hint}, run:\n  {shell_line(report.todo)}", err=True)


# --- consent: pending / approve / deny (docs/client-agent.md, "Consent on the workstation") ---------------------
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
        # Text, not markup: names and descriptions come from the MCP servers.
        table.add_row(
            *map(Text, (tool.name, tool.type.value, tool.mcp_server or "", _first_line(tool.description)))
        )
    console.print(table)
    if not policy.shell_enabled:
        console.print("shell_execute is not offered: shell_enabled = false")
    for note in mcp.notes:
        console.print(f"[yellow]note:[/] {escape(note)}")
    if mcp.failures:
        failed = Table(title="MCP servers that failed (not announced)")
        for column in ("server", "problem", "stderr tail"):
            failed.add_column(column, overflow="fold")
        for failure in mcp.failures:
            failed.add_row(*map(Text, (failure.server, failure.message, failure.stderr_tail)))
        console.print(failed)


def _first_line(text: str, limit: int = 100) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _require_credential(config: AgentConfig) -> None:
    """`run` and `install` need this client's own credential: without one the agent would retry
    a broker that never lets it in (exit 2, one line saying how to enroll)."""
    try:
        config.own_broker_url()
    except NoCredential as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_BAD_INPUT)


def _load(path: Path) -> AgentConfig:
    try:
        return load_config(path)
    except AgentConfigError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)


_LOG_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
_LOG_MAX_BYTES = 10 * 1024 * 1024
_LOG_BACKUPS = 3


def _setup_logging(level: str, log_file: Path | None = None) -> None:
    if log_file is None:
        logging.basicConfig(level=level.upper(), stream=sys.stderr, format=_LOG_FORMAT)
        return
    try:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        handler = RotatingFileHandler(
            log_file, maxBytes=_LOG_MAX_BYTES, backupCount=_LOG_BACKUPS, encoding="utf-8"
        )
    except OSError as exc:
        click.echo(f"error: cannot write the log file {log_file}: {exc.strerror or exc}", err=True)
        sys.exit(2)
    handler.setFormatter(logging.Formatter(_LOG_FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler])


if __name__ == "__main__":
    main(prog_name="vancetope-agent")
