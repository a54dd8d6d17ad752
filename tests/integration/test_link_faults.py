"""A workstation's link to Redis fails and heals, under a real client agent (issue 25, item 3).

The agent (a ``vancetope-agent run`` process, started by the stack) reaches Redis only through
the fault proxy (``bench/faultproxy.py``); the brain and the pool reach it directly. A ledger
MCP server in the agent's mcp.json writes down each run of its tool, so a test counts how
many times a call really ran, beside how many times it was recorded.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from bench.faultproxy import FaultProxy
from brain.core.models import TaskState, TreeRecord, TreeStatus
from brain.hot.acl import client_username
from brain.runtime.service import Brain
from brain.stack.embedded import EmbeddedStack, stack_env
from tests.conftest import (
    EXAMPLES,
    FIXTURES,
    agent_with_servers,
    demo_server,
    tree,
    wait_for_tree,
    wait_until,
)
from tests.integration.test_cli import vancetope
from workers.contracts import (
    KOMBU_UNACKED,
    RUN_TOOL_TASK,
    client_key,
    client_queue,
    key_cancelled,
    key_deliveries,
)
from workers.lease import VISIBILITY_TIMEOUT_S

pytestmark = pytest.mark.integration

HEARTBEAT_TTL_S = 2.0  # agent_with_servers
# The laptop's queue and kombu's hash of the calls it holds, under its prefix.
LAPTOP_QUEUE = client_key("laptop", client_queue("laptop"))
LAPTOP_UNACKED = client_key("laptop", KOMBU_UNACKED)


def ledger_server() -> dict[str, Any]:
    return {"command": sys.executable, "args": [str(FIXTURES / "mcp_ledger_server.py")]}


@pytest.fixture
def behind_proxy(
    request: pytest.FixtureRequest, tmp_path: Path, stack_factory: Callable[..., EmbeddedStack]
) -> Iterator[tuple[EmbeddedStack, FaultProxy]]:
    """A stack whose agent "laptop" (user ada, the ledger server in its mcp.json) talks to Redis
    through a fault proxy; its heartbeat TTL is ``HEARTBEAT_TTL_S`` unless the test's indirect
    parameter gives another, its reconciler's grace the suite's 1 s unless a
    ``reconcile_grace`` mark gives another."""
    # Declared as a client tool, as a night batch's workstation tools are: while its client is
    # away, its calls park (pending_client) instead of failing as unknown.
    registry = yaml.safe_load((EXAMPLES / "registry.yaml").read_text())
    registry["tools"].append({"name": "ledger.work", "location": "client", "mcp_server": "ledger"})
    registry["tools"].append({"name": "ledger.die", "location": "client", "mcp_server": "ledger"})
    (tmp_path / "registry.yaml").write_text(yaml.safe_dump(registry))
    agent_config = agent_with_servers(tmp_path, {"ledger": ledger_server(), "desk": demo_server()})
    ttl = getattr(request, "param", HEARTBEAT_TTL_S)
    text = agent_config.read_text()
    agent_config.write_text(text.replace(f"heartbeat_ttl_s = {HEARTBEAT_TTL_S}", f"heartbeat_ttl_s = {ttl}"))
    grace = request.node.get_closest_marker("reconcile_grace")
    settings = {"reconcile_grace_s": grace.args[0]} if grace is not None else {}
    stack = stack_factory(
        services=("brain", "server-pool"),
        agent_config=agent_config,
        registry=tmp_path / "registry.yaml",
        **settings,
    )
    assert stack.redis is not None and stack.agent_url is not None
    with FaultProxy(("127.0.0.1", stack.redis.port)) as proxy:
        stack.agent_url = proxy.url(stack.agent_url)
        stack.start_service("client-agent")
        assert stack.wait_connected("laptop", 120)
        yield stack, proxy


def as_restored(raw: bytes) -> bytes:
    """A popped message as kombu puts it back on a queue (``_do_restore_message``): marked
    redelivered, so the agent waits for its begin (the cancel check, the poison count)."""
    message = json.loads(raw)
    message["headers"]["redelivered"] = True
    message["properties"]["delivery_info"]["redelivered"] = True
    return json.dumps(message).encode()


def one_ledger_call(brain: Brain, tree_id: str, ledger: Path, seconds: float) -> TreeRecord:
    """Submit, as ada, a tree of one task "call": the ledger's tool working ``seconds``."""
    call = {"id": "call", "tool": "ledger.work", "args": {"seconds": seconds, "ledger": str(ledger)}}
    return brain.scheduler.submit(tree({"id": tree_id, "tasks": [call]}), user="ada")


def started_ledger_call(brain: Brain, tree_id: str, ledger: Path, seconds: float) -> tuple[TreeRecord, str]:
    """``one_ledger_call``, once it has started on the laptop: its tree and its first run."""
    rec = one_ledger_call(brain, tree_id, ledger, seconds)
    wait_until(lambda: runs_in(ledger) == 1, 120, "the call to start on the laptop")
    run_id = brain.store.get_task(rec.tree_id, "call").run_id  # type: ignore[union-attr]
    assert run_id is not None
    return rec, run_id


def runs_in(ledger: Path) -> int:
    return len(spans_in(ledger, ended=False))


