"""Issue 12 items 1-3: a secret set with `vancetope secrets set` reaches a server-side MCP server
(and an http_get header) through ${vault:NAME}, and no plaintext copy of it is left anywhere:
not in the SQLite file, the Redis data files, the logs, the messages or any --json output."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from brain.runtime.service import Brain
from brain.stack.embedded import EmbeddedStack
from brain.stack.flowerauth import flower_access
from brain.stack.redis_server import free_port
from tests.conftest import FIXTURES, ROOT, make_settings, tree, wait_for_tree, wait_until, write_mcp_config
from tests.integration.test_flower import fetch

pytestmark = pytest.mark.integration

CANARY = "canary-7f3a9c1e-do-not-leak"


class _EchoAuthorization(http.server.BaseHTTPRequestHandler):
    seen: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        header = self.headers.get("Authorization", "")
        self.seen.append(header)
        body = f"you sent: {header}".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def echo_server() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _EchoAuthorization)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def secrets_cli(data: Path, *args: str, value: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: PLW1510 - callers assert on returncode
        [sys.executable, "-m", "brain", "secrets", *args],
        cwd=ROOT,
        input=value,
        capture_output=True,
        text=True,
        timeout=120,
        env={**_env(), "VANCETOPE_DATA_DIR": str(data)},
    )


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("VANCETOPE_")}


def status_json(tree_id: str, data: Path) -> str:
    """What ``vancetope status TREE --json`` prints for the stack with its data in ``data``."""
    return subprocess.run(
        [sys.executable, "-m", "brain", "status", tree_id, "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**_env(), "VANCETOPE_DATA_DIR": str(data)},
        check=True,
    ).stdout


def test_a_vault_secret_reaches_its_server_and_is_nowhere_in_plaintext(
    tmp_path: Path, echo_server: int, brain_factory: Any
) -> None:
    data = tmp_path / "data"
    stored = secrets_cli(data, "set", "CANARY", value=CANARY)
    assert stored.returncode == 0, stored.stderr
    assert CANARY not in stored.stdout + stored.stderr
    listed = secrets_cli(data, "list", "--json")
    assert [s["name"] for s in json.loads(listed.stdout)] == ["CANARY"] and CANARY not in listed.stdout

    demo = [str(FIXTURES / "mcp_secret_server.py")]
    mcp_config = write_mcp_config(
        tmp_path / "server-mcp.json",
        {
            "vaulted": {
                "command": sys.executable,
                "args": demo,  # a ${vault:...} here is refused (tests/security/test_secrets_argv.py)
                "env": {"DEMO_TOKEN": "${vault:CANARY}"},
            },
            "missing": {"command": sys.executable, "args": demo, "env": {"T": "${vault:NOT_SET}"}},
        },
    )
    settings = make_settings(
        tmp_path,
        mcp_config=mcp_config,
        http_allow=("127.0.0.1",),
        http_headers={f"http://127.0.0.1:{echo_server}": {"Authorization": "Bearer ${vault:CANARY}"}},
    )
    stack = EmbeddedStack(settings, only=("brain", "server-pool")).start()
    try:
        flower_port = free_port()
        stack.start_flower(
            flower_port,
            flower_access("127.0.0.1", settings.data_dir, env={"FLOWER_BASIC_AUTH": "op:pw-1234"}),
        )
        brain: Brain = brain_factory(stack)

        def flower_listening() -> bool:
            # Flower subscribes to events a moment after it answers: wait until it has heard the
            # pool's heartbeats, so it sees every task event of the tree.
            page = json.loads(
                fetch(f"http://127.0.0.1:{flower_port}/workers?json=1", ("op", "pw-1234"))[1] or b"{}"
            )
            return any(str(w.get("hostname", "")).startswith("server@") for w in page.get("data", []))

        wait_until(flower_listening, timeout=120, what="Flower to hear the server pool")
        # The server that refers to a secret nobody set failed to start, saying which reference.
        failures = {f.server: f.message for f in brain.scheduler.registry.mcp_failures}
        assert (
            "${vault:NOT_SET}" in failures["missing"]
            and "no secret 'NOT_SET' in the vault" in failures["missing"]
        )
        record = brain.scheduler.submit(
            tree(
                {
                    "id": "vault",
                    "tasks": [
                        {"id": "env", "tool": "vaulted.env", "args": {"name": "DEMO_TOKEN"}},
                        {"id": "argv", "tool": "vaulted.argv", "args": {}},
                        {"id": "leak", "tool": "vaulted.leak", "args": {"name": "DEMO_TOKEN"}},
                        {
                            "id": "http",
                            "tool": "http_get",
                            "args": {"url": f"http://127.0.0.1:{echo_server}/"},
                        },
                    ],
                }
            )
        )
        assert wait_for_tree(brain, record.tree_id, 120).status.value == "failed"  # `leak` fails on purpose
        tasks = {t.task_id: t for t in brain.store.get_tasks(record.tree_id)}
        # The server got the value (the result *is* the secret, so it comes back masked whole) ...
        assert tasks["env"].result == "***", tasks["env"]
        assert tasks["argv"].result == [], tasks["argv"]  # nothing secret on its command line
        # ... so did the HTTP server, and the echo of it is masked too.
        assert _EchoAuthorization.seen[-1] == f"Bearer {CANARY}"
        assert tasks["http"].result["text"] == "you sent: Bearer ***", tasks["http"]
        assert tasks["leak"].state.value == "failed"
        assert "failed while holding ***" in tasks["leak"].error.message, tasks["leak"].error

        shown = status_json(record.tree_id, data)
        assert "***" in shown and CANARY not in shown

        # Flower saw every task (its events) and shows no copy either.
        def flower_tasks() -> bytes:
            status, body = fetch(f"http://127.0.0.1:{flower_port}/api/tasks", ("op", "pw-1234"))
            return body if status == 200 and b'"leak(name)"' in body else b""

        seen_by_flower = wait_until(flower_tasks, timeout=120, what="Flower to list the tree's tasks")
        assert CANARY.encode() not in seen_by_flower
    finally:
        stack.stop()

    # At rest: the store, Redis's AOF and the logs hold no copy.
    leaks = [
        str(path)
        for path in sorted(data.rglob("*"))
        if path.is_file() and CANARY.encode() in path.read_bytes()
    ]
    assert leaks == [], f"the canary is in plaintext in {leaks}"
    assert (data / "vault.key").stat().st_mode & 0o777 == 0o600
    assert list((data / "redis").rglob("*.aof*")) or list((data / "redis").rglob("appendonly*")), (
        "no AOF looked at"
    )
    assert any((data / "logs").iterdir())


def test_a_copied_ciphertext_does_not_decrypt_under_another_name(tmp_path: Path) -> None:
    from brain.runtime.vault import Vault, VaultError, load_keys
    from brain.store import open_store

    settings = make_settings(tmp_path)
    store = open_store(settings.store)
    try:
        vault = Vault(store, load_keys(settings, create=True))
        vault.set("A", "value-of-a")
        vault.set("B", "value-of-b")
        a = store.get_secret("A")
        assert a is not None
        store.put_secret(a.model_copy(update={"name": "B"}))  # an attacker with store access swaps them
        with pytest.raises(VaultError, match="holds the ciphertext of another secret"):
            vault.get("B")
        assert vault.get("A") == "value-of-a"
    finally:
        store.close()
