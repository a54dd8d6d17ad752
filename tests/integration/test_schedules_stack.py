"""Schedules end to end: Celery beat in the embedded stack fires them, the brain starts the runs,
and `vancetope schedules` / `vancetope status` show them (real redis-server, beat, brain, pool)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path

import httpx2
import pytest

from brain.core.models import TreeRecord, TreeStatus
from brain.runtime.service import Brain
from brain.stack.embedded import EmbeddedStack
from tests.conftest import wait_until, write_mcp_config
from tests.integration.test_schedule_runs import local_webhook
from tests.integration.test_web import serve_web

pytestmark = pytest.mark.integration


def vancetope(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: PLW1510 - callers assert on returncode
        [sys.executable, "-m", "brain", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "VANCETOPE_DATA_DIR": str(cwd / "data"), "COLUMNS": "250", **(env or {})},
    )


def write_tree(folder: Path, name: str, task: str) -> None:
    (folder / f"{name}.yaml").write_text(f"id: {name}\ntasks:\n  - {task}\n")


def test_schedules_help_and_json_work_without_a_stack(tmp_path: Path) -> None:
    write_tree(tmp_path, "night", "{id: a, tool: echo, args: {value: hi}}")
    (tmp_path / "vancetope.toml").write_text(
        '[[schedules]]\nname = "nightly"\ntree = "night.yaml"\ncron = "0 2 * * *"\ntimezone = "Europe/Paris"\n'
        'overlap = "queue"\ncatch_up = "latest"\n\n'
        '[[schedules]]\nname = "off"\ntree = "night.yaml"\nevery_s = 60\nenabled = false\n'
    )
    helped = vancetope("schedules", "--help", cwd=tmp_path)
    assert helped.returncode == 0 and "--json" in helped.stdout
    proc = vancetope("schedules", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    nightly, off = json.loads(proc.stdout)
    assert (nightly["name"], nightly["cron"], nightly["timezone"]) == ("nightly", "0 2 * * *", "Europe/Paris")
    assert (nightly["overlap"], nightly["catch_up"], nightly["enabled"]) == ("queue", "latest", True)
    assert nightly["last_fired_at"] is None and nightly["last_run"] is None
    assert nightly["next_fire_at"] is not None
    assert off["enabled"] is False and off["next_fire_at"] is None
    table = vancetope("schedules", cwd=tmp_path)
    assert table.returncode == 0 and "0 2 * * * (Europe/Paris)" in table.stdout


def test_a_bad_schedule_exits_2_naming_it_and_beat_needs_a_redis_url(tmp_path: Path) -> None:
    write_tree(tmp_path, "night", "{id: a, tool: echo, args: {value: hi}}")
    (tmp_path / "vancetope.toml").write_text(
        '[[schedules]]\nname = "nightly"\ntree = "night.yaml"\ncron = "0 2 * * *"\novershoot = 1\n'
    )
    proc = vancetope("schedules", cwd=tmp_path)
    assert proc.returncode == 2
    assert "schedule 'nightly': overshoot: Extra inputs are not permitted" in proc.stderr
    (tmp_path / "vancetope.toml").write_text(
        '[[schedules]]\nname = "nightly"\ntree = "night.yaml"\nevery_s = 9\n'
    )
    proc = vancetope("beat", cwd=tmp_path)
    assert proc.returncode == 2 and "set VANCETOPE_REDIS_URL" in proc.stderr


def runs_by(brain: Brain, name: str) -> list[TreeRecord]:
    return sorted(brain.store.schedule_runs(name, limit=100), key=lambda t: t.submitted_at)


def assert_never_two_at_once(runs: list[TreeRecord]) -> None:
    for earlier, later in pairwise(runs):
        assert earlier.finished_at is not None, (
            f"{earlier.tree_id} still running when {later.tree_id} started"
        )
        assert earlier.finished_at <= later.submitted_at, f"{earlier.tree_id} overlaps {later.tree_id}"


def finished(runs: list[TreeRecord]) -> list[TreeRecord]:
    return [r for r in runs if r.status is not TreeStatus.RUNNING]


def test_beat_in_the_embedded_stack_runs_schedules_that_name_their_runs_and_skip_and_queue_never_overlap(
    tmp_path: Path,
    stack_factory: Callable[..., EmbeddedStack],
    brain_factory: Callable[[EmbeddedStack], Brain],
) -> None:
    write_tree(tmp_path, "quick", "{id: hello, tool: echo, args: {value: morning}}")
    write_tree(tmp_path, "slow", "{id: nap, tool: sleep, args: {seconds: 4}}")  # longer than its interval
    write_tree(tmp_path, "line", "{id: nap, tool: sleep, args: {seconds: 2}}")
    with local_webhook() as (url, received):
        (tmp_path / "vancetope.toml").write_text(
            '[[schedules]]\nname = "quick"\ntree = "quick.yaml"\nevery_s = 5\nuser = "demo"\n'
            f'summary_file = "reports/{{schedule}}-{{tree_id}}.json"\nsummary_webhook = "{url}"\n\n'
            '[[schedules]]\nname = "slow"\ntree = "slow.yaml"\nevery_s = 1\noverlap = "skip"\ndeadline_s = 1\n\n'
            '[[schedules]]\nname = "line"\ntree = "line.yaml"\nevery_s = 1\noverlap = "queue"\n'
        )
        stack = stack_factory(
            services=("brain", "server-pool", "beat"),
            mcp_config=write_mcp_config(tmp_path / "server-mcp.json", {}),
            server_concurrency=3,
        )
        brain = brain_factory(stack)
        wait_until(
            lambda: (
                len(finished(runs_by(brain, "quick"))) >= 2
                and len(finished(runs_by(brain, "slow"))) >= 2
                and len(finished(runs_by(brain, "line"))) >= 2
            ),
            timeout=120,
            what="two finished runs of each schedule",
        )
        quick = finished(runs_by(brain, "quick"))
        assert all(r.status is TreeStatus.DONE and r.schedule == "quick" and r.user == "demo" for r in quick)
        for name in ("slow", "line"):
            runs = runs_by(brain, name)
            assert all(r.schedule == name for r in runs)
            assert_never_two_at_once(runs)
        slow = finished(runs_by(brain, "slow"))
        wait_until(lambda: brain.store.get_summaries(slow[0].tree_id), 120, "the slow run's summaries")
        assert "deadline" in {s.kind.value for s in brain.store.get_summaries(slow[0].tree_id)}
        first = quick[0]
        wait_until(lambda: len(received) >= 2, 120, "two webhook posts")
        report = json.loads((tmp_path / "reports" / f"quick-{first.tree_id}.json").read_text())
        assert (report["schedule"], report["kind"], report["counts"]["done"]) == ("quick", "final", 1)
        assert {r["schedule"] for r in received} == {"quick"}

        # The CLI shows them, from the store alone.
        proc = vancetope("schedules", "--json", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        rows = {row["name"]: row for row in json.loads(proc.stdout)}
        assert rows["quick"]["last_fired_at"] is not None and rows["quick"]["last_run"]["tree_id"].startswith(
            "quick-"
        )
        proc = vancetope("status", first.tree_id, "--json", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        shown = json.loads(proc.stdout)
        assert shown["schedule"] == "quick" and shown["summary"]["counts"]["done"] == 1
        proc = vancetope("status", first.tree_id, cwd=tmp_path)
        assert f"tree {first.tree_id} (schedule quick)" in proc.stdout and "quick: done" in proc.stdout

        # The web view finds the runs by schedule and shows the run's stored summary on its page.
        url, user, password = serve_web(stack)
        listed = httpx2.get(f"{url}/trees", params={"schedule": "quick"}, auth=(user, password), timeout=30)
        assert f'data-tree-id="{first.tree_id}"' in listed.text
        assert 'data-tree-id="slow-' not in listed.text and 'data-tree-id="line-' not in listed.text
        page = httpx2.get(f"{url}/trees/{first.tree_id}", auth=(user, password), timeout=30).text
        assert '<section id="summary" data-kind="final">' in page and '<td data-count="done">1</td>' in page


def test_vancetope_up_runs_beat_and_a_skip_schedule_every_5s_never_has_two_runs_at_once(
    tmp_path: Path,
) -> None:
    from brain.store import open_store
    from tests.conftest import EXAMPLES

    write_tree(tmp_path, "nap", "{id: nap, tool: sleep, args: {seconds: 6}}")  # longer than every_s
    write_mcp_config(tmp_path / "server-mcp.json", {})
    (tmp_path / "vancetope.toml").write_text(
        f'[vancetope]\nregistry = "{EXAMPLES / "registry.yaml"}"\nmcp_config = "server-mcp.json"\n'
        "reconcile_interval_s = 0.5\n\n"
        '[[schedules]]\nname = "naps"\ntree = "nap.yaml"\nevery_s = 5\noverlap = "skip"\n'
    )
    data = tmp_path / "data"
    with open(tmp_path / "up.log", "w") as up_log:
        up = subprocess.Popen(
            [sys.executable, "-m", "brain", "up", "--no-agent"],
            cwd=tmp_path,
            env={**os.environ, "VANCETOPE_DATA_DIR": str(data)},
            stdout=up_log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_until((data / "stack.json").exists, timeout=120, what="`vancetope up` to write stack.json")
        store = open_store(f"sqlite:///{data / 'vancetope.db'}")
        try:
            wait_until(
                lambda: len(finished(store.schedule_runs("naps"))) >= 2, timeout=120, what="two finished runs"
            )
            runs = sorted(store.schedule_runs("naps"), key=lambda t: t.submitted_at)
        finally:
            store.close()
        assert all(r.schedule == "naps" for r in runs)
        assert all(r.status is TreeStatus.DONE for r in finished(runs))
        assert_never_two_at_once(runs)
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGINT)
            up.wait(120)
    assert up.returncode == 0, (tmp_path / "up.log").read_text()
    assert (data / "logs" / "beat.log").is_file()
