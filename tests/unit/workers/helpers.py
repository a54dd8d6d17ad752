"""Helpers for the workers tests: paths of the MCP fixtures, config building, port polling."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from workers.mcp_config import MCPConfig, parse_mcp_config

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
DEMO_SERVER = str(FIXTURES / "mcp_demo_server.py")
CRASH_SERVER = str(FIXTURES / "mcp_crash_server.py")
BUSY_SERVER = str(FIXTURES / "mcp_busy_server.py")


def stdio(script_or_module: str, *args: str) -> dict[str, Any]:
    """An mcpServers entry running this interpreter (a script path, or ``-m module``)."""
    return {"command": sys.executable, "args": [script_or_module, *args]}


def make_config(servers: dict[str, dict[str, Any]]) -> MCPConfig:
    return parse_mcp_config(json.dumps({"mcpServers": servers}), "test-mcp.json")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, proc: subprocess.Popen[bytes], deadline_s: float) -> None:
    """Poll until the port accepts connections; bounded, and fails fast if the process died."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before listening on {port}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listened on port {port} within {deadline_s:g}s")


@contextmanager
def http_server(log_dir: Path, script: str, *rest: str) -> Iterator[str]:
    """An MCP fixture server over streamable HTTP (uvicorn in a subprocess on a free port,
    ``script http PORT *rest``, its output in ``log_dir``): its URL while it runs."""
    port = free_port()
    with (log_dir / f"{Path(script).stem}-{port}.log").open("wb") as log:
        proc = subprocess.Popen([sys.executable, script, "http", str(port), *rest], stdout=log, stderr=log)
        try:
            wait_for_port(port, proc, deadline_s=20)
            yield f"http://127.0.0.1:{port}/mcp"
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
