"""`--json` for scripts: `run` prints the final record, `status` the recent trees or one tree,
whole results included (the tables cut them to the terminal)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from brain.core.models import TaskState, TreeStatus
from tests.conftest import server_runs_started, tree, wait_for_tree, wait_until
from tests.integration.test_cli import vancetope

pytestmark = pytest.mark.integration

LONG = "x" * 500


def test_run_and_status_print_json_with_whole_results(tmp_path: Path) -> None:
    data = tmp_path / "data"
    tree_file = tmp_path / "t.yaml"
    tree_file.write_text(
        "id: js\ntasks:\n"
        f"  - {{id: long, tool: echo, args: {{value: {LONG}}}}}\n"
        "  - {id: up, tool: text_transform, depends_on: [long], args: {op: upper, text: '${tasks.long.result}'}}\n"
    )
    run = vancetope("run", str(tree_file), "--no-agent", "--json", "--timeout", "90", data=data)
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


class _HeldAnswer(BaseHTTPRequestHandler):
    """Answers a GET only once the test lets it go: a server call that runs until then."""

    release = threading.Event()
    asked = threading.Event()

    def do_GET(self) -> None:
        type(self).asked.set()
        type(self).release.wait(120)
        body = b"let go"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def held_url() -> Iterator[str]:
    _HeldAnswer.release, _HeldAnswer.asked = threading.Event(), threading.Event()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _HeldAnswer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        _HeldAnswer.release.set()
        server.shutdown()
        server.server_close()


def test_status_json_says_running_while_a_server_task_runs_and_done_after(
    stack_factory, brain_factory, held_url: str
) -> None:
    """The record says ``running`` once a pool worker began the run (``Store.begin_run``), not
    only the table's guess from Redis: scripts reading ``status --json`` see it too. The call
    runs until the test lets its HTTP answer go, however slow the machine."""
    stack = stack_factory(server_concurrency=1, http_allow=("127.0.0.1",))  # the test's own server
    brain = brain_factory(stack)
    rec = brain.scheduler.submit(
        tree(
            {
                "id": "held",
                "tasks": [
                    {
                        "id": "get",
                        "tool": "http_get",
                        "timeout_s": 300,
                        "args": {"url": held_url, "timeout_s": 300},
                    }
                ],
            }
        )
    )
    run_id = wait_until(lambda: server_runs_started(brain, rec.tree_id).get("get"), what="the run to begin")
    assert _HeldAnswer.asked.wait(120), "the worker never asked"
    data = stack.settings.data_dir
    during = json.loads(vancetope("status", rec.tree_id, "--json", data=data).stdout)
    got = during["tasks"][0]
    assert (got["state"], got["run_id"], got["deliveries"]) == ("running", run_id, 1)
    assert during["status"] == "running" and during["counts"] == {"running": 1}
    table = vancetope("status", rec.tree_id, data=data).stdout
    assert "running" in table and "queued_server" not in table
    _HeldAnswer.release.set()
    assert wait_for_tree(brain, rec.tree_id, timeout=120).status is TreeStatus.DONE
    after = json.loads(vancetope("status", rec.tree_id, "--json", data=data).stdout)
    assert after["tasks"][0]["state"] == "done" and after["counts"] == {"done": 1}
    task = brain.store.get_task(rec.tree_id, "get")
    assert task.state is TaskState.DONE and task.run_id == run_id and task.result["text"] == "let go"
