"""Two live brains on one Redis and one store (issue 28, item 2): both take work; one SIGKILLed
in the middle of a tree of client calls, with parked work waiting for a second workstation,
and the other carries everything to the end within 30 s of the kill, nothing twice; a
schedule fired with two brains starts one run per fire, summarised once.

Real processes: redis-server, two brain workers (``brain@%h`` and ``brain2@%h``, the stack's
``brain-2``), the server pool, Celery beat, and two client agents whose calls go to the ledger
MCP server (tests/fixtures/mcp_ledger_server.py): each call notes its start in a file of its
own, so "executed once" is counted from the tool's record, not from the brain's. The waits
are generous bounds for a loaded machine; the one timing assertion is the issue's 30 s.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench.scale_out import recorded_results
from brain.core.models import TaskState, TreeRecord, TreeStatus
from brain.runtime.enrollment import enroll
from brain.runtime.service import Brain
from brain.stack.children import dies_with_this_process
from brain.stack.embedded import EmbeddedStack, agent_env
from tests.conftest import EXAMPLES, agent_with_servers, tree, wait_for_tree, wait_until, write_mcp_config
from tests.integration.test_crash_recovery import kill
from tests.integration.test_link_faults import ledger_server, runs_in
from tests.integration.test_schedule_runs import local_webhook
from tests.integration.test_schedules_stack import finished, runs_by, write_tree

pytestmark = pytest.mark.integration

TAKEOVER_S = 30.0  # the bound, from the kill to the last tree ended
VISIBILITY_S = 10  # a message the killed brain had reserved is back within 10 s + 5 s


def ledger_registry(tmp_path: Path) -> Path:
    """The example registry plus the ledger's tool as a client tool: while no client of the
    tree's user is connected, its calls park (pending_client)."""
    registry = yaml.safe_load((EXAMPLES / "registry.yaml").read_text())
    registry["tools"].append({"name": "ledger.work", "location": "client", "mcp_server": "ledger"})
    path = tmp_path / "registry.yaml"
    path.write_text(yaml.safe_dump(registry))
    return path


def ledger_calls(
    prefix: str, ledgers: Path, n: int, seconds: float, after: list[str] | None = None
) -> list[dict[str, Any]]:
    return [
        {
            "id": f"{prefix}{i}",
            "tool": "ledger.work",
            "args": {"seconds": seconds, "ledger": str(ledgers / f"{prefix}{i}.txt")},
            **({"depends_on": after} if after else {}),
        }
        for i in range(n)
    ]


def start_brain_2(stack: EmbeddedStack) -> None:
    service = stack.start_service("brain-2")
    assert service.log_path is not None
    log = service.log_path

    def ready() -> bool:
        assert service.process is not None and service.process.poll() is None, log.read_text(errors="replace")
        return "brain ready" in log.read_text(errors="replace")

    wait_until(ready, timeout=120, what="the second brain to be ready")


