"""The agent as a login service, decided purely (layer: client_agent).

One job: what ``vancetope-agent install`` writes and which commands it runs, as values: the
systemd user unit (Linux) or launchd agent (macOS) text, where it goes, and the
``systemctl --user`` / ``launchctl`` command lines to enable, start, stop and query it.
No file, process or environment is touched here: ``service_manager.py`` does that.

The service runs ``<this interpreter> -m client_agent run --config <abs> --log-file <abs>``:
the interpreter of the environment ``vancetope-agent`` was installed in (a venv's
``bin/python`` is kept as is, not resolved, or the venv would be left), so it needs no PATH.
It starts at login, is restarted when it fails (not after a clean stop, a bad config (exit
2) or a refused credential (exit 3): restarting cannot fix those), and logs to a file.
"""

from __future__ import annotations

import plistlib
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

SYSTEMD_UNIT = "vancetope-agent.service"
LAUNCHD_LABEL = "org.vancetope.agent"
# Exit codes of `vancetope-agent run` that a restart cannot fix (bad config, refused credential).
NO_RESTART_EXIT_CODES = (2, 3)
RESTART_SEC = 5
RESTART_MAX_DELAY_SEC = 300


class ServiceKind(StrEnum):
    SYSTEMD = "systemd"
    LAUNCHD = "launchd"


@dataclass(frozen=True)
class ServiceSpec:
    """Everything the unit/plist says; all paths absolute."""

    python: Path
    config: Path
    log_file: Path
    working_dir: Path
    client_id: str

    def program(self) -> list[str]:
        return [str(self.python), "-m", "client_agent", "run", "--config", str(self.config),
                "--log-file", str(self.log_file)]  # fmt: skip


def service_kind(platform: str) -> ServiceKind | None:
    """systemd on Linux, launchd on macOS (``sys.platform``); None elsewhere."""
    if platform.startswith("linux"):
        return ServiceKind.SYSTEMD
    if platform == "darwin":
        return ServiceKind.LAUNCHD
    return None


def service_file(kind: ServiceKind, home: Path, env: Mapping[str, str]) -> Path:
    """Where the unit (honouring XDG_CONFIG_HOME when absolute) or the plist goes."""
    if kind is ServiceKind.SYSTEMD:
        xdg = env.get("XDG_CONFIG_HOME", "")
        base = Path(xdg) if xdg and Path(xdg).is_absolute() else home / ".config"
        return base / "systemd" / "user" / SYSTEMD_UNIT
    return home / "Library" / "LaunchAgents" / f"{LAUNCHD_LABEL}.plist"


def default_log_file(kind: ServiceKind, home: Path, env: Mapping[str, str], client_id: str) -> Path:
    """The service's log when the config sets no log_file: XDG state dir / ~/Library/Logs."""
    name = f"agent-{client_id}.log"
    if kind is ServiceKind.LAUNCHD:
        return home / "Library" / "Logs" / "vancetope" / name
    xdg = env.get("XDG_STATE_HOME", "")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else home / ".local" / "state"
    return base / "vancetope" / name


def stderr_file(log_file: Path) -> Path:
    """launchd's own capture of stdout/stderr (a traceback before logging starts), beside the log."""
    return log_file.with_name(log_file.stem + ".stderr" + log_file.suffix)


# --- systemd ---------------------------------------------------------------------------------------


def systemd_quote(arg: str) -> str:
    """One ExecStart word: specifiers (%) and variables ($) escaped; quoted when it has to be."""
    escaped = arg.replace("%", "%%").replace("$", "$$")
    if escaped and not any(ch in escaped for ch in " \t\n\"'\\;"):
        return escaped
    inner = escaped.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
    return f'"{inner}"'


def render_systemd_unit(spec: ServiceSpec) -> str:
    exec_start = " ".join(systemd_quote(arg) for arg in spec.program())
    no_restart = " ".join(str(code) for code in NO_RESTART_EXIT_CODES)
    return (
        "# Written by `vancetope-agent install`; remove with `vancetope-agent uninstall`.\n"
        "[Unit]\n"
        f"Description=Vancetope client agent {spec.client_id}\n"
        # Keep retrying however often it fails: a laptop's agent is worth restarting all day.
        "StartLimitIntervalSec=0\n"
        "\n"
        "[Service]\n"
        "Type=exec\n"
        f"ExecStart={exec_start}\n"
        f"WorkingDirectory={systemd_quote(str(spec.working_dir))}\n"
        "Environment=PYTHONUNBUFFERED=1\n"
        "Restart=on-failure\n"
        f"RestartSec={RESTART_SEC}\n"
        # Backoff 5 s -> 300 s over 10 restarts (systemd >= 254; older ones ignore these two keys).
        "RestartSteps=10\n"
        f"RestartMaxDelaySec={RESTART_MAX_DELAY_SEC}\n"
        f"RestartPreventExitStatus={no_restart}\n"
        # The agent finishes its running calls on SIGTERM; do not wait for ever.
        "TimeoutStopSec=60\n"
        "\n"
        "[Install]\n"
        "WantedBy=default.target\n"
    )


# --- launchd -------------------------------------------------------------------------------------------


def render_launchd_plist(spec: ServiceSpec) -> str:
    err = str(stderr_file(spec.log_file))
    plist = {
        "Label": LAUNCHD_LABEL,
        "ProgramArguments": spec.program(),
        "WorkingDirectory": str(spec.working_dir),
        "EnvironmentVariables": {"PYTHONUNBUFFERED": "1"},
        "RunAtLoad": True,
        # Restart after a non-zero exit (a crash), not after a clean stop.
        "KeepAlive": {"SuccessfulExit": False},
        "ThrottleInterval": RESTART_SEC * 2,
        "ProcessType": "Background",
        "StandardOutPath": err,
        "StandardErrorPath": err,
    }
    return plistlib.dumps(plist, sort_keys=False).decode("utf-8")


