"""brain.runtime.summary_sinks: a run summary written to its schedule's file (format by
extension, date in the schedule's zone) and POSTed to its webhook; a sink that fails is a line,
never an exception, and never shows the webhook's path (its secret)."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from brain.core.models import TreeStatus
from brain.core.schedules import Schedule
from brain.core.summary import RunSummary, SummaryCounts, SummaryKind, render_markdown
from brain.runtime.summary_sinks import deliver, summary_path, write_summary_file
from brain.stack.redis_server import free_port

# 2026-03-01 23:30 UTC: already 2 March in Tokyo, still 1 March in New York.
STARTED = 1772407800.0


def summary(kind: SummaryKind = SummaryKind.FINAL) -> RunSummary:
    return RunSummary(
        tree_id="nightly-42", name="backup", schedule="nightly", kind=kind, at=STARTED + 60,
        status=TreeStatus.DONE, submitted_at=STARTED, counts=SummaryCounts(total=2, done=2),
    )  # fmt: skip


def schedule(**fields: Any) -> Schedule:
    return Schedule(name="nightly", tree=Path("/x/tree.yaml"), every_s=60, **fields)


@pytest.mark.parametrize(
    ("timezone", "day"),
    [("UTC", "2026-03-01"), ("Asia/Tokyo", "2026-03-02"), ("America/New_York", "2026-03-01")],
)
def test_the_date_in_a_path_is_the_runs_start_day_in_the_schedules_zone(timezone: str, day: str) -> None:
    path = summary_path("/out/{schedule}/{date}-{tree_id}-{kind}.md", summary(), timezone)
    assert path == Path(f"/out/nightly/{day}-nightly-42-final.md")


def test_a_summary_without_a_schedule_is_filed_under_its_trees_name() -> None:
    assert summary_path("{schedule}.md", summary().model_copy(update={"schedule": None})) == Path("backup.md")


@pytest.mark.parametrize("name", ["s.json", "s.JSON"])
def test_a_json_file_holds_the_summary_and_its_markdown(tmp_path: Path, name: str) -> None:
    path = tmp_path / "deep" / "er" / name
    write_summary_file(path, summary())
    written = json.loads(path.read_text())
    assert written["tree_id"] == "nightly-42" and written["counts"]["done"] == 2
    assert written["markdown"] == render_markdown(summary())


def test_a_markdown_file_replaces_an_earlier_summary_of_the_same_name(tmp_path: Path) -> None:
    path = tmp_path / "s.md"
    write_summary_file(path, summary(SummaryKind.DEADLINE))
    write_summary_file(path, summary())
    assert path.read_text() == render_markdown(summary())
    assert [p.name for p in tmp_path.iterdir()] == ["s.md"]  # no temporary file left behind


class Hook(http.server.BaseHTTPRequestHandler):
    received: ClassVar[list[dict[str, Any]]] = []
    status: ClassVar[int] = 204

    def do_POST(self) -> None:
        length = int(self.headers["Content-Length"])
        Hook.received.append(json.loads(self.rfile.read(length)))
        self.send_response(Hook.status)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def webhook() -> Iterator[str]:
    Hook.received, Hook.status = [], 204
    server = http.server.HTTPServer(("127.0.0.1", 0), Hook)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/hooks/SECRET-TOKEN"
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


def test_deliver_writes_the_file_and_posts_the_webhook(tmp_path: Path, webhook: str) -> None:
    spec = schedule(summary_file=str(tmp_path / "{date}.json"), summary_webhook=webhook)
    assert deliver(spec, summary()) == []
    assert json.loads((tmp_path / "2026-03-01.json").read_text())["tree_id"] == "nightly-42"
    assert [r["tree_id"] for r in Hook.received] == ["nightly-42"]
    assert Hook.received[0]["markdown"] == render_markdown(summary())


@pytest.mark.parametrize("status", [500, 404])
def test_a_webhook_answering_an_error_is_a_line_naming_the_status(webhook: str, status: int) -> None:
    Hook.status = status
    (line,) = deliver(schedule(summary_webhook=webhook), summary())
    assert line.startswith("schedule 'nightly': summary webhook http://127.0.0.1/… failed: ")
    assert str(status) in line


def test_a_webhook_answering_an_error_never_shows_its_path(webhook: str) -> None:
    Hook.status = 500
    (line,) = deliver(schedule(summary_webhook=webhook), summary())
    assert "SECRET-TOKEN" not in line
    assert line.endswith("failed: it answered HTTP 500")


def test_an_unreachable_webhook_and_an_unwritable_file_are_each_a_line(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    spec = schedule(
        summary_file=str(blocker / "{date}.md"),
        summary_webhook=f"http://127.0.0.1:{free_port()}/hooks/SECRET-TOKEN",  # nobody listens
    )
    file_line, hook_line = deliver(spec, summary())
    assert file_line.startswith(
        f"schedule 'nightly': could not write summary file {blocker / '2026-03-01.md'}: "
    )
    assert hook_line.startswith("schedule 'nightly': summary webhook http://127.0.0.1/… failed: ")
    assert "SECRET-TOKEN" not in hook_line
