"""The admission gate on a real stack with two server pool processes on the default pool (the
stack's and a second `vancetope worker`), so a limit kept per process would show: a rate limit
holds across both, a concurrency cap is never exceeded, a call at the gate shows as throttled,
and a pool process killed mid-call does not keep its slot. Rates are read from the store's
recorded start times, never from the test's own clock."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from brain.core.models import TaskState, TreeStatus
from brain.hot.gate import Gate
from brain.runtime.service import Brain
from brain.stack.embedded import EmbeddedStack, celery_argv
from tests.conftest import messages_on, tree, wait_for_tree, wait_until, write_mcp_config
from tests.integration.test_pools import vancetope
from tests.unit.workers.helpers import BUSY_SERVER, http_server
from workers.contracts import DEFAULT_POOL, key_gate_pause, key_gate_paused, key_gate_waiting, pool_queue
from workers.pool_presence import live_pool_workers

pytestmark = pytest.mark.integration


def registry(tmp_path: Path, **limits: object) -> Path:
    path = tmp_path / "registry.yaml"
    lines = ["tools:", "  - name: sleep", "    location: server"]
    lines += [
        f"    {key}: {value!r}" if isinstance(value, str) else f"    {key}: {value}"
        for key, value in limits.items()
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def second_pool(
    pool_processes: Callable[[EmbeddedStack, list[str], str], subprocess.Popen[bytes]],
) -> Callable[[EmbeddedStack], subprocess.Popen[bytes]]:
    """A second process of the default pool (node ``server2@``), as the pool's ACL user."""
    return lambda stack: pool_processes(
        stack, celery_argv("brain.pool", pool_queue(None), "server2@%h", "-c", "2"), "second-pool"
    )


def sleeps(n: int, seconds: float) -> dict[str, object]:
    return {
        "id": "gated",
        "tasks": [{"id": f"t{i}", "tool": "sleep", "args": {"seconds": seconds}} for i in range(n)],
    }


def two_pools(
    tmp_path: Path,
    stack_factory: Callable[..., EmbeddedStack],
    brain_factory: Callable[[EmbeddedStack], Brain],
    second_pool: Callable[[EmbeddedStack], subprocess.Popen[bytes]],
    settings: Mapping[str, object] | None = None,
    **limits: object,
) -> tuple[EmbeddedStack, Brain, subprocess.Popen[bytes]]:
    """The stack's pool process and a second one (``settings``: the stack's, beside the default)."""
    stack = stack_factory(
        services=("brain", "server-pool"), registry=registry(tmp_path, **limits), **(settings or {})
    )
    brain = brain_factory(stack)
    proc = second_pool(stack)
    wait_until(lambda: len(live_pool_workers(brain.hot.r, DEFAULT_POOL)) >= 2, 120, "two pool processes")
    return stack, brain, proc


def most_at_once(brain: Brain, tree_id: str, tasks: int) -> int:
    """How many of ``t0``..``t<tasks-1>`` ran at once at most, from their recorded start and
    finish times: at every start, how many runs had started and not finished."""
    spans = []
    for i in range(tasks):
        r = brain.store.get_task(tree_id, f"t{i}")
        assert r is not None and r.started_at is not None and r.finished_at is not None
        spans.append((r.started_at, r.finished_at))
    return max(sum(1 for s, f in spans if s <= start < f) for start, _ in spans)