def spans_in(ledger: Path, ended: bool = True) -> list[tuple[float, float]]:
    """(start, end) of each run the ledger holds, by start; a run not ended ends at inf (left
    out with ``ended``)."""
    if not ledger.exists():
        return []
    spans: dict[str, list[float]] = {}
    for line in ledger.read_text().splitlines():
        what, at, run = line.split()[:3]
        spans.setdefault(run, [float("inf"), float("inf")])[0 if what == "start" else 1] = float(at)
    found = sorted((start, end) for start, end in spans.values())
    return [s for s in found if not ended or s[1] != float("inf")]


def test_a_link_cut_for_60_s_in_the_middle_of_a_call_records_its_result_once(
    tmp_path: Path,
    behind_proxy: tuple[EmbeddedStack, FaultProxy],
    brain_factory: Callable[[EmbeddedStack], Brain],
) -> None:
    stack, proxy = behind_proxy
    brain = brain_factory(stack)
    ledger = tmp_path / "ledger.txt"
    rec = brain.scheduler.submit(
        tree(
            {
                "id": "cut",
                "tasks": [
                    {"id": "call", "tool": "ledger.work", "args": {"seconds": 5, "ledger": str(ledger)}},
                    {
                        "id": "after",
                        "tool": "echo",
                        "depends_on": ["call"],
                        "args": {"value": "${tasks.call.result}"},
                    },
                ],
            }
        ),
        user="ada",
    )
    wait_until(lambda: runs_in(ledger) == 1, 120, "the call to start on the laptop")
    first_run = brain.store.get_task(rec.tree_id, "call").run_id  # type: ignore[union-attr]
    proxy.cut()  # a train into a tunnel, 1 s into a 5 s call
    time.sleep(60)
    assert proxy.stats.dropped_bytes > 0  # the agent kept trying: heartbeats, the result
    proxy.heal()
    # Measured on the brain's clock (the tree's finished_at; the brain runs on this host), not
    # by when this test got round to seeing the end: under the suite's load that can come later.
    healed = time.time()
    bound = HEARTBEAT_TTL_S + VISIBILITY_TIMEOUT_S + 10  # the issue's: TTL + the lease + 10 s
    done = wait_for_tree(brain, rec.tree_id, bound + 120)  # a backstop: the bound is asserted below
    assert done.finished_at is not None
    took = done.finished_at - healed
    tasks = {t.task_id: t for t in brain.store.get_tasks(rec.tree_id)}
    assert done.status is TreeStatus.DONE, {t: (r.state, r.reason, r.error) for t, r in tasks.items()}
    assert runs_in(ledger) == 1  # executed once
    assert (
        tasks["call"].state is TaskState.DONE and tasks["call"].result == 1
    )  # recorded once, its own result
    assert tasks["after"].result == 1
    assert took <= bound, took
    # How: the brain took the call back at the missed heartbeat and re-sent it after the heal;
    # the agent answered the new run from the one it had finished during the cut.
    agent_log = (stack.settings.data_dir / "logs" / "client-agent.log").read_text()
    assert f"the same call succeeded as run {first_run}" in agent_log, agent_log[-3000:]


def test_a_call_taken_back_during_a_cut_and_still_running_after_the_heal_runs_once(
    tmp_path: Path,
    behind_proxy: tuple[EmbeddedStack, FaultProxy],
    brain_factory: Callable[[EmbeddedStack], Brain],
) -> None:
    """The brain takes a call back when its laptop's heartbeat lapses, and puts the old run in
    the cancelled set so that it never starts again; but it is running, and it goes on (only a
    cancel or an expiry stops a running call). After the heal the re-sent run is answered from
    it: the tool runs once. Found by a reviewer: stopping every run of the cancelled set cut
    this call off half-way and ran it a second time."""
    stack, proxy = behind_proxy
    brain = brain_factory(stack)
    ledger = tmp_path / "ledger.txt"
    rec, first_run = started_ledger_call(brain, "cut-while-running", ledger, seconds=25)
    proxy.cut()

    def taken_back() -> bool:
        task = brain.store.get_task(rec.tree_id, "call")
        return task is not None and (task.run_id != first_run or task.state is not TaskState.RUNNING)

    wait_until(taken_back, 120, "the brain to take the call back from the silent laptop")
    time.sleep(HEARTBEAT_TTL_S + 3)  # the laptop's stop checks fail meanwhile: it runs on
    proxy.heal()
    done = wait_for_tree(brain, rec.tree_id, 240)
    call = brain.store.get_task(rec.tree_id, "call")
    assert done.status is TreeStatus.DONE and call is not None and call.result == 1, (
        call,
        ledger.read_text(),
    )
    assert runs_in(ledger) == 1 and len(spans_in(ledger)) == 1  # run once, to its end
    agent_log = (stack.settings.data_dir / "logs" / "client-agent.log").read_text()
    assert "stopped after" not in agent_log
    assert f"the same call succeeded as run {first_run}" in agent_log, agent_log[-3000:]


