"""client_agent.service_manager with a recording runner: the launchd path, which no Linux machine
can run for real (the systemd path runs real subprocesses in test_service_cli.py)."""

from __future__ import annotations

import plistlib
from collections.abc import Sequence
from pathlib import Path

from client_agent import service_manager
from client_agent.service import LAUNCHD_LABEL, ServiceKind, ServiceSpec, ServiceState
from client_agent.service_manager import CommandOutcome, run_command

TARGET = f"gui/501/{LAUNCHD_LABEL}"
LOADED = "gui/501/org.vancetope.agent = {\n\tstate = running\n\tpid = 9\n}\n"


class Launchctl:
    """Answers like launchctl: `print`/`bootout` fail for a label that is not loaded."""

    def __init__(self, loaded: bool) -> None:
        self.loaded = loaded
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str]) -> CommandOutcome:
        self.calls.append(list(argv))
        verb = argv[1]
        if verb in ("print", "bootout") and not self.loaded:
            return CommandOutcome(tuple(argv), 113 if verb == "print" else 3, "Could not find service")
        if verb == "bootstrap":
            self.loaded = True
        if verb == "bootout":
            self.loaded = False
        return CommandOutcome(tuple(argv), 0, LOADED if verb == "print" else "")


def spec(tmp_path: Path) -> ServiceSpec:
    return ServiceSpec(Path("/venv/bin/python"), tmp_path / "agent.toml", tmp_path / "logs" / "agent.log",
                       tmp_path, "laptop")  # fmt: skip


def test_launchd_install_unloads_a_previous_copy_then_enables_and_bootstraps(tmp_path: Path) -> None:
    plist = tmp_path / "LaunchAgents" / f"{LAUNCHD_LABEL}.plist"
    launchctl = Launchctl(loaded=False)
    report = service_manager.install(
        ServiceKind.LAUNCHD, spec(tmp_path), plist, 501, start=True, runner=launchctl
    )
    assert report.failed is None and report.written == [plist]
    assert launchctl.calls == [
        ["launchctl", "bootout", TARGET],  # failed (not loaded): harmless
        ["launchctl", "enable", TARGET],
        ["launchctl", "bootstrap", "gui/501", str(plist)],
    ]
    assert plistlib.loads(plist.read_bytes())["Label"] == LAUNCHD_LABEL
    assert (tmp_path / "logs").is_dir()


def test_launchd_uninstall_boots_out_a_loaded_agent(tmp_path: Path) -> None:
    plist = tmp_path / f"{LAUNCHD_LABEL}.plist"
    plist.write_text("x")
    launchctl = Launchctl(loaded=True)
    report = service_manager.uninstall(ServiceKind.LAUNCHD, plist, 501, runner=launchctl)
    assert report.failed is None and report.removed == [plist] and not plist.exists()
    assert launchctl.calls == [["launchctl", "print", TARGET], ["launchctl", "bootout", TARGET]]


def test_launchd_uninstall_of_an_agent_never_loaded_just_removes_the_file(tmp_path: Path) -> None:
    plist = tmp_path / f"{LAUNCHD_LABEL}.plist"
    plist.write_text("x")
    launchctl = Launchctl(loaded=False)
    report = service_manager.uninstall(ServiceKind.LAUNCHD, plist, 501, runner=launchctl)
    assert report.failed is None and report.removed == [plist]
    assert launchctl.calls == [["launchctl", "print", TARGET]]


def test_launchd_query_reads_state_and_pid(tmp_path: Path) -> None:
    assert service_manager.query(
        ServiceKind.LAUNCHD, tmp_path, 501, runner=Launchctl(loaded=True)
    ) == ServiceState(loaded=True, running=True, pid=9, detail="running")
    not_loaded = service_manager.query(ServiceKind.LAUNCHD, tmp_path, 501, runner=Launchctl(loaded=False))
    assert isinstance(not_loaded, ServiceState) and not not_loaded.loaded


def test_run_command_turns_every_failure_into_an_outcome() -> None:
    missing = run_command(["no-such-service-manager-xyz", "--user"])
    assert (missing.ok, missing.returncode, missing.output) == (
        False,
        None,
        "no-such-service-manager-xyz: command not found",
    )
    failed = run_command(["sh", "-c", "echo out; echo why >&2; exit 4"])
    assert (failed.ok, failed.returncode, failed.output) == (False, 4, "why")
    slow = run_command(["sleep", "5"], timeout_s=0.2)
    assert (slow.returncode, slow.output) == (None, "no answer within 0.2s")
    assert run_command(["sh", "-c", "echo fine"]).output == "fine"
