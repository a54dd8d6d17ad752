"""`vancetope-agent status` against a real brain and a real agent process, as on a workstation:
the agent reads its enrolled credential from a 0600 credential_file, logs to --log-file, and
status (a separate process, with the config only) says running/connected/enrolled, then not
running after a clean stop, then not enrolled once the operator revoked it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from brain.runtime.enrollment import revoke
from tests.conftest import ROOT

pytestmark = pytest.mark.integration

CID = "laptop"


def status(config: Path, home: Path) -> tuple[int, dict[str, Any]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VANCETOPE_", "XDG_"))}
    env.update(HOME=str(home), PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-m", "client_agent", "status", "--config", str(config), "--json"],
        check=False, cwd=home, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.stdout.strip(), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def status_until(config: Path, home: Path, code: int, timeout: float = 120.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    last: tuple[int, dict[str, Any]] = (-1, {})
    while time.monotonic() < deadline:
        last = status(config, home)
        if last[0] == code:
            return last[1]
        time.sleep(0.5)
    raise AssertionError(f"status did not exit {code} within {timeout}s; last: {last}")


def test_status_follows_a_real_agent_from_connected_to_stopped_to_revoked(
    tmp_path: Path, stack_factory: Any, brain_factory: Any
) -> None:
    home = tmp_path / "home"
    (home / "sandbox").mkdir(parents=True)
    config = home / "agent.toml"
    config.write_text(
        f'[agent]\nclient_id = "{CID}"\nuser = "ada"\ncredential_file = "laptop.credential"\n'
        'sandbox_roots = ["sandbox"]\nheartbeat_interval_s = 0.5\nheartbeat_ttl_s = 3.0\n'
    )
    stack = stack_factory(services=("brain",), agent_config=config)  # enrolls laptop; does not run it
    credential = home / "laptop.credential"
    credential.write_text(f"VANCETOPE_AGENT_BROKER_URL={stack.agent_url}\n")
    credential.chmod(0o600)
    log = home / "logs" / "agent.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("VANCETOPE_")}
    stderr = tmp_path / "agent.stderr"  # with --log-file, only what comes before logging starts
    with stderr.open("wb") as out:
        agent = subprocess.Popen(
            [sys.executable, "-m", "client_agent", "run", "--config", str(config), "--log-file", str(log)],
            cwd="/", env={**env, "PYTHONPATH": str(ROOT)}, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        up = status_until(config, home, 0)
        assert (up["running"], up["connected"], up["enrolled"], up["pid"]) == (True, True, True, agent.pid)
        assert up["summary"] == "running, connected and enrolled"
        assert up["service"]["installed"] is False and up["log_file"] == str(log)
        text = log.read_text()
        assert f"client agent {CID} (user ada" in text and "the brain accepted the announcement" in text
        assert stderr.read_text() == ""  # everything went to the log file

        agent.send_signal(signal.SIGTERM)
        assert agent.wait(120) == 0
        stopped = status_until(config, home, 4)
        assert (stopped["running"], stopped["connected"], stopped["enrolled"]) == (False, False, True)

        assert revoke(brain_factory(stack).clients, CID)
        revoked = status_until(config, home, 3)
        assert revoked["enrolled"] is False and "not enrolled or revoked" in revoked["enrollment"]
        assert revoked["summary"] == "not enrolled or revoked"
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait(10)
        print(f"--- agent stderr ---\n{stderr.read_text(errors='replace')}")