# A heartbeat TTL longer than the cut: the laptop stays connected, so the reconciler re-sends
# the lost call (a laptop dropped as offline has it parked instead, as in the test above).
@pytest.mark.parametrize("behind_proxy", [60.0], indirect=True)
def test_a_call_popped_as_the_link_is_cut_is_resent_and_its_late_delivery_never_starts(
    tmp_path: Path,
    behind_proxy: tuple[EmbeddedStack, FaultProxy],
    brain_factory: Callable[[EmbeddedStack], Brain],
) -> None:
    """The agent's pop of a call reached Redis, then the link was cut: the reply and its unacked
    write never made it, so no queue, hash or outbox holds the run. The reconciler re-sends it
    as a new run and cancels the old one. When the old message surfaces after all (kombu
    restoring it to a restarted agent, which no longer remembers the call), it is refused at
    begin_run: the tool runs once, its result is recorded once."""
    stack, proxy = behind_proxy
    brain = brain_factory(stack)
    r = brain.hot.r
    ledger = tmp_path / "ledger.txt"
    rec, raw = popped_by_the_test(brain, proxy, "popped", ledger)  # the pop the cut ate
    old = brain.store.get_task(rec.tree_id, "call")
    assert old is not None and old.state is TaskState.QUEUED_CLIENT
    new_run = wait_until(
        lambda: (t := brain.store.get_task(rec.tree_id, "call")) and t.run_id != old.run_id and t.run_id,
        120,
        "the reconciler to re-send the lost call",
    )
    assert r.sismember(client_key("laptop", key_cancelled()), old.run_id or "")
    assert brain.scheduler.presence.session("laptop") is not None  # re-sent, not parked
    proxy.heal()
    done = wait_for_tree(brain, rec.tree_id, HEARTBEAT_TTL_S + VISIBILITY_TIMEOUT_S + 60)
    assert done.status is TreeStatus.DONE
    assert runs_in(ledger) == 1

    # The old message surfaces late, to an agent that restarted (its memory of calls is gone).
    # The kill waits for the new run's ack: a run killed before its ack is delivered again, by
    # design (at least once), which is not what this test is about.
    wait_until(lambda: r.hlen(LAPTOP_UNACKED) == 0, 120, "the agent to ack the new run")
    agent = stack.service("client-agent").process
    assert agent is not None
    os.killpg(agent.pid, signal.SIGKILL)
    agent.wait(30)
    # The dead agent's BRPOP lives on in Redis until the proxy closes its side: pushed before
    # that, the message goes to the dead connection and is lost (seen under load in CI) - the
    # case above, not the one this part is about.
    wait_until(
        lambda: not any(c.get("user") == client_username("laptop") for c in r.client_list()),
        120,
        "Redis to drop the killed agent's connections",
    )
    r.lpush(LAPTOP_QUEUE, as_restored(raw))
    stack.start_service("client-agent")
    log = stack.service("client-agent").log_path
    wait_until(
        lambda: f"run {old.run_id} of task call was cancelled or is no longer its run" in log.read_text(),
        120,
        "the restarted agent to refuse the old run",
    )
    # taken, refused, acked: it is never delivered again
    wait_until(
        lambda: r.llen(LAPTOP_QUEUE) == 0 and r.hlen(LAPTOP_UNACKED) == 0, 120, "the refused run to be acked"
    )
    assert runs_in(ledger) == 1  # the tool ran once
    call = brain.store.get_task(rec.tree_id, "call")
    assert call is not None and (call.state, call.run_id, call.attempt) == (TaskState.DONE, new_run, 2)


def test_cancelling_a_tree_takes_the_calls_queued_behind_a_busy_laptops_long_ones_out_of_its_queue(
    tmp_path: Path,
    behind_proxy: tuple[EmbeddedStack, FaultProxy],
    brain_factory: Callable[[EmbeddedStack], Brain],
) -> None:
    """The laptop runs two long calls (its concurrency) while three more wait in its queue. A
    cancel takes those three out at once and stops the two running (workers.call_stop): the
    laptop, free again at once, never pops the three (the link is healthy here; an offline
    laptop's queue is emptied the same way, test_client_path)."""
    stack, _ = behind_proxy
    brain = brain_factory(stack)
    r = brain.hot.r
    ledgers = tmp_path / "ledgers"
    ledgers.mkdir()
    ledger = {f"c{i}": ledgers / f"{i}.txt" for i in range(5)}
    tasks = [
        {"id": task_id, "tool": "ledger.work", "args": {"seconds": 15, "ledger": str(path)}}
        for task_id, path in ledger.items()
    ]
    rec = brain.scheduler.submit(tree({"id": "busy", "tasks": tasks}), user="ada")
    wait_until(
        lambda: sum(runs_in(path) for path in ledger.values()) == 2 and r.llen(LAPTOP_QUEUE) == 3,
        120,
        "two calls running on the laptop and three in its queue",
    )
    waiting = [t.run_id for t in brain.store.get_tasks(rec.tree_id) if not runs_in(ledger[t.task_id])]
    assert sorted(brain.sweeps.cancel(rec.tree_id)) == sorted(ledger)
    assert r.llen(LAPTOP_QUEUE) == 0

    agent_log = stack.service("client-agent").log_path
    wait_until(
        lambda: agent_log.read_text().count(") stopped after ") == 2 and r.hlen(LAPTOP_UNACKED) == 0,
        120,
        "the two long calls to be stopped and acked",
    )
    assert sum(runs_in(path) for path in ledger.values()) == 2  # the three queued never started
    assert sum(len(spans_in(path)) for path in ledger.values()) == 0  # the two never ran to their end
    log = agent_log.read_text()
    assert len(waiting) == 3 and not [run for run in waiting if run and run in log], log[-3000:]
    records = brain.store.get_tasks(rec.tree_id)
    assert {(t.state, t.result) for t in records} == {(TaskState.SKIPPED, None)}  # late results refused