def test_a_rate_limit_holds_across_two_pool_processes(
    tmp_path: Path,
    stack_factory: Callable[..., EmbeddedStack],
    brain_factory: Callable[[EmbeddedStack], Brain],
    second_pool: Callable[[EmbeddedStack], subprocess.Popen[bytes]],
) -> None:
    stack, brain, _ = two_pools(tmp_path, stack_factory, brain_factory, second_pool, rate_limit="5/s")
    rec = brain.scheduler.submit(tree(sleeps(60, 0)))

    # Calls wait at the gate, shown as throttled by the limit that holds them.
    def throttled() -> set[str]:
        records = [brain.store.get_task(rec.tree_id, t) for t in brain.store.task_states(rec.tree_id)]
        return set(Gate(brain.hot.r).throttled(r.run_id or "" for r in records if r is not None).values())

    wait_until(lambda: throttled() == {"rate_limit 5/s of tool sleep"}, 120, "calls throttled at the gate")
    # ... and `vancetope status TREE --json` shows them so, beside the store's state.
    shown = vancetope("status", rec.tree_id, "--json", stack=stack, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    gated = [t for t in json.loads(shown.stdout)["tasks"] if t.get("shown_state") == "throttled"]
    assert gated and {(t["state"], t["throttled_by"]) for t in gated} == {
        ("queued_server", "rate_limit 5/s of tool sleep")
    }

    # `status --queues --json`: the pool's calls at the gate, the limit, what waits on it and
    # who for, and how fast calls go through it now (never over the limit).
    def limit_row() -> dict[str, Any]:
        queues = vancetope("status", "--queues", "--json", stack=stack, cwd=tmp_path)
        assert queues.returncode == 0, queues.stderr
        report = json.loads(queues.stdout)
        (row,) = [row for row in report["limits"] if row["limit"] == "tool:sleep"]
        row["pool_throttled"] = next(p["throttled"] for p in report["pools"] if p["pool"] == DEFAULT_POOL)
        return row

    row = limit_row()
    assert (row["scope"], row["name"], row["rate_limit"], row["max_concurrency"]) == (
        "tool",
        "sleep",
        "5/s",
        None,
    )
    assert row["waiting"] > 0 and row["throttled"] == row["waiting"] == row["pool_throttled"]
    assert list(row["waiting_by_user"].values()) == [row["waiting"]]
    row = wait_until(lambda: (r := limit_row())["rate_per_s"] > 0 and r, 120, "a rate measured")
    assert row["rate_per_s"] <= 5.5

    assert wait_for_tree(brain, rec.tree_id, 120).status is TreeStatus.DONE
    done = [brain.store.get_task(rec.tree_id, f"t{i}") for i in range(60)]
    starts = sorted(r.started_at for r in done if r is not None and r.started_at is not None)
    workers = {r.worker for r in done if r is not None}
    assert len(starts) == 60 and len(workers) >= 2, workers  # both processes ran calls
    rate = (len(starts) - 1) / (starts[-1] - starts[0])
    assert 4.5 <= rate <= 5.5, f"achieved {rate:.2f}/s for a limit of 5/s"
    assert brain.hot.r.hlen(key_gate_waiting()) == 0


def test_max_concurrency_is_never_exceeded_across_two_pool_processes(
    tmp_path: Path,
    stack_factory: Callable[..., EmbeddedStack],
    brain_factory: Callable[[EmbeddedStack], Brain],
    second_pool: Callable[[EmbeddedStack], subprocess.Popen[bytes]],
) -> None:
    _, brain, _ = two_pools(tmp_path, stack_factory, brain_factory, second_pool, max_concurrency=2)
    rec = brain.scheduler.submit(tree(sleeps(12, 0.4)))
    assert wait_for_tree(brain, rec.tree_id, 120).status is TreeStatus.DONE
    most = most_at_once(brain, rec.tree_id, 12)
    assert most == 2, f"{most} ran at once under max_concurrency 2"
    assert len({brain.store.get_task(rec.tree_id, f"t{i}").worker for i in range(12)}) >= 2  # type: ignore[union-attr]


def test_a_pool_process_killed_mid_call_gives_its_slot_back_and_the_tree_ends(
    tmp_path: Path,
    stack_factory: Callable[..., EmbeddedStack],
    brain_factory: Callable[[EmbeddedStack], Brain],
    second_pool: Callable[[EmbeddedStack], subprocess.Popen[bytes]],
) -> None:
    # One pool process at first, so the call allowed is surely its own.
    stack = stack_factory(services=("brain",), registry=registry(tmp_path, max_concurrency=1))
    brain = brain_factory(stack)
    first = second_pool(stack)
    wait_until(lambda: live_pool_workers(brain.hot.r, DEFAULT_POOL), 120, "a pool process")
    rec = brain.scheduler.submit(tree(sleeps(4, 3)))

    def running() -> bool:
        states = [brain.store.get_task(rec.tree_id, f"t{i}") for i in range(4)]
        return any(r is not None and r.state is TaskState.RUNNING for r in states)

    wait_until(running, 120, "the one call allowed running")
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(10)
    # Another process takes the killed call back after the visibility timeout, runs it, gives
    # the slot back; the other calls follow, one at a time.
    second_pool(stack)
    assert wait_for_tree(brain, rec.tree_id, 150).status is TreeStatus.DONE
    spans = [brain.store.get_task(rec.tree_id, f"t{i}") for i in range(4)]
    assert all(r is not None and r.state is TaskState.DONE for r in spans)


def test_a_chain_of_limited_calls_is_put_at_the_gate_by_the_pool_and_ends(
    tmp_path: Path,
    stack_factory: Callable[..., EmbeddedStack],
    brain_factory: Callable[[EmbeddedStack], Brain],
    second_pool: Callable[[EmbeddedStack], subprocess.Popen[bytes]],
) -> None:
    # Each dependent is dispatched by the pool that recorded its dependency (as vt-pool): it
    # writes the gate's lane and runs the gate's script under its own ACL user.
    _, brain, _ = two_pools(
        tmp_path, stack_factory, brain_factory, second_pool, rate_limit="5/s", max_concurrency=1
    )
    steps = [{"id": "s0", "tool": "sleep", "args": {"seconds": 0}}]
    steps += [
        {"id": f"s{i}", "tool": "sleep", "args": {"seconds": 0}, "depends_on": [f"s{i - 1}"]}
        for i in range(1, 6)
    ]
    rec = brain.scheduler.submit(tree({"id": "chain", "tasks": steps}))
    assert wait_for_tree(brain, rec.tree_id, 120).status is TreeStatus.DONE
    starts = [brain.store.get_task(rec.tree_id, f"s{i}").started_at for i in range(6)]  # type: ignore[union-attr]
    assert all(b is not None and a is not None and b > a for a, b in pairwise(starts))


def test_a_429_with_retry_after_pauses_that_servers_calls_across_both_processes(
    tmp_path: Path,
    stack_factory: Callable[..., EmbeddedStack],
    brain_factory: Callable[[EmbeddedStack], Brain],
    second_pool: Callable[[EmbeddedStack], subprocess.Popen[bytes]],
) -> None:
    # Two real HTTP MCP servers: `busy` answers its first tools/call 429 with Retry-After: 2,
    # `calm` never does. busy's calls go one at a time (max_concurrency 1), so the call that
    # got the 429 was the only one in flight, and every other one is admitted after its
    # failure was recorded, in whichever pool process: the pause must hold them.
    with (
        http_server(tmp_path, BUSY_SERVER) as busy,
        http_server(tmp_path, BUSY_SERVER, "0") as calm,
    ):
        servers = {"busy": {"url": busy, "max_concurrency": 1}, "calm": {"url": calm}}
        mcp = {"mcp_config": write_mcp_config(tmp_path / "mcp.json", servers)}
        _, brain, _ = two_pools(tmp_path, stack_factory, brain_factory, second_pool, settings=mcp)
        retried = {"max_attempts": 3, "backoff_s": 0.1, "jitter": False}
        tasks = [{"id": f"b{i}", "tool": "busy.ping", "retry": retried} for i in range(4)]
        tasks += [{"id": f"c{i}", "tool": "calm.ping"} for i in range(4)]
        rec = brain.scheduler.submit(tree({"id": "busy-and-calm", "tasks": tasks}))
        assert wait_for_tree(brain, rec.tree_id, 120).status is TreeStatus.DONE
        # calm's calls never waited at the gate: no limit, no pause of theirs.
        gate = brain.scheduler.publisher.gate
        assert gate is not None
        assert gate.keys_view(["server:calm"])[0]["server:calm"].admitted == {}

    busy_runs = [brain.store.get_task(rec.tree_id, f"b{i}") for i in range(4)]
    assert all(r is not None and r.started_at is not None for r in busy_runs)
    (refused,) = [r for r in busy_runs if r is not None and r.attempts]
    attempt = refused.attempts[0]
    assert attempt.error is not None and attempt.error.data["status"] == 429
    assert attempt.error.data["retry_after_s"] == 2.0 and attempt.finished_at is not None
    # No call of busy started within the 2 s it asked for: the retry, and the three others
    # (a generous lower bound: the pause runs from when the 429 was recorded, after it came).
    waited = [r.started_at - attempt.finished_at for r in busy_runs if r is not None and r.started_at]
    assert min(waited) >= 1.9, waited


def test_a_call_of_a_paused_server_with_no_limit_waits_at_the_gate(brain_on_redis: Brain) -> None:
    # A budget with no limit written is paused too: the dispatcher, which reads the paused
    # budgets at most once a second, puts its calls at the gate while the pause lasts.
    brain = brain_on_redis
    gate = brain.scheduler.publisher.gate
    assert gate is not None
    why = "paused by HTTP 429 from tool http_get (Retry-After 600s)"
    gate.pause("tool:http_get", 600, why)
    wait_until(lambda: "tool:http_get" in gate.paused(), 60, "the pause seen by the dispatcher")
    rec = brain.scheduler.submit(
        tree(
            {
                "id": "paused",
                "tasks": [
                    {"id": "get", "tool": "http_get", "args": {"url": "https://example.com/"}},
                    {"id": "say", "tool": "echo", "args": {"value": 1}},
                ],
            }
        )
    )
    runs = {t: brain.store.get_task(rec.tree_id, t) for t in ("get", "say")}
    get, say = (r.run_id if r is not None else None for r in runs.values())
    assert get and say
    assert gate.throttled([get, say]) == {get: why}
    queued = [json.loads(raw)["headers"]["id"] for raw in messages_on(brain.hot.r, pool_queue(None))]
    assert queued == [say]


def test_a_cap_on_the_default_pool_holds_across_both_processes_and_explain_names_it(
    tmp_path: Path,
    stack_factory: Callable[..., EmbeddedStack],
    brain_factory: Callable[[EmbeddedStack], Brain],
    second_pool: Callable[[EmbeddedStack], subprocess.Popen[bytes]],
) -> None:
    # server_max_concurrency: the default pool's cap, as max_concurrency on a [[pools]] table.
    cap = {"server_max_concurrency": 1}
    stack, brain, _ = two_pools(tmp_path, stack_factory, brain_factory, second_pool, settings=cap)
    tree_file = tmp_path / "tree.json"
    tree_file.write_text(json.dumps(sleeps(6, 0.3)))
    # A budget a 429 paused shows beside the limits written, while the pause lasts.
    gate = Gate(brain.hot.r)
    gate.pause("tool:sleep", 600, "paused by HTTP 429 from tool sleep (Retry-After 600s)")
    said = vancetope("explain", str(tree_file), stack=stack, cwd=tmp_path)
    assert said.returncode == 0, said.stderr
    assert (
        "task t0: limits: max_concurrency 1 of pool default, "
        "paused by HTTP 429 from tool sleep (Retry-After 600s) until "
    ) in said.stdout
    brain.hot.r.delete(key_gate_pause("tool:sleep"), key_gate_paused())
    said = vancetope("explain", str(tree_file), stack=stack, cwd=tmp_path)
    assert "task t0: limits: max_concurrency 1 of pool default\n" in said.stdout
    rec = brain.scheduler.submit(tree(sleeps(6, 0.3)))
    assert wait_for_tree(brain, rec.tree_id, 120).status is TreeStatus.DONE
    assert most_at_once(brain, rec.tree_id, 6) == 1


class _Site(BaseHTTPRequestHandler):
    """A site of the test's own: ``/busy`` answers 429 with Retry-After (once per server), every
    other path 200. Each server is an origin of its own (its port)."""

    def do_GET(self) -> None:
        server = self.server
        assert isinstance(server, _SiteServer)
        server.asked.append((self.path, time.time()))
        if self.path == "/busy" and not server.refused:
            server.refused = True
            self.send_response(429)
            self.send_header("Retry-After", "30")
            body = b"slow down"
        else:
            self.send_response(200)
            body = b"ok"
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


class _SiteServer(ThreadingHTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Site)
        self.asked: list[tuple[str, float]] = []
        self.refused = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture
def two_sites() -> Iterator[tuple[_SiteServer, _SiteServer]]:
    sites = (_SiteServer(), _SiteServer())
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in sites]
    for thread in threads:
        thread.start()
    try:
        yield sites
    finally:
        for site in sites:
            site.shutdown()
            site.server_close()


