"""Shared fixtures for the workers tests: real MCP servers (stdio and HTTP), no mocks."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.unit.workers.helpers import CRASH_SERVER, DEMO_SERVER, free_port, make_config, stdio, wait_for_port
from workers.mcp_clients import MCPClientManager


@pytest.fixture(scope="session")
def demo_http_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The demo server over streamable HTTP (uvicorn in a subprocess on a free port)."""
    port = free_port()
    log = (tmp_path_factory.mktemp("http") / "server.log").open("wb")
    proc = subprocess.Popen([sys.executable, DEMO_SERVER, "http", str(port)], stdout=log, stderr=log)
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
        log.close()


@pytest.fixture(scope="module")
def manager() -> Iterator[MCPClientManager]:
    """One long-lived manager per test module, like one per worker process."""
    config = make_config(
        {
            "demo": stdio(DEMO_SERVER),
            "time": stdio("-m", "mcp_server_time", "--local-timezone", "UTC"),
            "crash": stdio(CRASH_SERVER),
        }
    )
    mgr = MCPClientManager(config, start_timeout=20)
    yield mgr
    mgr.close()
