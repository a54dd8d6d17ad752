"""`--json` for scripts: `run` prints the final record, `status` the recent trees or one tree,
whole results included (the tables cut them to the terminal)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.test_cli import vancetope

pytestmark = pytest.mark.integration

LONG = "x" * 500


def test_run_and_status_print_json_with_whole_results(tmp_path: Path) -> None:
    data = tmp_path / "data"
    tree = tmp_path / "t.yaml"
    tree.write_text(
        "id: js\ntasks:\n"
        f"  - {{id: long, tool: echo, args: {{value: {LONG}}}}}\n"
        "  - {id: up, tool: text_transform, depends_on: [long], args: {op: upper, text: '${tasks.long.result}'}}\n"
    )
    run = vancetope("run", str(tree), "--no-agent", "--json", "--timeout", "90", data=data)
    assert run.returncode == 0, run.stderr
    final = json.loads(run.stdout)  # stdout is the JSON and nothing else
    assert final["status"] == "done" and final["name"] == "js" and final["counts"] == {"done": 2}
    by_id = {t["task_id"]: t for t in final["tasks"]}
    assert by_id["long"]["result"] == LONG and by_id["up"]["result"] == LONG.upper()
    assert by_id["up"]["state"] == "done" and by_id["up"]["route"].startswith("server")

    one = vancetope("status", final["tree_id"], "--json", data=data)
    assert one.returncode == 0 and json.loads(one.stdout) == final
    recent = json.loads(vancetope("status", "--json", data=data).stdout)
    assert [t["tree_id"] for t in recent] == [final["tree_id"]]
    assert "tasks" not in recent[0] and recent[0]["counts"] == {"done": 2}
