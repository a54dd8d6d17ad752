"""brain.runtime.schedule_runs against a real Redis and a SQLite store, no workers: what a fire does
under each overlap, that skip holds when fires race, and the summaries the sweep makes and sends."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from brain.core.models import TreeStatus
from brain.core.schedules import Overlap, Schedule
from brain.core.summary import SummaryKind
from brain.runtime.schedule_runs import ScheduleRuns
from brain.runtime.service import Brain
from workers.contracts import ScheduleFire, key_schedule_queue

pytestmark = pytest.mark.integration


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def fire(name: str, n: int) -> ScheduleFire:
    return ScheduleFire(schedule=name, fired_at=1_796_000_000.0 + n, token=f"{n:06x}")


def runs_of(brain: Brain, name: str) -> list[Any]:
    return brain.store.schedule_runs(name, limit=100)


@pytest.fixture
def tree_file(tmp_path: Path) -> Path:
    # No worker consumes the server queue here, so a run stays running until cancelled.
    path = tmp_path / "night.yaml"
    path.write_text("id: night\ntasks:\n  - {id: a, tool: echo, args: {value: hi}}\n")
    return path


def spec(tree_file: Path, **kw: Any) -> Schedule:
    return Schedule.model_validate({"name": "nightly", "tree": tree_file, "every_s": 60, "user": "ada", **kw})


def test_a_fire_starts_a_run_that_names_its_schedule_and_user(brain_on_redis: Brain, tree_file: Path) -> None:
    runs = ScheduleRuns(brain_on_redis.scheduler, [spec(tree_file)])
    record = runs.fire(fire("nightly", 1))
    assert record is not None
    stored = brain_on_redis.store.get_tree(record.tree_id)
    assert stored is not None and stored.schedule == "nightly" and stored.user == "ada"
    assert record.tree_id == "night-20261130-005321-000001"


def test_a_schedules_priority_is_its_runs_when_the_tree_names_none(
    brain_on_redis: Brain, tree_file: Path
) -> None:
    runs = ScheduleRuns(brain_on_redis.scheduler, [spec(tree_file, priority="low")])
    record = runs.fire(fire("nightly", 1))
    assert record is not None
    stored = brain_on_redis.store.get_tree(record.tree_id)
    assert stored is not None and stored.tree.priority == 2
    tree_file.write_text("id: night\npriority: high\ntasks:\n  - {id: a, tool: echo, args: {value: hi}}\n")
    record = ScheduleRuns(brain_on_redis.scheduler, [spec(tree_file, priority="low", overlap="allow")]).fire(
        fire("nightly", 2)
    )
    assert record is not None and record.tree.priority == 8  # the tree's own word wins


def test_skip_never_starts_a_second_run_while_one_goes_on_even_when_fires_race(
    brain_on_redis: Brain, tree_file: Path
) -> None:
    runs = ScheduleRuns(brain_on_redis.scheduler, [spec(tree_file, overlap="skip")])
    barrier = threading.Barrier(6)

    def racer(n: int) -> None:
        barrier.wait()
        runs.fire(fire("nightly", n))

    threads = [threading.Thread(target=racer, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(runs_of(brain_on_redis, "nightly")) == 1
    assert runs.fire(fire("nightly", 99)) is None  # later, still running: skipped too
    assert len(runs_of(brain_on_redis, "nightly")) == 1


def test_a_fire_delivered_twice_starts_one_run_even_with_overlap_allow(
    brain_on_redis: Brain, tree_file: Path
) -> None:
    runs = ScheduleRuns(brain_on_redis.scheduler, [spec(tree_file, overlap="allow")])
    assert runs.fire(fire("nightly", 1)) is not None
    assert runs.fire(fire("nightly", 1)) is None
    assert runs.fire(fire("nightly", 2)) is not None  # a new fire: allow runs both
    assert (
        len(
            runs_of(
                brain_on_redis,
                "nightly",
            )
        )
        == 2
    )


def test_queue_starts_a_fire_that_came_while_the_previous_run_went_on_once_it_ends(
    brain_on_redis: Brain, tree_file: Path
) -> None:
    brain = brain_on_redis
    runs = ScheduleRuns(brain.scheduler, [spec(tree_file, overlap=Overlap.QUEUE)])
    first = runs.fire(fire("nightly", 1))
    assert first is not None
    assert runs.fire(fire("nightly", 2)) is None
    assert brain.hot.r.llen(key_schedule_queue("nightly")) == 1
    runs.sweep()
    assert len(runs_of(brain, "nightly")) == 1  # still running: the queued fire waits
    brain.sweeps.cancel(first.tree_id)
    runs.sweep()
    later = runs_of(brain, "nightly")
    assert len(later) == 2 and later[0].status is TreeStatus.RUNNING
    assert brain.hot.r.llen(key_schedule_queue("nightly")) == 0


def test_an_unknown_or_disabled_schedule_starts_nothing(brain_on_redis: Brain, tree_file: Path) -> None:
    runs = ScheduleRuns(brain_on_redis.scheduler, [spec(tree_file, enabled=False)])
    assert runs.fire(fire("nightly", 1)) is None
    assert runs.fire(fire("removed", 1)) is None
    assert brain_on_redis.store.list_trees() == []


class Webhook(BaseHTTPRequestHandler):
    received: ClassVar[list[dict[str, Any]]]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append(json.loads(body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def local_webhook() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A real HTTP server on a free loopback port: (its URL, the JSON bodies POSTed to it)."""
    received: list[dict[str, Any]] = []
    handler = type("Handler", (Webhook,), {"received": received})
    server = HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/hooks/secret-token", received
    server.shutdown()
    server.server_close()
    thread.join(10)


