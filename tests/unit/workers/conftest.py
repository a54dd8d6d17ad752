"""Shared fixtures for the workers tests: real MCP servers (stdio and HTTP), no mocks."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.unit.workers.helpers import BUSY_SERVER, CRASH_SERVER, DEMO_SERVER, http_server, make_config, stdio
from workers.mcp_clients import MCPClientManager


@pytest.fixture(scope="session")
def demo_http_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The demo server over streamable HTTP."""
    with http_server(tmp_path_factory.mktemp("http"), DEMO_SERVER) as url:
        yield url


@pytest.fixture
def busy_http_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An HTTP server that answers its first tools/call 429 with Retry-After: 2."""
    with http_server(tmp_path_factory.mktemp("http"), BUSY_SERVER) as url:
        yield url


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
    mgr = MCPClientManager(config, start_timeout=60)
    yield mgr
    mgr.close()