# --- commands ---------------------------------------------------------------------------------------------


def systemctl(*args: str) -> list[str]:
    return ["systemctl", "--user", *args]


def launchd_domain(uid: int) -> str:
    return f"gui/{uid}"


def install_commands(kind: ServiceKind, path: Path, uid: int, start: bool) -> list[list[str]]:
    """After the file is written: make the service manager take it, enable it at login, (re)start it.

    systemd: `restart`, not `enable --now`, so that reinstalling over a running agent runs the
    new unit. launchd: a bootstrapped agent with RunAtLoad starts at once, so --no-start only
    writes the plist (it loads at the next login).
    """
    if kind is ServiceKind.SYSTEMD:
        commands = [systemctl("daemon-reload"), systemctl("enable", SYSTEMD_UNIT)]
        return [*commands, systemctl("restart", SYSTEMD_UNIT)] if start else commands
    if not start:
        return []
    target = f"{launchd_domain(uid)}/{LAUNCHD_LABEL}"
    return [["launchctl", "enable", target], ["launchctl", "bootstrap", launchd_domain(uid), str(path)]]


def prepare_commands(kind: ServiceKind, uid: int, start: bool) -> list[list[str]]:
    """Run before install_commands, failing harmlessly: launchd refuses to bootstrap a label that
    is already loaded (a reinstall), so unload it first; systemd needs nothing."""
    return stop_commands(kind, uid) if kind is ServiceKind.LAUNCHD and start else []


def stop_commands(kind: ServiceKind, uid: int) -> list[list[str]]:
    """Stop and disable (uninstall; and launchd before bootstrapping again)."""
    if kind is ServiceKind.SYSTEMD:
        return [systemctl("disable", "--now", SYSTEMD_UNIT)]
    return [["launchctl", "bootout", f"{launchd_domain(uid)}/{LAUNCHD_LABEL}"]]


def after_removal_commands(kind: ServiceKind) -> list[list[str]]:
    return [systemctl("daemon-reload")] if kind is ServiceKind.SYSTEMD else []


def leftover_commands(kind: ServiceKind, uid: int) -> list[list[str]]:
    """What the user still has to run when the manager could not be told while uninstalling
    (the file is gone by then, so `disable` would fail: stop the running service, forget the unit)."""
    if kind is ServiceKind.SYSTEMD:
        return [systemctl("stop", SYSTEMD_UNIT), systemctl("daemon-reload")]
    return stop_commands(kind, uid)


def enable_links(kind: ServiceKind, path: Path) -> list[Path]:
    """The symlink `systemctl --user enable` made (WantedBy=default.target), removed with the unit
    when systemctl cannot do it, so no dangling link is left behind."""
    return [path.parent / "default.target.wants" / SYSTEMD_UNIT] if kind is ServiceKind.SYSTEMD else []


def query_command(kind: ServiceKind, uid: int) -> list[str]:
    if kind is ServiceKind.SYSTEMD:
        return systemctl(
            "show", SYSTEMD_UNIT, "--property=LoadState,ActiveState,SubState,MainPID,UnitFileState"
        )
    return ["launchctl", "print", f"{launchd_domain(uid)}/{LAUNCHD_LABEL}"]


@dataclass(frozen=True)
class ServiceState:
    """What the service manager says: loaded at all, running, with which pid, in its own words."""

    loaded: bool
    running: bool
    pid: int | None
    detail: str


def parse_systemctl_show(text: str) -> ServiceState:
    values = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    pid = int(values.get("MainPID", "0") or 0)
    active, sub = values.get("ActiveState", "unknown"), values.get("SubState", "unknown")
    return ServiceState(
        loaded=values.get("LoadState") == "loaded",
        running=active == "active",
        pid=pid or None,
        detail=f"{active} ({sub}), {values.get('UnitFileState', 'unknown')}",
    )


def parse_launchctl_print(text: str) -> ServiceState:
    """The lines of `launchctl print gui/<uid>/<label>` that matter: `state = running`, `pid = N`."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.strip().partition(" = ")
        if sep and key in ("state", "pid", "last exit code") and key not in fields:
            fields[key] = value.strip()
    pid = int(fields["pid"]) if fields.get("pid", "").isdigit() else None
    state = fields.get("state", "unknown")
    detail = (
        state if "last exit code" not in fields else f"{state}, last exit code {fields['last exit code']}"
    )
    return ServiceState(loaded=True, running=state == "running", pid=pid, detail=detail)


def shell_line(commands: Sequence[Sequence[str]]) -> str:
    """The commands as one line a user can paste."""
    return " && ".join(shlex.join(c) for c in commands)


def program_of(kind: ServiceKind, text: str) -> list[str]:
    """The command line an installed unit/plist runs (uninstall names the files it leaves behind)."""
    if kind is ServiceKind.LAUNCHD:
        try:
            args = plistlib.loads(text.encode("utf-8")).get("ProgramArguments", [])
        except (plistlib.InvalidFileException, ValueError, AttributeError):
            return []
        return [str(a) for a in args]
    for line in text.splitlines():
        if line.startswith("ExecStart="):
            try:
                words = shlex.split(line.removeprefix("ExecStart="))
            except ValueError:
                return []
            return [w.replace("%%", "%").replace("$$", "$") for w in words]
    return []


def option_value(program: Sequence[str], option: str) -> str | None:
    """``--config`` / ``--log-file`` in a program's arguments."""
    for index, word in enumerate(program[:-1]):
        if word == option:
            return program[index + 1]
    return None