@pytest.fixture
def webhook() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    with local_webhook() as hook:
        yield hook


def test_the_sweep_summarises_a_run_at_its_deadline_and_when_it_ends_into_the_store_a_file_and_a_webhook(
    brain_on_redis: Brain, tree_file: Path, tmp_path: Path, webhook: tuple[str, list[dict[str, Any]]]
) -> None:
    brain = brain_on_redis
    url, received = webhook
    clock = Clock(brain.scheduler.clock())
    schedule = spec(
        tree_file,
        deadline_s=600,
        summary_file=str(tmp_path / "reports" / "{schedule}-{date}-{kind}.md"),
        summary_webhook=url,
    )
    runs = ScheduleRuns(brain.scheduler, [schedule], clock=clock)
    run = runs.fire(fire("nightly", 1))
    assert run is not None
    runs.sweep()
    assert brain.store.get_summaries(run.tree_id) == []  # before the deadline: nothing
    clock.now += 601
    runs.sweep()
    runs.sweep()  # once per kind
    (deadline,) = brain.store.get_summaries(run.tree_id)
    assert deadline.kind is SummaryKind.DEADLINE and deadline.counts.in_flight == 1
    brain.sweeps.cancel(run.tree_id)
    runs.sweep()
    kinds = [s.kind for s in brain.store.get_summaries(run.tree_id)]
    assert kinds == [SummaryKind.DEADLINE, SummaryKind.FINAL]
    files = sorted(p.name for p in (tmp_path / "reports").iterdir())
    assert len(files) == 2 and all(f.startswith("nightly-") for f in files)
    final_md = next((tmp_path / "reports").glob("*-final.md")).read_text()
    assert final_md.startswith("# nightly: failed\n") and "cancelled by user" in final_md
    assert [(r["kind"], r["schedule"], r["counts"]["skipped"]) for r in received] == [
        ("deadline", "nightly", 0),
        ("final", "nightly", 1),
    ]
    assert received[1]["markdown"] == final_md


def test_a_webhook_that_fails_is_logged_without_its_secret_and_the_summary_is_still_stored(
    brain_on_redis: Brain, tree_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    brain = brain_on_redis
    runs = ScheduleRuns(brain.scheduler, [spec(tree_file, summary_webhook="http://127.0.0.1:1/hook/s3cret")])
    run = runs.fire(fire("nightly", 1))
    assert run is not None
    brain.sweeps.cancel(run.tree_id)
    runs.sweep()
    assert [s.kind for s in brain.store.get_summaries(run.tree_id)] == [SummaryKind.FINAL]
    assert "summary webhook http://127.0.0.1/… failed" in caplog.text
    assert "s3cret" not in caplog.text


def test_a_schedule_fires_a_night_batch_with_retries_trigger_rules_and_a_fan_out(
    brain_on_redis: Brain, tmp_path: Path
) -> None:
    """Issue 23 through a schedule: the tree file's new fields come along, as in
    examples/bad-night.yaml (no workers here: what the fire recorded is read back)."""
    night = tmp_path / "bad-night.yaml"
    night.write_text(
        "id: night\nretry: {max_attempts: 3, backoff_s: 2}\ntasks:\n"
        "  - {id: offices, tool: echo, args: {value: [a, b]}}\n"
        "  - {id: each, tool: echo, depends_on: [offices], for_each: '${tasks.offices.result}', as: zone,"
        " args: {value: '${zone}'}}\n"
        "  - {id: notify, tool: echo, depends_on: [each], run_if: any_failed, args: {value: '${tasks.each.status}'}}\n"
    )
    runs = ScheduleRuns(brain_on_redis.scheduler, [spec(night)])
    record = runs.fire(fire("nightly", 1))
    assert record is not None
    tree = brain_on_redis.store.get_tree(record.tree_id).tree
    assert tree.retry is not None and tree.retry.max_attempts == 3
    assert tree.task("notify").run_if.value == "any_failed"
    assert (tree.task("each").for_each, tree.task("each").item_name) == ("${tasks.offices.result}", "zone")
