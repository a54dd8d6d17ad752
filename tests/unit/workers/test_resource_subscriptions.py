"""workers.mcp_clients subscribes upstream for the gateway and passes on what the server says
(issue 24), against real stdio MCP servers: the watched-files fixture (which declares
``resources.subscribe``) and the notes vault (which does not)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import wait_until
from tests.unit.workers.helpers import FIXTURES, make_config, stdio
from workers.contracts import ResourceUpdated
from workers.mcp_clients import MCPClientManager

WATCHED = str(FIXTURES / "mcp_watched_server.py")
VAULT = str(FIXTURES / "mcp_vault_server.py")


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    shelf = tmp_path / "shelf"
    shelf.mkdir()
    for stem in ("a", "b", "c"):
        (shelf / f"{stem}.txt").write_text(f"{stem}\n")
    (shelf / "n.md").write_text("# a note\n")
    return shelf


@pytest.fixture
def heard(folder: Path) -> Iterator[tuple[MCPClientManager, list[ResourceUpdated]]]:
    mgr = MCPClientManager(
        make_config({"shelf": stdio(WATCHED, str(folder)), "vault": stdio(VAULT, str(folder))})
    )
    got: list[ResourceUpdated] = []
    mgr.resource_sink = got.append
    try:
        yield mgr, got
    finally:
        mgr.close()


def change(path: Path) -> None:
    with path.open("a") as f:
        f.write("changed\n")


def server_pids(script: str) -> list[int]:
    """This process's children running ``script``."""
    found = []
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        for pid in (task / "children").read_text().split():
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if script.encode() in cmdline:
                found.append(int(pid))
    return found


def test_a_read_with_subscribe_subscribes_once_and_each_change_is_passed_on(
    heard: tuple[MCPClientManager, list[ResourceUpdated]], folder: Path
) -> None:
    mgr, got = heard
    read = mgr.surface_request(
        "shelf", "read_resource", {"uri": "watch://shelf/a", "subscribe": True}, timeout=60
    )
    assert read["contents"][0]["text"] == "a\n"
    mgr.surface_request("shelf", "read_resource", {"uri": "watch://shelf/a", "subscribe": True}, timeout=60)
    mgr.surface_request("shelf", "read_resource", {"uri": "watch://shelf/b", "subscribe": True}, timeout=60)
    # c is only read: its change is not heard. a's is, once (subscribed once): a second
    # notification of it would come before b's, which the server sends after.
    mgr.surface_request("shelf", "read_resource", {"uri": "watch://shelf/c"}, timeout=60)
    change(folder / "c.txt")
    change(folder / "a.txt")
    wait_until(lambda: got, 120, "the change of a")
    change(folder / "b.txt")
    wait_until(lambda: len(got) >= 2, 120, "the change of b")
    assert got == [ResourceUpdated(server="shelf", uri=f"watch://shelf/{s}") for s in ("a", "b")]


def test_a_server_that_cannot_subscribe_is_read_and_not_asked(
    heard: tuple[MCPClientManager, list[ResourceUpdated]],
) -> None:
    mgr, _ = heard
    read = mgr.surface_request("vault", "read_resource", {"uri": "note://n", "subscribe": True}, timeout=60)
    assert read["contents"][0]["text"] == "# a note\n"


def test_a_restarted_server_is_subscribed_again(
    heard: tuple[MCPClientManager, list[ResourceUpdated]], folder: Path
) -> None:
    mgr, got = heard
    mgr.surface_request("shelf", "read_resource", {"uri": "watch://shelf/a", "subscribe": True}, timeout=60)
    (before,) = server_pids(WATCHED)
    os.kill(before, signal.SIGKILL)
    # The next request meets the dead session, then a fresh one: it subscribes again.
    wait_until(
        lambda: _read_ok(mgr, "watch://shelf/b") and server_pids(WATCHED) not in ([], [before]),
        120,
        "a restarted server",
    )
    change(folder / "a.txt")
    wait_until(lambda: got, 120, "the change of a, heard through the new session")
    assert got == [ResourceUpdated(server="shelf", uri="watch://shelf/a")]


def _read_ok(mgr: MCPClientManager, uri: str) -> bool:
    try:
        mgr.surface_request("shelf", "read_resource", {"uri": uri}, timeout=60)
    except Exception:  # noqa: BLE001 - the dead session's failure; the next call restarts it
        return False
    return True
