"""`vancetope up` heals crashes (issue 8): real `up`, real services, real SIGKILLs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from brain.redis_server import free_port
from tests.conftest import EXAMPLES, ROOT, wait_until
from tests.integration.test_cli import vancetope

pytestmark = pytest.mark.integration


def stack_state(data: Path) -> dict[str, Any]:
    try:
        return dict(json.loads((data / "stack.json").read_text()))
    except (OSError, ValueError):
        return {}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@contextmanager
def running_up(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """`vancetope up` from the checkout (its vancetope.toml: registry, MCP servers, agent)."""
    data = tmp_path / "data"
    with open(tmp_path / "up.log", "w") as up_log:
        up = subprocess.Popen(
            [sys.executable, "-m", "brain", "up", *args],
            cwd=ROOT,
            env={**os.environ, "VANCETOPE_DATA_DIR": str(data), "COLUMNS": "250", **(env or {})},
            stdout=up_log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield up
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGINT)
            up.wait(60)


def up_log(tmp_path: Path) -> str:
    return " ".join((tmp_path / "up.log").read_text().split())


def test_up_restarts_every_service_killed_with_sigkill_and_a_tree_still_runs(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with running_up(tmp_path, "--flower-port", str(free_port())) as up:
        names = {"brain", "server-pool", "client-agent", "flower"}
        wait_until(
            lambda: set(stack_state(data).get("services", {})) == names,
            timeout=120,
            what="`vancetope up` to write stack.json with every service",
        )
        before = stack_state(data)["services"]
        for pid in before.values():
            os.kill(pid, signal.SIGKILL)

        def all_restarted() -> bool:
            now = stack_state(data).get("services", {})
            return all(now.get(name) not in (None, pid) and alive(now[name]) for name, pid in before.items())

        wait_until(all_restarted, timeout=90, what="every killed service to be running again with a new pid")
        run = vancetope(
            "run", str(EXAMPLES / "offline-client.yaml"), "--client", "laptop", "--timeout", "90", data=data
        )
        assert run.returncode == 0, run.stdout + run.stderr + up_log(tmp_path)
        assert up.poll() is None, up_log(tmp_path)
    log = up_log(tmp_path)
    for name in before:
        assert f"{name} exited with code -9; restarting it in 1s" in log, log
        assert f"{name} restarted (pid" in log
    assert up.returncode == 0, log