@contextmanager
def second_workstation(tmp_path: Path, brain: Brain, stack: EmbeddedStack) -> Iterator[Callable[[], None]]:
    """Client "desk" of user bob, enrolled, with the ledger server; yields its start (it is
    offline until then), and stops it at the end."""
    home = tmp_path / "desk"
    home.mkdir()
    config = agent_with_servers(home, {"ledger": ledger_server()})
    text = config.read_text().replace('client_id = "laptop"', 'client_id = "desk"')
    config.write_text(text.replace('user = "ada"', 'user = "bob"'))
    assert stack.redis is not None
    url = enroll(brain.scheduler.presence, "desk", "bob", stack.redis.address_url).broker_url
    started: list[subprocess.Popen[bytes]] = []

    def start() -> None:
        argv = [sys.executable, "-m", "client_agent", "run", "--config", str(config)]
        with (home / "agent.log").open("wb") as out:
            started.append(
                subprocess.Popen(
                    dies_with_this_process(argv),
                    env=agent_env(url),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )

    try:
        yield start
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait(10)


@pytest.mark.parametrize("victim", ["brain", "brain-2"])
def test_two_brains_both_take_work_and_one_killed_mid_tree_the_other_ends_it_within_30s_nothing_twice(
    victim: str,
    tmp_path: Path,
    stack_factory: Callable[..., EmbeddedStack],
    brain_factory: Callable[[EmbeddedStack], Brain],
) -> None:
    stack = stack_factory(
        services=("brain", "server-pool", "client-agent"),
        registry=ledger_registry(tmp_path),
        agent_config=agent_with_servers(tmp_path, {"ledger": ledger_server()}),
        visibility_timeout_s=VISIBILITY_S,
    )
    brain = brain_factory(stack)
    assert stack.wait_connected("laptop", 120)
    start_brain_2(stack)
    ledgers = tmp_path / "ledgers"
    ledgers.mkdir()

    # Both take work: the laptop's results are popped from its outbox by whichever brain's
    # relay is first; each brain's "task-succeeded" event for the call names its pid.
    pids = {stack.service(name).process.pid for name in ("brain", "brain-2")}  # type: ignore[union-attr]
    with recorded_results(stack.redis_url, "laptop") as counter:
        for round_ in range(5):
            warm = brain.scheduler.submit(
                tree({"id": f"warm{round_}", "tasks": ledger_calls(f"w{round_}-", ledgers, 20, 0)}),
                user="ada",
            )
            assert wait_for_tree(brain, warm.tree_id, 120).status is TreeStatus.DONE
            expected = 20 * (round_ + 1)
            wait_until(
                lambda n=expected: sum(counter.snapshot()[0].values()) >= n, 120, "the warm-up's events"
            )
            if len(counter.snapshot()[0]) == 2:
                break
        by_pid = counter.snapshot()[0]
    assert set(by_pid) == pids and all(by_pid.values()), f"results recorded per brain pid: {dict(by_pid)}"

    # A tree of client calls on the laptop, and bob's work parked for his desk (offline).
    work = ledger_calls("a", ledgers, 6, 1.0)
    chain = ledger_calls("c", ledgers, 1, 0.5, after=[t["id"] for t in work])
    for i in range(1, 3):
        chain += ledger_calls(f"c{i}-", ledgers, 1, 0.5, after=[chain[-1]["id"]])
    on_laptop = brain.scheduler.submit(tree({"id": "laptop-tree", "tasks": work + chain}), user="ada")
    with second_workstation(tmp_path, brain, stack) as start_desk:
        parked = brain.scheduler.submit(
            tree({"id": "desk-tree", "tasks": ledger_calls("p", ledgers, 3, 0.2)}), user="bob"
        )
        wait_until(
            lambda: set(brain.store.task_states(parked.tree_id).values()) == {TaskState.PENDING_CLIENT},
            120,
            "bob's work to park",
        )
        wait_until(
            lambda: sum(runs_in(ledgers / f"a{i}.txt") for i in range(6)) >= 2,
            120,
            "the laptop to start some calls",
        )
        killed_at = time.time()
        kill(stack, victim)
        start_desk()  # announced to the brain still alive, which requeues bob's parked work
        trees: list[TreeRecord] = [wait_for_tree(brain, t.tree_id, 120) for t in (on_laptop, parked)]

    for rec in trees:
        tasks = brain.store.get_tasks(rec.tree_id)
        assert rec.status is TreeStatus.DONE, {t.task_id: (t.state.value, t.reason) for t in tasks}
        assert rec.finished_at is not None and rec.finished_at - killed_at <= TAKEOVER_S, (
            f"tree {rec.tree_id} ended {rec.finished_at - killed_at:.1f}s after the kill"
        )
        for t in tasks:
            # recorded once, and the tool ran once: its own ledger holds one start
            assert t.state is TaskState.DONE and t.result == 1, (t.task_id, t.state.value, t.result)
            assert runs_in(ledgers / f"{t.task_id}.txt") == 1, t.task_id
    assert {t.client_id for t in brain.store.get_tasks(parked.tree_id)} == {"desk"}
    assert {t.client_id for t in brain.store.get_tasks(on_laptop.tree_id)} == {"laptop"}


def test_a_schedule_fired_with_two_brains_starts_one_run_per_fire_and_summarises_each_once(
    tmp_path: Path,
    stack_factory: Callable[..., EmbeddedStack],
    brain_factory: Callable[[EmbeddedStack], Brain],
) -> None:
    write_tree(tmp_path, "tick", "{id: hello, tool: echo, args: {value: tick}}")
    with local_webhook() as (url, received):
        (tmp_path / "vancetope.toml").write_text(
            f'[[schedules]]\nname = "tick"\ntree = "tick.yaml"\nevery_s = 1\noverlap = "allow"\nsummary_webhook = "{url}"\n'
        )
        stack = stack_factory(
            services=("brain", "server-pool", "beat"),
            mcp_config=write_mcp_config(tmp_path / "server-mcp.json", {}),
        )
        brain = brain_factory(stack)
        start_brain_2(stack)
        wait_until(lambda: len(finished(runs_by(brain, "tick"))) >= 8, 120, "eight finished runs of tick")
        beat = stack.service("beat")
        beat.process.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        beat.process.wait(120)  # type: ignore[union-attr]
        fires = (stack.settings.data_dir / "logs" / "beat.log").read_text().count("schedule 'tick' fired")
        wait_until(lambda: len(finished(runs_by(brain, "tick"))) == fires, 120, f"{fires} runs to finish")
        runs = runs_by(brain, "tick")
        assert len(runs) == fires and len({r.tree_id for r in runs}) == fires
        assert all(r.status is TreeStatus.DONE for r in runs)
        wait_until(lambda: len(received) >= fires, 120, f"{fires} summaries posted")
        time.sleep(3 * stack.settings.reconcile_interval_s)  # a second summary would come by now
        posted = sorted((r["tree_id"], r["kind"]) for r in received)
        assert len(posted) == len(set(posted)) == fires, posted
