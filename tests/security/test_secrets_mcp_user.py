"""Issue 20, M5: docs/security.md's way to run an untrusted server-side MCP server as another OS
user (a stack run as root, `setpriv` in the server's command) keeps it out of the stack's
files and memory.

The hostile server (tests/fixtures/mcp_stdlib_snoop_server.py, the system's python3, which
`nobody` may run) tries the Redis admin secret, the vault key file and its parent's
/proc/<ppid>/environ and maps: every one is refused. Needs root, setpriv and /usr/bin/python3
(CI has them); skipped elsewhere, where test_secrets_mcp_server.py covers the same-user case.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from brain.runtime.vault import key_file, load_keys
from brain.stack.embedded import EmbeddedStack
from brain.stack.redis_server import ADMIN_SECRET_FILE
from tests.conftest import FIXTURES, make_settings, tree, wait_for_tree, write_mcp_config

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        os.geteuid() != 0 or not shutil.which("setpriv") or not Path("/usr/bin/python3").exists(),
        reason="needs root, setpriv and /usr/bin/python3 to start a server as nobody",
    ),
]
NOBODY = 65534


def test_a_server_run_as_another_user_cannot_open_the_stacks_secrets(
    tmp_path: Path, brain_factory: Any
) -> None:
    data = tmp_path / "data"
    admin_file, vault_file = data / "redis" / ADMIN_SECRET_FILE, data / "vault.key"
    mcp_config = write_mcp_config(
        tmp_path / "server-mcp.json",
        {
            "untrusted": {
                "command": "setpriv",
                "args": [
                    f"--reuid={NOBODY}",
                    f"--regid={NOBODY}",
                    "--clear-groups",
                    "--",
                    "/usr/bin/python3",
                    str(FIXTURES / "mcp_stdlib_snoop_server.py"),
                ],
                "env": {"SNOOP_FILES": f"{admin_file}:{vault_file}"},
            }
        },
    )
    settings = make_settings(tmp_path, mcp_config=mcp_config)
    load_keys(settings, create=True)
    assert key_file(settings) == vault_file
    stack = EmbeddedStack(settings, only=("brain", "server-pool")).start()
    try:
        brain = brain_factory(stack)
        failures = {f.server: f.message for f in brain.scheduler.registry.mcp_failures}
        assert failures == {}, failures
        record = brain.scheduler.submit(tree({"id": "u", "tasks": [{"id": "s", "tool": "untrusted.snoop"}]}))
        assert wait_for_tree(brain, record.tree_id, 120).status.value == "done"
        (task,) = brain.store.get_tasks(record.tree_id)
    finally:
        stack.stop()
    found = json.loads(task.result) if isinstance(task.result, str) else task.result
    assert found["uid"] == NOBODY
    assert not [k for k in found["own_environ"] if k.startswith("VANCETOPE_")]
    assert found["parent_environ"][0].startswith("ERROR PermissionError"), found["parent_environ"][:3]
    assert found["parent_maps_readable"] is False
    for path in (admin_file, vault_file):
        assert found["files"][str(path)].startswith("ERROR PermissionError"), (
            path,
            found["files"][str(path)],
        )
