"""`vancetope-agent install` / `uninstall` as real subprocesses in a temporary HOME.

systemctl is never the machine's own: PATH holds either no systemctl (as on a machine without
systemd), one that fails like a container without a user bus, or one that records its
arguments and succeeds. So these tests never touch the real user's services.
"""

from __future__ import annotations

import configparser
import json
import os
import shlex
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the systemd path (Linux)")

UNIT = "vancetope-agent.service"
NO_BUS = "Failed to connect to bus: No medium found"


@dataclass
class Workstation:
    home: Path
    bin: Path
    config: Path
    calls: Path

    @property
    def unit(self) -> Path:
        return self.home / ".config" / "systemd" / "user" / UNIT

    @property
    def log(self) -> Path:
        return self.home / ".local" / "state" / "vancetope" / "agent-box.log"

    def systemctl(self, script: str) -> None:
        path = self.bin / "systemctl"
        path.write_text(f'#!/bin/sh\necho "$*" >> {shlex.quote(str(self.calls))}\n{script}\n')
        path.chmod(0o755)

    def called(self) -> list[str]:
        return self.calls.read_text().splitlines() if self.calls.exists() else []

    def cli(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        environ = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "VANCETOPE_AGENT_"))}
        environ.update(HOME=str(self.home), PATH=str(self.bin), PYTHONPATH=str(ROOT), **env)
        return subprocess.run(
            [sys.executable, "-m", "client_agent", *args],
            check=False, cwd=self.home, env=environ, capture_output=True, text=True, timeout=60,
        )  # fmt: skip


@pytest.fixture
def ws(tmp_path: Path) -> Workstation:
    home = tmp_path / "home"
    (home / "vt").mkdir(parents=True)
    (tmp_path / "bin").mkdir()
    credential = home / "vt" / "box.credential"
    credential.write_text("VANCETOPE_AGENT_BROKER_URL=redis://vtc-box:s3cret@127.0.0.1:1/0\n")
    credential.chmod(0o600)
    config = home / "vt" / "agent.toml"
    config.write_text('[agent]\nclient_id = "box"\nuser = "ada"\ncredential_file = "box.credential"\n')
    return Workstation(home, tmp_path / "bin", config, tmp_path / "calls")


def exec_start(unit: Path) -> list[str]:
    parser = configparser.ConfigParser(interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(unit.read_text())
    return shlex.split(parser["Service"]["ExecStart"])


def test_install_without_systemctl_writes_the_unit_and_says_what_to_run(ws: Workstation) -> None:
    proc = ws.cli("install", "--config", str(ws.config))
    assert proc.returncode == 5, proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"wrote {ws.unit}" in proc.stdout
    assert "ran systemctl --user daemon-reload: failed: systemctl: command not found" in proc.stdout
    assert "could not enable the service: systemctl --user cannot be used here" in proc.stderr
    assert (
        "systemctl --user daemon-reload && systemctl --user enable vancetope-agent.service"
        " && systemctl --user restart vancetope-agent.service"
    ) in proc.stderr
    # The absolute interpreter this CLI runs on (not resolved: a venv stays a venv) and config.
    assert exec_start(ws.unit) == [
        str(Path(sys.executable).absolute()), "-m", "client_agent", "run",
        "--config", str(ws.config), "--log-file", str(ws.log),
    ]  # fmt: skip
    assert ws.log.parent.is_dir()
    assert stat.S_IMODE(ws.unit.stat().st_mode) == 0o644


def test_install_without_a_user_bus_says_so_and_keeps_the_unit(ws: Workstation) -> None:
    ws.systemctl(f"echo '{NO_BUS}' >&2; exit 1")
    proc = ws.cli("install", "--config", str(ws.config))
    assert proc.returncode == 5 and "Traceback" not in proc.stderr
    assert f"ran systemctl --user daemon-reload: failed: {NO_BUS}" in proc.stdout
    assert NO_BUS in proc.stderr and "loginctl enable-linger" in proc.stderr
    assert ws.unit.is_file() and ws.called() == ["--user daemon-reload"]


def test_install_enables_and_starts_then_uninstall_stops_and_removes(ws: Workstation) -> None:
    ws.systemctl("exit 0")
    proc = ws.cli("install", "--config", str(ws.config))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert ws.called() == ["--user daemon-reload", f"--user enable {UNIT}", f"--user restart {UNIT}"]
    assert f"ran systemctl --user enable {UNIT}: ok" in proc.stdout
    assert f"log: {ws.log}" in proc.stdout and f"vancetope-agent status --config {ws.config}" in proc.stdout

    ws.calls.unlink()
    proc = ws.cli("uninstall")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert ws.called() == [f"--user disable --now {UNIT}", "--user daemon-reload"]
    assert not ws.unit.exists() and f"removed {ws.unit}" in proc.stdout
    assert (
        f"left in place (delete them if this workstation is done with the agent): {ws.config}, {ws.log}"
        in (proc.stdout)
    )


def test_install_no_start_only_enables(ws: Workstation) -> None:
    ws.systemctl("exit 0")
    proc = ws.cli("install", "--config", str(ws.config), "--no-start")
    assert proc.returncode == 0 and "not started now (--no-start)" in proc.stdout
    assert ws.called() == ["--user daemon-reload", f"--user enable {UNIT}"]


def test_install_honours_xdg_config_home_and_the_configs_log_file(ws: Workstation) -> None:
    ws.systemctl("exit 0")
    with ws.config.open("a") as out:
        out.write('log_file = "logs/agent.log"\n')
    proc = ws.cli("install", "--config", str(ws.config), XDG_CONFIG_HOME=str(ws.home / "cfg"))
    assert proc.returncode == 0, proc.stderr
    unit = ws.home / "cfg" / "systemd" / "user" / UNIT
    assert exec_start(unit)[-1] == str(ws.config.parent / "logs" / "agent.log")
    assert not ws.unit.exists()


def test_dry_run_prints_the_unit_and_the_commands_and_writes_nothing(ws: Workstation) -> None:
    ws.systemctl("exit 0")
    proc = ws.cli("install", "--config", str(ws.config), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"# {ws.unit} (not written: --dry-run)\n")
    assert "ExecStart=" in proc.stdout and "Restart=on-failure" in proc.stdout
    assert proc.stdout.rstrip().endswith(f"systemctl --user restart {UNIT}")
    assert not ws.unit.exists() and ws.called() == [] and not ws.log.parent.exists()


def test_install_refuses_a_config_that_works_only_with_this_shells_variables(ws: Workstation) -> None:
    ws.config.write_text('[agent]\nclient_id = "box"\nuser = "ada"\n')
    proc = ws.cli(
        "install", "--config", str(ws.config), VANCETOPE_AGENT_BROKER_URL="redis://u:p@127.0.0.1:1/0"
    )
    assert proc.returncode == 2
    assert "error: this client has no credential: enroll it on the brain" in proc.stderr
    assert "the service does not see this shell's VANCETOPE_AGENT_* variables" in proc.stderr
    assert not ws.unit.exists()


@pytest.mark.parametrize("dry_run", [["--dry-run"], []], ids=["dry-run", "install"])
def test_install_refuses_a_broker_url_without_a_credential(ws: Workstation, dry_run: list[str]) -> None:
    # The example's placeholder: before, --dry-run accepted it and the service retried it for ever.
    ws.config.write_text(
        '[agent]\nclient_id = "box"\nuser = "ada"\nbroker_url = "redis://127.0.0.1:6379/0"\n'
    )
    proc = ws.cli("install", "--config", str(ws.config), *dry_run)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "error: this client has no credential: enroll it on the brain: vancetope clients enroll box "
        "--user ada --output box.credential, then set credential_file"
    )
    assert proc.stdout == "" and not ws.unit.exists() and ws.called() == []


