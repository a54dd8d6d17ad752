"""Installing the agent as a login service (layer: client_agent, the thin shell over service.py).

One job: write or remove the unit/plist that ``service.py`` rendered and run the
``systemctl --user`` / ``launchctl`` commands it chose, recording each outcome. A service
manager that cannot be used (no ``systemctl``, no user bus as in containers, a command
that fails) is an outcome, never a traceback: the report says which command failed and
which ones the user should run once it can work.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from client_agent.service import (
    ServiceKind,
    ServiceSpec,
    ServiceState,
    after_removal_commands,
    enable_links,
    install_commands,
    leftover_commands,
    parse_launchctl_print,
    parse_systemctl_show,
    prepare_commands,
    query_command,
    render_launchd_plist,
    render_systemd_unit,
    stderr_file,
    stop_commands,
)

COMMAND_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class CommandOutcome:
    argv: tuple[str, ...]
    returncode: int | None  # None: it could not be run at all
    output: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


Runner = Callable[[Sequence[str]], CommandOutcome]


def run_command(argv: Sequence[str], timeout_s: float = COMMAND_TIMEOUT_S) -> CommandOutcome:
    """Run one service-manager command; every way it can fail becomes an outcome."""
    args = tuple(argv)
    try:
        proc = subprocess.run(args, check=False, capture_output=True, text=True, timeout=timeout_s)
    except FileNotFoundError:
        return CommandOutcome(args, None, f"{args[0]}: command not found")
    except subprocess.TimeoutExpired:
        return CommandOutcome(args, None, f"no answer within {timeout_s:g}s")
    except OSError as exc:
        return CommandOutcome(args, None, f"cannot run {args[0]}: {exc.strerror or exc}")
    text = (proc.stderr.strip() or proc.stdout.strip()) if proc.returncode else proc.stdout.strip()
    return CommandOutcome(args, proc.returncode, text)


@dataclass
class Report:
    """What install/uninstall did: files written or removed, commands run, what is left to do."""

    written: list[Path] = field(default_factory=list)
    removed: list[Path] = field(default_factory=list)
    ran: list[CommandOutcome] = field(default_factory=list)
    failed: CommandOutcome | None = None
    todo: list[list[str]] = field(default_factory=list)


def render(kind: ServiceKind, spec: ServiceSpec) -> str:
    return render_systemd_unit(spec) if kind is ServiceKind.SYSTEMD else render_launchd_plist(spec)


def install(
    kind: ServiceKind, spec: ServiceSpec, path: Path, uid: int, start: bool, runner: Runner = run_command
) -> Report:
    """Write the unit/plist (and the log's folder), then enable (and start) it."""
    report = Report()
    _write(path, render(kind, spec))
    report.written.append(path)
    spec.log_file.parent.mkdir(parents=True, exist_ok=True)
    for argv in prepare_commands(kind, uid, start):
        report.ran.append(runner(argv))  # may fail: nothing was loaded yet
    _run_all(install_commands(kind, path, uid, start), report, runner)
    return report


def uninstall(kind: ServiceKind, path: Path, uid: int, runner: Runner = run_command) -> Report:
    """Stop and disable the service, remove its file, tell the manager. Nothing installed: empty report."""
    report = Report()
    if not path.exists():
        return report
    stop = stop_commands(kind, uid)
    if kind is ServiceKind.LAUNCHD:
        # `bootout` fails for a label that is not loaded (installed with --no-start): nothing to stop.
        state = query(kind, path, uid, runner)
        if isinstance(state, ServiceState) and not state.loaded:
            stop = []
    _run_all(stop, report, runner)
    path.unlink()
    report.removed.append(path)
    if report.failed is None:
        _run_all(after_removal_commands(kind), report, runner)
        return report
    for link in enable_links(kind, path):  # what `disable` would have removed
        if link.is_symlink():
            link.unlink()
            report.removed.append(link)
    report.todo = leftover_commands(kind, uid)
    return report


def query(
    kind: ServiceKind, path: Path, uid: int, runner: Runner = run_command
) -> ServiceState | CommandOutcome:
    """The service manager's view of the installed service, or the failed query."""
    outcome = runner(query_command(kind, uid))
    if kind is ServiceKind.LAUNCHD and outcome.returncode not in (0, None):
        # `launchctl print` fails for a label that is not loaded (installed with --no-start).
        return ServiceState(loaded=False, running=False, pid=None, detail="not loaded")
    if not outcome.ok:
        return outcome
    return (
        parse_systemctl_show(outcome.output)
        if kind is ServiceKind.SYSTEMD
        else parse_launchctl_print(outcome.output)
    )


def log_files(kind: ServiceKind, spec_log: Path) -> list[Path]:
    return [spec_log, stderr_file(spec_log)] if kind is ServiceKind.LAUNCHD else [spec_log]


def _run_all(commands: list[list[str]], report: Report, runner: Runner) -> None:
    for index, argv in enumerate(commands):
        outcome = runner(argv)
        report.ran.append(outcome)
        if not outcome.ok:
            report.failed = outcome
            report.todo += commands[index:]
            return


def _write(path: Path, text: str) -> None:
    """Write-then-rename, mode 0644 (the manager reads it; nothing secret is in it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        tmp.chmod(0o644)
        tmp.replace(path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