def test_one_sites_429_pauses_the_http_get_calls_to_that_site_only(
    stack_factory: Callable[..., EmbeddedStack],
    brain_factory: Callable[[EmbeddedStack], Brain],
    two_sites: tuple[_SiteServer, _SiteServer],
) -> None:
    """A real pool's ``http_get`` meets a 429 with Retry-After 30 from one origin: later calls to
    that origin wait at the gate (throttled, the origin named), calls to another origin go on."""
    busy, calm = two_sites
    stack = stack_factory(http_allow=("127.0.0.1",))  # the test's own sites
    brain = brain_factory(stack)

    def get(tree_id: str, url: str) -> Any:
        task = {"id": "get", "tool": "http_get", "args": {"url": url}}
        return brain.scheduler.submit(tree({"id": tree_id, "tasks": [task]}))

    get("first", f"{busy.url}/busy")
    gate = brain.scheduler.publisher.gate
    assert gate is not None
    origin = f"origin:{busy.url}"  # scheme://host:port
    wait_until(lambda: gate.pauses(), 120, "the 429 to pause a budget")
    assert set(gate.pauses()) == {origin}, gate.pauses()
    wait_until(lambda: origin in gate.paused(), 120, "the pause seen by the dispatcher")

    held = get("held", f"{busy.url}/again")
    other = get("other", f"{calm.url}/fine")
    assert wait_for_tree(brain, other.tree_id, 120).status is TreeStatus.DONE
    rec = brain.store.get_task(held.tree_id, "get")
    assert rec is not None and rec.state is TaskState.QUEUED_SERVER and rec.started_at is None
    why = gate.throttled([rec.run_id or ""])
    assert why == {rec.run_id: f"paused by HTTP 429 from origin {busy.url} (Retry-After 30s)"}, why
    assert [path for path, _ in busy.asked] == ["/busy"]  # the held call never reached the site
    assert [path for path, _ in calm.asked] == ["/fine"]
