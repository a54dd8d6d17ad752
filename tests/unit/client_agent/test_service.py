"""The login service, decided purely: the systemd unit and launchd plist texts, where they go,
which commands enable/stop/query them, and how their answers are read."""

from __future__ import annotations

import configparser
import os
import plistlib
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from client_agent.service import (
    LAUNCHD_LABEL,
    SYSTEMD_UNIT,
    ServiceKind,
    ServiceSpec,
    default_log_file,
    install_commands,
    option_value,
    parse_launchctl_print,
    parse_systemctl_show,
    prepare_commands,
    program_of,
    render_launchd_plist,
    render_systemd_unit,
    service_file,
    service_kind,
    stderr_file,
    stop_commands,
    systemd_quote,
)

HOME = Path("/home/ada")
SPEC = ServiceSpec(
    python=Path("/home/ada/venv/bin/python"),
    config=Path("/home/ada/vancetope/agent.toml"),
    log_file=Path("/home/ada/.local/state/vancetope/agent-laptop.log"),
    working_dir=Path("/home/ada/vancetope"),
    client_id="laptop",
)
PROGRAM = ["/home/ada/venv/bin/python", "-m", "client_agent", "run",
           "--config", "/home/ada/vancetope/agent.toml",
           "--log-file", "/home/ada/.local/state/vancetope/agent-laptop.log"]  # fmt: skip


def parse_unit(text: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=True)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # systemd keys are case-sensitive
    parser.read_string(text)
    return parser


@pytest.mark.parametrize(
    ("platform", "kind"),
    [("linux", ServiceKind.SYSTEMD), ("darwin", ServiceKind.LAUNCHD), ("win32", None), ("freebsd14", None)],
)
def test_service_kind_follows_the_platform(platform: str, kind: ServiceKind | None) -> None:
    assert service_kind(platform) is kind


@pytest.mark.parametrize(
    ("kind", "env", "expected"),
    [
        (ServiceKind.SYSTEMD, {}, HOME / ".config/systemd/user/vancetope-agent.service"),
        (ServiceKind.SYSTEMD, {"XDG_CONFIG_HOME": "/cfg"}, Path("/cfg/systemd/user/vancetope-agent.service")),
        # The XDG spec: a relative value is invalid and ignored.
        (
            ServiceKind.SYSTEMD,
            {"XDG_CONFIG_HOME": "cfg"},
            HOME / ".config/systemd/user/vancetope-agent.service",
        ),
        (
            ServiceKind.LAUNCHD,
            {"XDG_CONFIG_HOME": "/cfg"},
            HOME / "Library/LaunchAgents/org.vancetope.agent.plist",
        ),
    ],
)
def test_service_file_goes_where_the_service_manager_looks(
    kind: ServiceKind, env: dict[str, str], expected: Path
) -> None:
    assert service_file(kind, HOME, env) == expected


@pytest.mark.parametrize(
    ("kind", "env", "expected"),
    [
        (ServiceKind.SYSTEMD, {}, HOME / ".local/state/vancetope/agent-laptop.log"),
        (ServiceKind.SYSTEMD, {"XDG_STATE_HOME": "/st"}, Path("/st/vancetope/agent-laptop.log")),
        (ServiceKind.LAUNCHD, {}, HOME / "Library/Logs/vancetope/agent-laptop.log"),
    ],
)
def test_default_log_file_is_the_platforms_place_for_logs(
    kind: ServiceKind, env: dict[str, str], expected: Path
) -> None:
    assert default_log_file(kind, HOME, env, "laptop") == expected


def test_systemd_unit_runs_the_agent_at_login_and_restarts_it_on_failure_only() -> None:
    unit = parse_unit(render_systemd_unit(SPEC))
    assert unit.sections() == ["Unit", "Service", "Install"]
    service = dict(unit["Service"])
    assert shlex.split(service.pop("ExecStart")) == PROGRAM
    assert service == {
        "Type": "exec",
        "WorkingDirectory": "/home/ada/vancetope",
        "Environment": "PYTHONUNBUFFERED=1",
        "Restart": "on-failure",
        "RestartSec": "5",
        "RestartSteps": "10",
        "RestartMaxDelaySec": "300",
        "RestartPreventExitStatus": "2 3",
        "TimeoutStopSec": "60",
    }
    assert unit["Unit"]["Description"] == "Vancetope client agent laptop"
    assert unit["Unit"]["StartLimitIntervalSec"] == "0"
    assert dict(unit["Install"]) == {"WantedBy": "default.target"}


@pytest.mark.parametrize(
    ("arg", "word"),
    [
        ("/usr/bin/python3", "/usr/bin/python3"),
        ("/home/a b/agent.toml", '"/home/a b/agent.toml"'),
        ("/x/100%/a", "/x/100%%/a"),
        ("/x/$HOME", "/x/$$HOME"),
        ('/x/"q"', '"/x/\\"q\\""'),
        ("/x/back\\slash", '"/x/back\\\\slash"'),
        ("", '""'),
    ],
)
def test_systemd_quote_keeps_each_argument_one_literal_word(arg: str, word: str) -> None:
    assert systemd_quote(arg) == word