def test_uninstall_with_nothing_installed_says_so(ws: Workstation) -> None:
    proc = ws.cli("uninstall")
    assert proc.returncode == 0 and f"nothing to remove: {ws.unit} does not exist" in proc.stdout


def test_uninstall_without_a_user_bus_removes_the_unit_and_its_enable_link(ws: Workstation) -> None:
    ws.cli("install", "--config", str(ws.config))
    wants = ws.unit.parent / "default.target.wants"
    wants.mkdir()
    (wants / UNIT).symlink_to(ws.unit)  # what a working `systemctl --user enable` had made
    ws.systemctl(f"echo '{NO_BUS}' >&2; exit 1")
    proc = ws.cli("uninstall")
    assert proc.returncode == 5 and "Traceback" not in proc.stderr
    assert not ws.unit.exists() and not (wants / UNIT).is_symlink()
    assert f"removed {wants / UNIT}" in proc.stdout
    assert f"systemctl --user stop {UNIT} && systemctl --user daemon-reload" in proc.stderr


SHOW_ACTIVE = (
    'case "$2" in show) printf "LoadState=loaded\\nActiveState=active\\nSubState=running\\n'
    'MainPID=4242\\nUnitFileState=enabled\\n";; esac; exit 0'
)


def test_status_reads_the_service_managers_view_of_the_installed_agent(ws: Workstation) -> None:
    ws.systemctl(SHOW_ACTIVE)
    assert ws.cli("install", "--config", str(ws.config)).returncode == 0
    proc = ws.cli("status", "--config", str(ws.config), "--json")
    status = json.loads(proc.stdout)
    # Active per systemd, but it never recorded a heartbeat here; its broker (port 1) is unreachable.
    assert proc.returncode == 1, proc.stdout
    assert (status["running"], status["pid"], status["connected"], status["enrolled"]) == (
        True,
        4242,
        False,
        None,
    )
    assert status["service"]["state"] == "active (running), enabled"
    assert status["enrollment"].startswith("unknown: cannot reach the broker")
    assert status["log_file"] == str(ws.log)
    text = ws.cli("status", "--config", str(ws.config))
    assert text.returncode == 1 and "  running:   yes, pid 4242" in text.stdout


def test_status_and_install_notice_a_service_installed_for_another_config(ws: Workstation) -> None:
    ws.systemctl(SHOW_ACTIVE)
    ws.cli("install", "--config", str(ws.config))
    other = ws.home / "other" / "agent.toml"
    other.parent.mkdir()
    other.write_text('[agent]\nclient_id = "box2"\nuser = "ada"\nbroker_url = "redis://u:p@127.0.0.1:1/0"\n')
    proc = ws.cli("status", "--config", str(other), "--json")
    status = json.loads(proc.stdout)
    assert proc.returncode == 4 and status["running"] is False
    assert status["service"]["error"] == f"it runs another config ({ws.config}), not this one"
    replaced = ws.cli("install", "--config", str(other), "--dry-run")
    assert f"note: {ws.unit} ran {ws.config}; it will run {other} instead" in replaced.stdout


@pytest.mark.parametrize(
    ("command", "codes"),
    [
        ("install", ["0 installed", "2 bad config", "5 the file is written"]),
        ("uninstall", ["0 removed", "5 the file is removed"]),
        (
            "status",
            ["0 running, connected", "1 running but not", "2 bad config", "3 not enrolled", "4 not running"],
        ),
        ("run", ["0 stopped", "2 bad config", "3 the broker refused"]),
    ],
)
def test_help_documents_the_exit_codes(ws: Workstation, command: str, codes: list[str]) -> None:
    proc = ws.cli(command, "--help")
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    assert all(code in text for code in codes), proc.stdout
