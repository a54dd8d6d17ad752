"""Issue 20, M5: a hostile server-side MCP server cannot read the stack's credentials from
environments.

A real stack (brain + server pool, the vault key in VANCETOPE_VAULT_KEY as compose would set
it) runs tests/fixtures/mcp_snoop_server.py, started twice: by the brain's discovery and by
a pool worker for a task. Each copy reads its own environment, its parent's
/proc/<ppid>/environ and /proc/<ppid>/maps, the Redis admin secret and the vault key file,
and reports. Nothing it reports outside the files holds a VANCETOPE_* variable, a Redis
password or the vault key; the parent's memory is closed to it unless it runs as root.
What a same-user server can still open (the 0600 files) is docs/security.md's to say.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from cryptography.fernet import Fernet

from brain.runtime.vault import Vault, load_keys
from brain.stack.embedded import EmbeddedStack
from brain.stack.redis_server import ADMIN_SECRET_FILE
from brain.store import open_store
from tests.conftest import FIXTURES, make_settings, tree, wait_for_tree, write_mcp_config
from workers.sandbox import choose

pytestmark = pytest.mark.integration

TOKEN = "snoop-own-token-5d1c8e2a"
# The stack's processes start in the repository: the settings file a server could read there.
CONFIG_FILE_PATH = Path.cwd() / "vancetope.toml"


def _password(url: str) -> str:
    password = urlsplit(url).password
    assert password, url
    return password


def test_a_server_side_mcp_server_finds_no_stack_credential_in_any_environment(
    tmp_path: Path, brain_factory: Any
) -> None:
    vault_key = Fernet.generate_key().decode()
    report = tmp_path / "snoop.jsonl"
    data = tmp_path / "data"
    admin_file = data / "redis" / ADMIN_SECRET_FILE
    mcp_config = write_mcp_config(
        tmp_path / "server-mcp.json",
        {
            "snoop": {
                "command": sys.executable,
                "args": [str(FIXTURES / "mcp_snoop_server.py")],
                "env": {
                    "SNOOP_REPORT": str(report),
                    "SNOOP_FILES": f"{admin_file}:{CONFIG_FILE_PATH}",
                    "SNOOP_WRITE": str(tmp_path / "server-mcp.json"),
                    "OWN_TOKEN": "${vault:OWN_TOKEN}",
                },
            }
        },
    )
    settings = make_settings(tmp_path, mcp_config=mcp_config, vault_key=vault_key)
    store = open_store(settings.store)
    try:
        Vault(store, load_keys(settings)).set("OWN_TOKEN", TOKEN)
    finally:
        store.close()
    stack = EmbeddedStack(settings, only=("brain", "server-pool")).start()
    try:
        brain = brain_factory(stack)
        record = brain.scheduler.submit(tree({"id": "snoop", "tasks": [{"id": "s", "tool": "snoop.snoop"}]}))
        assert wait_for_tree(brain, record.tree_id, 120).status.value == "done"
        (task,) = brain.store.get_tasks(record.tree_id)
        from_task: dict[str, Any] = task.result
        credentials = {
            "admin": _password(stack.redis_url),
            "brain": _password(stack.service_url("brain")),
            "pool": _password(stack.service_url("server-pool")),
            "vault key": vault_key,
        }
    finally:
        stack.stop()

    started = [json.loads(line) for line in report.read_text().splitlines()]
    assert len(started) >= 2, "the brain's discovery and the pool each start the server"
    assert {f["ppid"] for f in started} >= {from_task["ppid"]}
    for found in [*started, from_task]:
        # Its own environment: its configured env and the basics, nothing of the stack's.
        assert not [k for k in found["own_environ"] if k.startswith("VANCETOPE_")], found["own_environ"]
        assert found["own_environ"]["OWN_TOKEN"] in (TOKEN, "***")  # its own secret it does get
        # Its parent's initial environment: closed (not root), or blanked where it held them (root).
        parent = found["parent_environ"]
        if os.geteuid() != 0:
            assert parent[0].startswith("ERROR PermissionError"), parent
            assert found["parent_maps_readable"] is False
        # (Settings that are no credential, such as VANCETOPE_DATA_DIR, may stay.)
        assert not [e for e in parent if e.startswith(("VANCETOPE_REDIS_URL=", "VANCETOPE_VAULT_KEY="))], (
            parent
        )
        seen = json.dumps({k: v for k, v in found.items() if k != "files"})
        leaked = [name for name, value in credentials.items() if value in seen]
        assert leaked == [], f"the MCP server read {leaked} from an environment"
    assert admin_file.stat().st_mode & 0o777 == 0o600
    # In bubblewrap (mcp_sandbox = auto, where it runs) the data dir is an empty folder for it:
    # the admin secret, vault key and store do not exist there (workers.sandbox). Without
    # bubblewrap a server running as the stack's own user can still open them.
    sandboxed, _ = choose("auto", [data])
    if os.environ.get("VANCETOPE_TEST_REQUIRE_BWRAP") == "1":
        assert sandboxed is not None, "bubblewrap must run here (CI installs it)"
    for found in [*started, from_task]:
        read = found["files"][str(admin_file)]
        if sandboxed is not None:
            assert read.startswith("ERROR FileNotFoundError"), read
            assert credentials["admin"] not in read
            # vancetope.toml (settings, maybe credentials) cannot be read (a /dev/null over it),
            # and the mcpServers file, whose env names ${vault:...}, cannot be rewritten
            assert found["files"][str(CONFIG_FILE_PATH)].startswith("ERROR"), found["files"]
            assert found["writable"] == {str(tmp_path / "server-mcp.json"): False}
        else:
            assert credentials["admin"] in read
