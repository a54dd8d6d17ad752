"""Issue 20, M2: a server that echoes its secret cut, reversed or encoded does not get it out.

Before, masking caught the exact value only: a server-side MCP server returning its token
truncated by one character, or reversed, had it stored in clear in the store and shown by
`status --json`. A real stack runs a server that returns eight variants of a vault secret;
each result is masked, and no variant is in the store's file, Redis's data or status --json.
"""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from brain.stack.embedded import EmbeddedStack
from tests.conftest import FIXTURES, make_settings, tree, wait_for_tree, write_mcp_config
from tests.integration.test_vault import secrets_cli, status_json

pytestmark = pytest.mark.integration

CANARY = "canary-0b7e2d94-never-in-clear"
RAW = CANARY.encode()
# What the fixture server returns for each variant (tests/fixtures/mcp_secret_server.py).
LEAKED = {
    "truncated": CANARY[:-1],
    "reversed": CANARY[::-1],
    "middle": CANARY[3:15],
    "hex": RAW.hex(),
    "HEX": RAW.hex().upper(),
    "base64": base64.b64encode(RAW).decode(),
    "base64url-nopad": base64.urlsafe_b64encode(RAW).decode().rstrip("="),
    "base64-in-blob": base64.b64encode(b'{"t":"' + RAW + b'"}').decode(),
}


def test_a_secret_echoed_cut_reversed_or_encoded_is_masked_everywhere(
    tmp_path: Path, brain_factory: Any
) -> None:
    data = tmp_path / "data"
    assert secrets_cli(data, "set", "CANARY", value=CANARY).returncode == 0
    mcp_config = write_mcp_config(
        tmp_path / "server-mcp.json",
        {
            "vaulted": {
                "command": sys.executable,
                "args": [str(FIXTURES / "mcp_secret_server.py")],
                "env": {"DEMO_TOKEN": "${vault:CANARY}"},
            }
        },
    )
    stack = EmbeddedStack(
        make_settings(tmp_path, mcp_config=mcp_config), only=("brain", "server-pool")
    ).start()
    try:
        brain = brain_factory(stack)
        tasks = [
            {"id": how, "tool": "vaulted.variant", "args": {"name": "DEMO_TOKEN", "how": how}}
            for how in LEAKED
        ]
        record = brain.scheduler.submit(tree({"id": "variants", "tasks": tasks}))
        assert wait_for_tree(brain, record.tree_id, 120).status.value == "done"
        results = {t.task_id: t.result for t in brain.store.get_tasks(record.tree_id)}
        assert set(results) == set(LEAKED)
        for how, value in results.items():
            assert "***" in value and LEAKED[how] not in value, (how, value)
        assert results["truncated"] == results["reversed"] == results["hex"] == results["base64"] == "***"
        printed = status_json(record.tree_id, data)
        shown = {t["task_id"]: t.get("result") for t in json.loads(printed)["tasks"]}
        assert shown == results
        assert not [how for how, leaked in LEAKED.items() if leaked in printed]
    finally:
        stack.stop()
    files = [path for path in sorted(data.rglob("*")) if path.is_file()]
    at_rest = [
        (str(path), how)
        for path in files
        for how, leaked in LEAKED.items()
        if leaked.encode() in path.read_bytes()
    ]
    assert at_rest == [], f"a variant of the canary is in plaintext: {at_rest}"