def test_a_path_with_spaces_and_specifiers_survives_the_unit() -> None:
    odd = ServiceSpec(
        python=Path("/Users/a b/venv/bin/python"), config=Path("/tmp/50% off/$agent.toml"),
        log_file=Path("/tmp/log dir/a.log"), working_dir=Path("/tmp/50% off"), client_id="laptop",
    )  # fmt: skip
    text = render_systemd_unit(odd)
    assert program_of(ServiceKind.SYSTEMD, text) == odd.program()
    assert option_value(odd.program(), "--config") == "/tmp/50% off/$agent.toml"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_verify_accepts_the_unit(tmp_path: Path) -> None:
    python = shutil.which("python3") or "/usr/bin/python3"
    spec = ServiceSpec(Path(python), tmp_path / "agent.toml", tmp_path / "agent.log", tmp_path, "laptop")
    unit = tmp_path / SYSTEMD_UNIT
    unit.write_text(render_systemd_unit(spec))
    runtime = tmp_path / "run"  # a --user manager needs one; containers have none
    runtime.mkdir(mode=0o700)
    proc = subprocess.run(
        ["systemd-analyze", "--user", "verify", str(unit)], check=False, capture_output=True, text=True,
        timeout=60, env={**os.environ, "XDG_RUNTIME_DIR": str(runtime)},
    )  # fmt: skip
    # systemd < 254 does not know the backoff keys (it ignores them, and says so); nothing else may show.
    problems = [
        line for line in (proc.stdout + proc.stderr).splitlines()
        if line.strip() and not any(f"Unknown key '{key}'" in line for key in ("RestartSteps", "RestartMaxDelaySec"))
    ]  # fmt: skip
    assert proc.returncode == 0 and not problems, proc.stdout + proc.stderr


def test_launchd_plist_runs_the_agent_at_load_and_keeps_it_alive_after_a_crash() -> None:
    plist = plistlib.loads(render_launchd_plist(SPEC).encode())
    assert plist == {
        "Label": LAUNCHD_LABEL,
        "ProgramArguments": PROGRAM,
        "WorkingDirectory": "/home/ada/vancetope",
        "EnvironmentVariables": {"PYTHONUNBUFFERED": "1"},
        "RunAtLoad": True,
        "KeepAlive": {"SuccessfulExit": False},
        "ThrottleInterval": 10,
        "ProcessType": "Background",
        "StandardOutPath": "/home/ada/.local/state/vancetope/agent-laptop.stderr.log",
        "StandardErrorPath": "/home/ada/.local/state/vancetope/agent-laptop.stderr.log",
    }
    assert stderr_file(SPEC.log_file).name == "agent-laptop.stderr.log"
    assert program_of(ServiceKind.LAUNCHD, render_launchd_plist(SPEC)) == PROGRAM


@pytest.mark.parametrize(
    ("kind", "start", "expected"),
    [
        (ServiceKind.SYSTEMD, True, [
            ["systemctl", "--user", "daemon-reload"],
            ["systemctl", "--user", "enable", "vancetope-agent.service"],
            ["systemctl", "--user", "restart", "vancetope-agent.service"],
        ]),
        (ServiceKind.SYSTEMD, False, [
            ["systemctl", "--user", "daemon-reload"],
            ["systemctl", "--user", "enable", "vancetope-agent.service"],
        ]),
        (ServiceKind.LAUNCHD, True, [
            ["launchctl", "enable", "gui/501/org.vancetope.agent"],
            ["launchctl", "bootstrap", "gui/501", "/p.plist"],
        ]),
        (ServiceKind.LAUNCHD, False, []),
    ],
)  # fmt: skip
def test_install_commands_enable_and_start_the_service(
    kind: ServiceKind, start: bool, expected: list[list[str]]
) -> None:
    assert install_commands(kind, Path("/p.plist"), 501, start) == expected


def test_launchd_is_unloaded_first_so_a_reinstall_can_bootstrap_again() -> None:
    assert prepare_commands(ServiceKind.LAUNCHD, 501, True) == [
        ["launchctl", "bootout", "gui/501/org.vancetope.agent"]
    ]
    assert prepare_commands(ServiceKind.SYSTEMD, 501, True) == []
    assert stop_commands(ServiceKind.SYSTEMD, 501) == [
        ["systemctl", "--user", "disable", "--now", SYSTEMD_UNIT]
    ]


@pytest.mark.parametrize(
    ("text", "loaded", "running", "pid", "detail"),
    [
        ("LoadState=loaded\nActiveState=active\nSubState=running\nMainPID=4242\nUnitFileState=enabled\n",
         True, True, 4242, "active (running), enabled"),
        ("LoadState=loaded\nActiveState=activating\nSubState=auto-restart\nMainPID=0\nUnitFileState=enabled\n",
         True, False, None, "activating (auto-restart), enabled"),
        ("LoadState=not-found\nActiveState=inactive\nSubState=dead\nMainPID=0\nUnitFileState=\n",
         False, False, None, "inactive (dead), "),
    ],
)  # fmt: skip
def test_systemctl_show_is_read_into_a_state(
    text: str, loaded: bool, running: bool, pid: int | None, detail: str
) -> None:
    state = parse_systemctl_show(text)
    assert (state.loaded, state.running, state.pid, state.detail) == (loaded, running, pid, detail)


def test_launchctl_print_is_read_into_a_state() -> None:
    text = (
        "gui/501/org.vancetope.agent = {\n\tactive count = 1\n\tpath = /Users/a/Library/LaunchAgents/x.plist\n"
        "\tstate = running\n\n\tprogram = /Users/a/venv/bin/python\n\tpid = 812\n\tlast exit code = 1\n"
        "\tendpoints = {\n\t\tstate = active\n\t}\n}\n"
    )
    state = parse_launchctl_print(text)
    assert (state.running, state.pid, state.detail) == (True, 812, "running, last exit code 1")
    waiting = parse_launchctl_print("x = {\n\tstate = not running\n\tlast exit code = 3\n}\n")
    assert (waiting.running, waiting.pid) == (False, None)


def test_program_of_an_unreadable_file_is_empty() -> None:
    assert program_of(ServiceKind.LAUNCHD, "not a plist") == []
    assert program_of(ServiceKind.SYSTEMD, "[Service]\n") == []
    assert option_value(["--config"], "--config") is None