def test_a_laptop_that_sleeps_past_its_ttl_and_lease_wakes_and_its_tree_ends_without_overlap(
    tmp_path: Path,
    behind_proxy: tuple[EmbeddedStack, FaultProxy],
    brain_factory: Callable[[EmbeddedStack], Brain],
) -> None:
    """SIGSTOP the agent mid-call for longer than its heartbeat TTL and the visibility timeout,
    then SIGCONT: it notices (heartbeat, re-announcement), the late result of its stale run is
    refused, the call is never run twice at once, and the tree ends with one recorded result."""
    stack, _ = behind_proxy
    brain = brain_factory(stack)
    ledger = tmp_path / "ledger.txt"
    rec, first_run = started_ledger_call(brain, "sleep", ledger, seconds=3)
    agent = stack.service("client-agent").process
    assert agent is not None
    os.killpg(agent.pid, signal.SIGSTOP)  # the lid closes
    time.sleep(VISIBILITY_TIMEOUT_S + 10)
    os.killpg(agent.pid, signal.SIGCONT)
    done = wait_for_tree(brain, rec.tree_id, 120)
    call = brain.store.get_task(rec.tree_id, "call")
    assert done.status is TreeStatus.DONE and call is not None and call.state is TaskState.DONE
    assert call.run_id != first_run  # the stale session's run was taken back, its late result refused
    spans = spans_in(ledger)
    assert 1 <= len(spans) <= 2, spans
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans)), spans  # never two at once
    assert (
        "ignored result of run " + str(first_run)
        in (stack.settings.data_dir / "logs" / "brain.log").read_text()
    )


def test_a_256_kbit_link_carrying_a_1_mb_result_keeps_the_laptop_online(
    tmp_path: Path,
    behind_proxy: tuple[EmbeddedStack, FaultProxy],
    brain_factory: Callable[[EmbeddedStack], Brain],
) -> None:
    """While a 1 MB result crawls up a 256 kbit/s link (about 33 s), the agent's heartbeats
    (TTL 2 s) share the link and get through: no false "offline", the result recorded once."""
    stack, proxy = behind_proxy
    brain = brain_factory(stack)
    # 500 kB of text: the MCP result carries it twice (a text block and structuredContent),
    # so about 1 MB crosses the link, under the 1 MiB result cap.
    size = 500_000
    proxy.bandwidth(32_000)  # 256 kbit/s each way
    started = time.monotonic()
    rec = brain.scheduler.submit(
        tree({"id": "slow-link", "tasks": [{"id": "big", "tool": "desk.big", "args": {"n": size}}]}),
        user="ada",
    )
    done = wait_for_tree(brain, rec.tree_id, 180)
    took = time.monotonic() - started
    big = brain.store.get_task(rec.tree_id, "big")
    assert big is not None
    assert done.status is TreeStatus.DONE, (big.state, big.reason, big.error)
    assert len(big.result or "") == size
    assert took >= 2 * size / 32_000 * 0.9  # it did crawl (the link, not the machine, set the pace)
    log = (stack.settings.data_dir / "logs" / "brain.log").read_text()
    assert "client laptop disconnected" not in log, log[-2000:]


def test_a_flaky_link_resetting_2_percent_of_connections_runs_500_calls_each_once(
    tmp_path: Path,
    behind_proxy: tuple[EmbeddedStack, FaultProxy],
    brain_factory: Callable[[EmbeddedStack], Brain],
) -> None:
    """Each second each of the agent's connections is reset with probability 2 % while 500 calls
    run on it: every call ends done, recorded once, and its tool ran once (a reset between the
    run and its result being written is the case that could run it twice)."""
    stack, proxy = behind_proxy
    brain = brain_factory(stack)
    ledgers = tmp_path / "ledgers"
    ledgers.mkdir()
    n = 500
    tasks = [
        {"id": f"c{i}", "tool": "ledger.work", "args": {"seconds": 0, "ledger": str(ledgers / f"{i}.txt")}}
        for i in range(n)
    ]
    proxy.flaky(0.02)
    started = time.monotonic()
    rec = brain.scheduler.submit(tree({"id": "flaky", "tasks": tasks}), user="ada")
    # 2 %/s of a handful of connections over a short run may by chance reset none: one reset
    # of them all, a fifth of the way in, makes sure the run meets at least one.
    wait_until(lambda: len(list(ledgers.iterdir())) >= n // 5, 300, "a fifth of the calls to run")
    proxy.reset()
    done = wait_for_tree(brain, rec.tree_id, 600)
    took = time.monotonic() - started
    proxy.flaky(0)
    records = brain.store.get_tasks(rec.tree_id)
    states = {r.state for r in records}
    assert done.status is TreeStatus.DONE, {
        r.task_id: (r.state, r.reason) for r in records if r.state is not TaskState.DONE
    }
    assert len(records) == n and states == {TaskState.DONE}
    runs = {i: runs_in(ledgers / f"{i}.txt") for i in range(n)}
    assert all(count == 1 for count in runs.values()), {i: c for i, c in runs.items() if c != 1}
    print(f"\n500 calls over a link resetting 2 %/s: {took:.1f} s, {proxy.stats.resets} resets")


# The suite's grace of 1 s puts the reconciler's two looks at a run 1 s apart; under CI's load
# the proxy and the agent together have taken longer than that between a pop reaching Redis and
# the agent's unacked write (seen in 2 of 6 runs beside two CPU burners: a call re-sent, twice
# for one, each answered from the agent's memory). The default grace is 10 s; 3 s here keeps
# every queued call looked at while a lag that long stays out of reach.
@pytest.mark.reconcile_grace(3.0)
def test_100_ms_each_way_times_nothing_out_and_clients_shows_the_round_trip(
    tmp_path: Path,
    behind_proxy: tuple[EmbeddedStack, FaultProxy],
    brain_factory: Callable[[EmbeddedStack], Brain],
) -> None:
    """A workstation 100 ms from the broker each way (a VPN across an ocean): calls with
    timeouts that hold at 0 ms hold here too (each a few round trips, far inside them), and
    `vancetope clients` shows the round trip the agent measures (about 200 ms)."""
    stack, proxy = behind_proxy
    brain = brain_factory(stack)
    proxy.delay(0.1)
    ledgers = tmp_path / "ledgers"
    ledgers.mkdir()
    tasks = [
        {
            "id": f"c{i}",
            "tool": "ledger.work",
            "timeout_s": 10,
            "args": {"seconds": 0.2, "ledger": str(ledgers / f"{i}.txt")},
        }
        for i in range(20)
    ]
    # Twenty calls on an agent running two at a time: most wait in its queue past the
    # reconciler's grace, and kombu pops each one a round trip before it writes it to its
    # unacked hash. A reconciler that called a run lost on one look in that gap re-sent it
    # until it failed as LostTooOften (1 run in 4). A client run now needs two looks a grace
    # apart (brain.core.second_look); a rare re-send still left is answered by the agent from
    # its memory of recent results, so each call still runs once.
    rec = brain.scheduler.submit(tree({"id": "far", "tasks": tasks}), user="ada")
    done = wait_for_tree(brain, rec.tree_id, 180)
    records = brain.store.get_tasks(rec.tree_id)
    assert done.status is TreeStatus.DONE, [
        (r.task_id, r.state, r.reason, r.error) for r in records if r.state is not TaskState.DONE
    ]
    assert all(runs_in(ledgers / f"{i}.txt") == 1 for i in range(20))
    # None re-sent twice: a run in that gap is never called lost on one look.
    assert all(r.attempt <= 2 for r in records), [(r.task_id, r.attempt) for r in records if r.attempt > 1]

    # The agent reports the median of its last five heartbeats (each one round trip):
    # wait until they were all made over the slow link.
    wait_until(
        lambda: (ms := brain.scheduler.presence.round_trips(["laptop"])["laptop"]) is not None and ms >= 190,
        120,
        "the agent to report a round trip of about 200 ms",
    )
    env = stack_env(stack.settings, stack.redis_url)
    shown = vancetope("clients", "--json", data=stack.settings.data_dir, env=env, timeout=120)
    assert shown.returncode == 0, shown.stderr
    laptop = next(c for c in json.loads(shown.stdout)["clients"] if c["client_id"] == "laptop")
    assert 190 <= laptop["round_trip_ms"] < 1000, laptop
    table = vancetope("clients", data=stack.settings.data_dir, env=env, timeout=120).stdout
    assert re.search(r"laptop .* 2\d\d ms", table), table


# --- between a call's pop and its result (client_agent.early_begin, workers.sent_ahead) ---------
# A first delivery's tool starts as its message is popped: the run's begin (the cancel check,
# the delivery count, the mark) and kombu's unacked write leave the agent before the tool
# starts, and their replies are not waited for. Each test places a fault in that stretch.


def agent_log(stack: EmbeddedStack) -> str:
    return stack.service("client-agent").log_path.read_text()


def kill_agent(stack: EmbeddedStack) -> None:
    agent = stack.service("client-agent").process
    assert agent is not None
    os.killpg(agent.pid, signal.SIGKILL)  # the agent and its MCP servers, no goodbye
    agent.wait(30)


@pytest.mark.parametrize("behind_proxy", [60.0], indirect=True)
def test_a_cancel_landing_between_a_pop_and_its_begin_is_the_only_record_and_the_late_result_is_refused(
    tmp_path: Path,
    behind_proxy: tuple[EmbeddedStack, FaultProxy],
    brain_factory: Callable[[EmbeddedStack], Brain],
) -> None:
    """1 s each way: the begin reaches Redis 2 s after the pop, and the cancel lands in
    between (the call already left the queue, so the cancel cannot take it out). The run is
    recorded once, by the cancel (skipped); the tool ran at most once, and its result, written
    when it ended, was refused."""
    stack, proxy = behind_proxy
    brain = brain_factory(stack)
    r = brain.hot.r
    ledger = tmp_path / "ledger.txt"
    proxy.delay(1.0)
    rec = one_ledger_call(brain, "raced", ledger, seconds=1)
    run = brain.store.get_task(rec.tree_id, "call").run_id
    assert run
    # Sent by the time submit returns: an empty queue means the agent's read has taken it.
    wait_until(lambda: r.llen(LAPTOP_QUEUE) == 0, 120, "the agent to pop the call")
    assert r.get(client_key("laptop", key_deliveries(run))) is None  # its begin is still on its way
    assert brain.sweeps.cancel(rec.tree_id) == ["call"]
    wait_until(
        lambda: f"run {run} of task call was cancelled or is no longer its run" in agent_log(stack),
        120,
        "the agent to learn that the run it popped was cancelled",
    )
    wait_until(lambda: r.hlen(LAPTOP_UNACKED) == 0, 120, "the popped call to be acked")
    assert runs_in(ledger) == len(spans_in(ledger)) <= 1  # at most once, and over
    call = brain.store.get_task(rec.tree_id, "call")
    assert call is not None and (call.state, call.result, call.run_id) == (TaskState.SKIPPED, None, run)
    assert r.llen(LAPTOP_QUEUE) == 0


def test_an_agent_killed_between_its_pop_and_its_unacked_write_has_the_call_run_again_and_recorded_once(
    tmp_path: Path,
    behind_proxy: tuple[EmbeddedStack, FaultProxy],
    brain_factory: Callable[[EmbeddedStack], Brain],
) -> None:
    """The reply carrying the call is the last thing through the link: nothing the agent sends
    after its pop (the unacked record, the begin, the result) reaches Redis, and the agent is
    killed. The call is in no queue and no hash; the reconciler finds it lost and it runs again
    as a new run once the agent is back: the tool ran at most twice (once on the killed agent,
    which may have started it, and once to the end), the task is recorded once."""
    stack, proxy = behind_proxy
    brain = brain_factory(stack)
    r = brain.hot.r
    ledger = tmp_path / "ledger.txt"
    proxy.cut_after(RUN_TOOL_TASK.encode())  # the headers of a popped tool call
    rec = one_ledger_call(brain, "killed", ledger, seconds=5)
    wait_until(lambda: proxy.link.cut, 120, "the call's pop to pass and the link to be cut")
    first = brain.store.get_task(rec.tree_id, "call")
    assert first is not None and first.run_id
    kill_agent(stack)
    # Written nowhere: not queued, not reserved, not begun.
    assert r.llen(LAPTOP_QUEUE) == 0 and r.hlen(LAPTOP_UNACKED) == 0
    assert r.get(client_key("laptop", key_deliveries(first.run_id))) is None
    proxy.heal()
    stack.start_service("client-agent")
    done = wait_for_tree(brain, rec.tree_id, HEARTBEAT_TTL_S + VISIBILITY_TIMEOUT_S + 120)
    assert done.status is TreeStatus.DONE
    call = brain.store.get_task(rec.tree_id, "call")
    assert call is not None and call.state is TaskState.DONE and call.run_id != first.run_id
    # Re-sent, or parked and sent again when the agent announced itself: a later attempt either way.
    assert call.attempt > first.attempt
    assert runs_in(ledger) <= 2 and len(spans_in(ledger)) == 1  # once more at most, ended once


@pytest.mark.parametrize("behind_proxy", [60.0], indirect=True)
def test_a_begin_whose_reply_is_cut_leaves_the_call_run_once_and_recorded_once(
    tmp_path: Path,
    behind_proxy: tuple[EmbeddedStack, FaultProxy],
    brain_factory: Callable[[EmbeddedStack], Brain],
) -> None:
    """The begin reaches Redis (counted, marked) and the link is cut right after it: its reply,
    and whatever the agent writes next, are lost until the link heals 3 s later. The tool runs
    once, and the result, written again after the heal, is recorded once."""
    stack, proxy = behind_proxy
    brain = brain_factory(stack)
    r = brain.hot.r
    ledger = tmp_path / "ledger.txt"
    proxy.cut_after(b":deliveries", up=True)  # the begin's INCRBY names the run's delivery counter
    rec = one_ledger_call(brain, "unanswered", ledger, seconds=1)
    wait_until(lambda: proxy.link.cut, 120, "the begin to pass and the link to be cut")
    run = brain.store.get_task(rec.tree_id, "call").run_id
    assert r.get(client_key("laptop", key_deliveries(run or ""))) == b"1"  # it landed
    time.sleep(3)  # the cut lasts a while: the reply is gone, not late
    proxy.heal()
    done = wait_for_tree(brain, rec.tree_id, VISIBILITY_TIMEOUT_S + 120)
    assert done.status is TreeStatus.DONE
    call = brain.store.get_task(rec.tree_id, "call")
    assert call is not None and call.state is TaskState.DONE and call.result is not None
    wait_until(lambda: r.hlen(LAPTOP_UNACKED) == 0, 120, "every run of the call to be acked")
    assert runs_in(ledger) == len(spans_in(ledger)) == 1


@pytest.mark.parametrize("behind_proxy", [60.0], indirect=True)
def test_a_tool_that_kills_its_agent_at_once_was_counted_and_recorded_before_it_started(
    tmp_path: Path,
    behind_proxy: tuple[EmbeddedStack, FaultProxy],
    brain_factory: Callable[[EmbeddedStack], Brain],
) -> None:
    """50 ms each way. The tool kills the agent the moment it starts; its delivery was counted
    and kombu's record of the message written all the same: both left the agent before the
    tool started, so a restored message is counted (next test) and a dead agent's call is
    found in the unacked hash, as before."""
    stack, proxy = behind_proxy
    brain = brain_factory(stack)
    r = brain.hot.r
    ledger = tmp_path / "ledger.txt"
    proxy.delay(0.05)
    call = {"id": "call", "tool": "ledger.die", "args": {"ledger": str(ledger)}}
    rec = brain.scheduler.submit(tree({"id": "poison", "tasks": [call]}), user="ada")
    agent = stack.service("client-agent").process
    assert agent is not None
    agent.wait(120)  # killed by its tool
    assert runs_in(ledger) == 1
    run = brain.store.get_task(rec.tree_id, "call").run_id or ""
    wait_until(lambda: r.get(client_key("laptop", key_deliveries(run))) == b"1", 120, "the delivery's count")
    held = wait_until(lambda: r.hvals(LAPTOP_UNACKED), 120, "kombu's record of the message")
    assert len(held) == 1 and run.encode() in held[0]


@pytest.mark.parametrize("behind_proxy", [60.0], indirect=True)
def test_a_restored_message_past_max_deliveries_fails_as_poison_without_running(
    tmp_path: Path,
    behind_proxy: tuple[EmbeddedStack, FaultProxy],
    brain_factory: Callable[[EmbeddedStack], Brain],
) -> None:
    """A message kombu put back (``redelivered``) waits for its begin's count before its tool
    starts: one whose run was delivered ``max_deliveries`` times already (its agent died each
    time) fails as a poison task, and the tool does not run."""
    stack, proxy = behind_proxy
    brain = brain_factory(stack)
    r = brain.hot.r
    ledger = tmp_path / "ledger.txt"
    rec, raw = popped_by_the_test(brain, proxy, "poison", ledger)
    run = brain.store.get_task(rec.tree_id, "call").run_id or ""
    limit = stack.settings.max_deliveries
    r.set(client_key("laptop", key_deliveries(run)), limit)  # delivered max_deliveries times already
    r.lpush(LAPTOP_QUEUE, as_restored(raw))
    proxy.heal()
    wait_until(
        lambda: f"was delivered {limit + 1} times" in agent_log(stack),
        120,
        "the agent to give the call up as a poison task",
    )
    failed = wait_until(
        lambda: (t := brain.store.get_task(rec.tree_id, "call")).state is TaskState.FAILED and t,
        120,
        "the call to be recorded failed",
    )
    assert failed.error is not None and failed.error.type == "PoisonTask"
    assert runs_in(ledger) == 0


def restart_while_it_dies(stack: EmbeddedStack, brain: Brain, tree_id: str, bound: int, ledger: Path) -> int:
    """Restart the agent each time it dies (as a service manager would) until the tree ends:
    how many times it died. ``bound``: how many deaths are too many (the test fails)."""
    deaths = 0
    while brain.store.get_tree(tree_id).status is TreeStatus.RUNNING:  # type: ignore[union-attr]
        agent = stack.service("client-agent").process
        assert agent is not None
        try:
            agent.wait(5)
        except subprocess.TimeoutExpired:
            continue  # alive: running nothing yet, waiting to retry, or the tree ended
        deaths += 1
        assert deaths <= bound, f"{deaths} deaths: {runs_in(ledger)} runs"
        stack.start_service("client-agent")  # a new session: the dead one's call is taken back
    return deaths


def crasher(brain: Brain, ledger: Path, **fields: Any) -> TreeRecord:
    """Submit, as ada, a tree of one task "call": the ledger's tool that kills its agent."""
    call = {"id": "call", "tool": "ledger.die", "args": {"ledger": str(ledger)}}
    return brain.scheduler.submit(tree({"id": "crasher", "tasks": [call], **fields}), user="ada")


def assert_nothing_more_runs(stack: EmbeddedStack, brain: Brain, ledger: Path, deaths: int) -> None:
    """The last agent stays up and is sent nothing more: its run was cancelled when taken back."""
    r = brain.hot.r
    assert stack.wait_connected("laptop", 120)
    wait_until(lambda: r.llen(LAPTOP_QUEUE) == 0 and r.hlen(LAPTOP_UNACKED) == 0, 120, "nothing held")
    assert stack.service("client-agent").process.poll() is None  # type: ignore[union-attr]
    assert runs_in(ledger) == deaths


@pytest.mark.parametrize("behind_proxy", [60.0], indirect=True)
def test_a_tool_that_kills_its_agent_every_time_fails_as_poison_after_max_deliveries_runs(
    tmp_path: Path,
    behind_proxy: tuple[EmbeddedStack, FaultProxy],
    brain_factory: Callable[[EmbeddedStack], Brain],
) -> None:
    """The tool kills its agent each time it runs, and the agent is restarted each time (as a
    service manager would). Each restart is a new session: the brain takes the call back from
    the dead one and sends it again as a new run, whose deliveries start afresh; the task's
    ``taken_back`` bounds it instead. After ``max_deliveries`` take-backs the task fails as a
    PoisonTask (no retry policy: for good), the tree ends, and the restarted agent runs
    nothing more."""
    stack, _proxy = behind_proxy
    brain = brain_factory(stack)
    ledger = tmp_path / "ledger.txt"
    limit = stack.settings.max_deliveries
    rec = crasher(brain, ledger)
    # Before the fix this never ended (a new run per restart); the bound is generous because
    # two other paths may also bring a run back under load, each bounded on its own: kombu's
    # restore of a lease that ran out before the restarted agent announced itself (counted by
    # deliveries), and the reconciler's re-send of a run whose unacked record the kill lost
    # (counted by attempts, LostTooOften).
    deaths = restart_while_it_dies(stack, brain, rec.tree_id, limit * limit, ledger)
    tasks = brain.store.get_tasks(rec.tree_id)
    assert [t.task_id for t in tasks] == ["call"]  # one record
    failed = tasks[0]
    assert failed.state is TaskState.FAILED and failed.error is not None, failed
    assert failed.error.type == "PoisonTask" and failed.taken_back == limit, failed.error
    assert f"its agent went away while running it {limit} times" in failed.error.message
    assert "'ledger.die'" in failed.error.message and "'laptop'" in failed.error.message
    assert failed.attempts == []  # one attempt: nothing retried
    # Each run noted itself and killed its agent; with nothing else bringing a run back (the
    # usual case: a restart takes seconds, a lease 30 s) that is max_deliveries runs.
    assert limit <= runs_in(ledger) == deaths
    assert_nothing_more_runs(stack, brain, ledger, deaths)


@pytest.mark.parametrize("behind_proxy", [60.0], indirect=True)
def test_a_tool_that_kills_its_agent_every_time_is_retried_as_its_policy_says_then_fails_as_poison(
    tmp_path: Path,
    behind_proxy: tuple[EmbeddedStack, FaultProxy],
    brain_factory: Callable[[EmbeddedStack], Brain],
) -> None:
    """As above, with ``retry: {max_attempts: 2, on: [unavailable]}``: the attempt given up as
    a PoisonTask at its ``max_deliveries``-th take-back is retried (as a server run's
    PoisonTask result is), the next attempt counts its own take-backs from 0 and is given up
    the same way, and that last attempt fails the task: 2 x ``max_deliveries`` runs."""
    stack, _proxy = behind_proxy
    brain = brain_factory(stack)
    ledger = tmp_path / "ledger.txt"
    limit = stack.settings.max_deliveries
    retry = {"max_attempts": 2, "on": ["unavailable"], "backoff_s": 0.5, "jitter": False}
    rec = crasher(brain, ledger, retry=retry)
    deaths = restart_while_it_dies(stack, brain, rec.tree_id, 2 * limit * limit, ledger)
    failed = brain.store.get_task(rec.tree_id, "call")
    assert failed is not None and failed.state is TaskState.FAILED and failed.error is not None, failed
    assert failed.error.type == "PoisonTask" and failed.taken_back == limit, failed.error
    assert f"its agent went away while running it {limit} times" in failed.error.message
    (first,) = failed.attempts  # the second attempt's outcome is the record's
    assert first.number == 1 and first.error is not None and first.error.type == "PoisonTask"
    assert first.error.data == {"taken_back": limit, "client": "laptop"}
    assert first.next_at is not None and first.run_id != failed.run_id
    assert 2 * limit <= runs_in(ledger) == deaths
    assert_nothing_more_runs(stack, brain, ledger, deaths)


def test_a_call_whose_agent_is_killed_once_mid_call_runs_again_and_is_done(
    tmp_path: Path,
    behind_proxy: tuple[EmbeddedStack, FaultProxy],
    brain_factory: Callable[[EmbeddedStack], Brain],
) -> None:
    """Killed once while running a 5 s call (its heartbeat lapses, or it comes back first as a
    new session: either takes the call back): counted once, below the poison bound, the call
    is sent again and its next run ends it."""
    stack, _proxy = behind_proxy
    brain = brain_factory(stack)
    ledger = tmp_path / "ledger.txt"
    rec = one_ledger_call(brain, "once", ledger, seconds=5)
    wait_until(lambda: runs_in(ledger) == 1, 120, "the call to start on the laptop")
    kill_agent(stack)  # the agent and its MCP servers, mid-call
    stack.start_service("client-agent")
    done = wait_for_tree(brain, rec.tree_id, HEARTBEAT_TTL_S + VISIBILITY_TIMEOUT_S + 120)
    call = brain.store.get_task(rec.tree_id, "call")
    assert call is not None
    assert done.status is TreeStatus.DONE, (call.state, call.reason, call.error)
    assert call.state is TaskState.DONE and call.error is None
    # Taken back once as running (0 only if the restarted agent's kombu put the message back
    # on its queue before the brain looked: a restart slower than the lease, not counted).
    assert call.taken_back <= 1
    assert call.result >= 2 and len(spans_in(ledger)) == 1  # a later run's answer; the killed one never ended


def popped_by_the_test(
    brain: Brain, proxy: FaultProxy, tree_id: str, ledger: Path
) -> tuple[TreeRecord, bytes]:
    """With the link cut, one ledger call submitted and its message popped by the test, as if
    by an agent whose pop reached Redis and whose reply the cut ate; the link stays cut."""
    r = brain.hot.r
    proxy.cut()
    # Once no BRPOP of the laptop's is pending in Redis (kombu's time out and the next ones are
    # dropped by the cut), nothing but this test takes from its queue.
    wait_until(lambda: not laptop_reads_blocked(r), 120, "the laptop's blocked reads to end")
    rec = one_ledger_call(brain, tree_id, ledger, seconds=1)
    return rec, wait_until(lambda: r.rpop(LAPTOP_QUEUE), 120, "the call in the laptop's queue")


def laptop_reads_blocked(r: redis.Redis) -> bool:
    return any(
        c.get("user") == client_username("laptop") and "b" in c.get("flags", "") for c in r.client_list()
    )
