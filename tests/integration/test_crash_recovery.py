"""Crashes heal within the documented bound (issue 8): real processes SIGKILLed mid-tree.

Work reserved by a consumer that died is back on its queue within
``visibility_timeout_s`` (here 10 s) + kombu's restore sweep (5 s), because live
workers renew the lease of every message they hold (workers.lease); a long call on a
live worker is never re-delivered. After each fault: every task done, recorded once.
The waits below are generous upper bounds for a slow machine; the old behaviour (one
hour in kombu's ``unacked``) fails them all.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from brain.core.models import SessionKind, TaskState, TreeStatus
from brain.core.retry import RetryOn, RetryPolicy
from brain.runtime.service import Brain
from brain.stack.embedded import EmbeddedStack
from tests.conftest import server_runs_started, tree, wait_for_tree, wait_until, waiting_on
from tests.integration.test_client_path import make_agent
from workers.contracts import pool_queue

pytestmark = pytest.mark.integration

VISIBILITY_S = 10
RECOVERY_BOUND_S = 60  # 10 s + 5 s and the calls themselves, on a loaded machine; far below an hour


def sleeps(n: int, seconds: float, tree_id: str = "crash") -> Any:
    return tree(
        {
            "id": tree_id,
            "tasks": [{"id": f"s{i}", "tool": "sleep", "args": {"seconds": seconds}} for i in range(n)],
        }
    )


def kill(stack: EmbeddedStack, name: str) -> None:
    service = stack.service(name)
    assert service.process is not None
    os.killpg(service.process.pid, signal.SIGKILL)
    service.process.wait(10)
    stack.services.remove(service)


def kill_redis(stack: EmbeddedStack) -> None:
    assert stack.redis is not None and stack.redis.process is not None
    stack.redis.process.kill()
    stack.redis.process.wait(10)


def deliveries(brain: Brain, tree_id: str) -> dict[str, int]:
    """How often a server worker began each task's current run (the store counts them)."""
    return {t.task_id: t.deliveries for t in brain.store.get_tasks(tree_id)}


def test_a_call_longer_than_the_visibility_timeout_on_a_live_worker_runs_once(
    stack_factory: Callable[..., EmbeddedStack], brain_factory: Callable[[EmbeddedStack], Brain]
) -> None:
    stack = stack_factory(visibility_timeout_s=VISIBILITY_S, server_concurrency=1)
    brain = brain_factory(stack)
    rec = brain.scheduler.submit(sleeps(1, 2.5 * VISIBILITY_S, "long"))
    done = wait_for_tree(brain, rec.tree_id, timeout=RECOVERY_BOUND_S)
    assert done.status is TreeStatus.DONE
    assert deliveries(brain, rec.tree_id) == {"s0": 1}  # its lease was renewed, never restored


def test_work_reserved_by_a_killed_server_pool_is_resent_and_recorded_once(
    stack_factory: Callable[..., EmbeddedStack], brain_factory: Callable[[EmbeddedStack], Brain]
) -> None:
    stack = stack_factory(visibility_timeout_s=VISIBILITY_S, server_concurrency=2)
    brain = brain_factory(stack)
    rec = brain.scheduler.submit(sleeps(6, 3.0))

    def running() -> int:
        return len(server_runs_started(brain, rec.tree_id))

    wait_until(lambda: running() >= 1, timeout=120, what="the pool to start a call")
    kill(stack, "server-pool")
    # Nothing consumes `server` now: the killed pool's reserved messages sit in `unacked`.
    stack.start_service("server-pool")
    done = wait_for_tree(brain, rec.tree_id, timeout=RECOVERY_BOUND_S)
    tasks = brain.store.get_tasks(rec.tree_id)
    assert done.status is TreeStatus.DONE, {t.task_id: (t.state.value, t.reason) for t in tasks}
    assert all(t.state is TaskState.DONE and t.result is not None for t in tasks)


def test_work_reserved_by_a_killed_named_pool_comes_back_to_that_pools_queue_only(
    tmp_path: Path,
    stack_factory: Callable[..., EmbeddedStack],
    brain_factory: Callable[[EmbeddedStack], Brain],
) -> None:
    registry = tmp_path / "registry.yaml"
    registry.write_text("tools:\n  - name: sleep\n    location: server\n    pool: gpu\n")
    stack = stack_factory(
        services=("brain", "server-pool", "server-pool-gpu"),
        registry=registry,
        pools=[{"name": "gpu", "concurrency": 1}],
        visibility_timeout_s=VISIBILITY_S,
    )
    brain = brain_factory(stack)
    rec = brain.scheduler.submit(sleeps(2, 3.0, "gpu-crash"))
    wait_until(
        lambda: server_runs_started(brain, rec.tree_id), timeout=120, what="the gpu pool to start a call"
    )
    kill(stack, "server-pool-gpu")
    # The leases lapse and a live consumer (the brain) restores the message to `server.gpu`; the
    # default pool, still running, never takes it.
    wait_until(
        lambda: waiting_on(brain.hot.r, pool_queue("gpu")) == 2,
        timeout=RECOVERY_BOUND_S,
        what="both calls back on server.gpu",
    )
    # The run the killed pool had begun is still running in the record (the store cannot know its
    # worker died) until its redelivery begins it again; the other one was never begun.
    states = sorted(t.state.value for t in brain.store.get_tasks(rec.tree_id))
    assert states in (["queued_server", "running"], ["running", "running"]), states
    stack.start_service("server-pool-gpu")
    done = wait_for_tree(brain, rec.tree_id, timeout=RECOVERY_BOUND_S)
    tasks = brain.store.get_tasks(rec.tree_id)
    assert done.status is TreeStatus.DONE, {t.task_id: (t.state.value, t.reason) for t in tasks}
    assert all(t.worker.startswith("server-gpu@") and t.route == "server:gpu" for t in tasks)


def test_a_result_stranded_by_a_killed_brain_is_recorded_after_it_restarts(
    stack_factory: Callable[..., EmbeddedStack], brain_factory: Callable[[EmbeddedStack], Brain]
) -> None:
    stack = stack_factory(visibility_timeout_s=VISIBILITY_S, server_concurrency=2)
    brain = brain_factory(stack)
    n = 300
    rec = brain.scheduler.submit(
        tree(
            {
                "id": "burst",
                "tasks": [{"id": f"e{i}", "tool": "echo", "args": {"value": i}} for i in range(n)],
            }
        )
    )

    def recorded() -> int:
        return sum(1 for s in brain.store.task_states(rec.tree_id).values() if s is TaskState.DONE)

    wait_until(lambda: recorded() >= n // 10, timeout=120, what="the brain to record some results")
    kill(stack, "brain")
    stack.start_service("brain")
    done = wait_for_tree(brain, rec.tree_id, timeout=RECOVERY_BOUND_S)
    assert done.status is TreeStatus.DONE
    tasks = brain.store.get_tasks(rec.tree_id)
    assert sorted(t.result for t in tasks) == list(range(n))  # each recorded, none twice


def test_an_agent_killed_mid_call_and_restarted_at_once_gets_its_old_sessions_calls_back(
    tmp_path: Path,
    stack_factory: Callable[..., EmbeddedStack],
    brain_factory: Callable[[EmbeddedStack], Brain],
) -> None:
    # shell_execute waits for its client here (the example registry skips it when offline), so
    # whichever path takes the calls back (the new session, or the lapsed heartbeat) they run.
    registry = tmp_path / "registry.yaml"
    registry.write_text(
        "tools:\n  - {name: shell_execute, location: client, type: native, offline_strategy: queue}\n"
    )
    stack = stack_factory(
        visibility_timeout_s=VISIBILITY_S, registry=registry, agent_config=make_agent(tmp_path, shell=True)
    )
    brain = brain_factory(stack)
    wait_until(lambda: brain.scheduler.presence.session("laptop"), timeout=120, what="the agent to connect")
    rec = brain.scheduler.submit(
        tree(
            {
                "id": "agent-crash",
                "tasks": [
                    {"id": f"c{i}", "tool": "shell_execute", "args": {"command": "sleep 2; echo ok"}}
                    for i in range(4)
                ],
            }
        ),
        session=SessionKind.INTERACTIVE,
        client_id="laptop",
    )
    wait_until(
        lambda: brain.hot.running(rec.tree_id, {"laptop"}), timeout=120, what="the agent to start a call"
    )
    kill(stack, "client-agent")
    stack.start_service("client-agent")  # back well within its heartbeat TTL
    done = wait_for_tree(brain, rec.tree_id, timeout=RECOVERY_BOUND_S)
    tasks = brain.store.get_tasks(rec.tree_id)
    assert done.status is TreeStatus.DONE, {t.task_id: (t.state.value, t.reason) for t in tasks}
    assert all(t.client_id == "laptop" for t in tasks)


def test_redis_killed_mid_tree_and_restarted_on_its_data_loses_nothing(
    stack_factory: Callable[..., EmbeddedStack], brain_factory: Callable[[EmbeddedStack], Brain]
) -> None:
    stack = stack_factory(visibility_timeout_s=VISIBILITY_S, server_concurrency=2)
    brain = brain_factory(stack)
    # Each call may take 45 s (its soft time limit 55 s): what this test holds is that nothing
    # is lost or recorded twice. A worker whose Redis vanished mid-call can spend ~40 s in
    # redis-py's retries while it records its result (seen in CI under load); the 30 s default
    # timeout then failed 1-second sleeps with SoftTimeLimitExceeded.
    # Still seen twice in CI under load (2026-12-02): a call running when Redis died ended
    # SoftTimeLimitExceeded after 55 s. A night batch that must survive a Redis restart says
    # so with a retry policy (issue 23); the test holds that, with it, nothing is lost or
    # recorded twice. Why a worker stalls that long is open (issue 25's notes).
    spec = sleeps(8, 1.0, "redis-crash")
    retry = RetryPolicy(max_attempts=3, backoff_s=1, on=[RetryOn.TIMEOUT, RetryOn.UNAVAILABLE])
    rec = brain.scheduler.submit(
        spec.model_copy(
            update={"tasks": [t.model_copy(update={"timeout_s": 45, "retry": retry}) for t in spec.tasks]}
        )
    )
    wait_until(lambda: server_runs_started(brain, rec.tree_id), timeout=120, what="the pool to start a call")
    kill_redis(stack)
    stack.restart_redis()  # same port, same AOF: what `vancetope up` does
    # A stalled call's second attempt comes after its time limit: the bound is twice the usual.
    done = wait_for_tree(brain, rec.tree_id, timeout=2 * RECOVERY_BOUND_S)
    tasks = brain.store.get_tasks(rec.tree_id)
    assert done.status is TreeStatus.DONE, {t.task_id: (t.state.value, t.reason) for t in tasks}
    assert {t.task_id for t in tasks} == {f"s{i}" for i in range(8)}  # each recorded once


# --- the fault suite: one victim per run, killed at a random moment of a mixed tree -------

FAULT_SEED = int(os.environ.get("VANCETOPE_FAULT_SEED", "20261130"))


def mixed_tree(name: str) -> Any:
    """Fan-out of server sleeps and client reads, a fan-in, then a chain: every shape of hand-off."""
    layer = [{"id": f"w{i}", "tool": "sleep", "args": {"seconds": 1.0}} for i in range(4)]
    reads = [{"id": f"r{i}", "tool": "read_local_file", "args": {"path": "notes.txt"}} for i in range(2)]
    fan_in = {
        "id": "join",
        "tool": "text_transform",
        "depends_on": [t["id"] for t in layer + reads],
        "args": {"op": "upper", "text": "${tasks.r0.result.content}"},
    }
    chain = [
        {
            "id": f"c{i}",
            "tool": "sleep",
            "depends_on": ["join" if i == 0 else f"c{i - 1}"],
            "args": {"seconds": 0.5},
        }
        for i in range(3)
    ]
    return tree({"id": name, "tasks": [*layer, *reads, fan_in, *chain]})


def restart(stack: EmbeddedStack, victim: str) -> None:
    if victim != "redis-server":
        kill(stack, victim)
        stack.start_service(victim)
        return
    kill_redis(stack)
    stack.restart_redis()


@pytest.mark.parametrize("victim", ["server-pool", "brain", "client-agent", "redis-server"])
def test_fault_suite_any_one_process_killed_at_a_random_moment_and_the_tree_still_finishes_right(
    victim: str,
    tmp_path: Path,
    stack_factory: Callable[..., EmbeddedStack],
    brain_factory: Callable[[EmbeddedStack], Brain],
) -> None:
    rng = random.Random(f"{FAULT_SEED}-{victim}")
    delay = rng.uniform(0.5, 4.0)
    stack = stack_factory(visibility_timeout_s=VISIBILITY_S, agent_config=make_agent(tmp_path))
    brain = brain_factory(stack)
    wait_until(lambda: brain.scheduler.presence.session("laptop"), timeout=120, what="the agent to connect")
    rec = brain.scheduler.submit(mixed_tree(f"fault-{victim}"), user="ada")
    time.sleep(delay)  # the random moment of the fault (seed VANCETOPE_FAULT_SEED)
    restart(stack, victim)
    where = f"victim {victim} killed {delay:.2f}s into the tree (VANCETOPE_FAULT_SEED={FAULT_SEED})"
    done = wait_for_tree(brain, rec.tree_id, timeout=RECOVERY_BOUND_S + 30)
    tasks = {t.task_id: t for t in brain.store.get_tasks(rec.tree_id)}
    assert done.status is TreeStatus.DONE, (where, {k: (t.state.value, t.reason) for k, t in tasks.items()})
    # every task in exactly one final state, with its result recorded
    assert all(t.state is TaskState.DONE and t.finished_at for t in tasks.values()), where
    assert tasks["join"].result == "KEPT ON THE LAPTOP\n", where
    # no dependent started before every one of its dependencies had finished
    spec = {t.id: t for t in mixed_tree("x").tasks}
    for task_id, t in tasks.items():
        for dep in spec[task_id].depends_on:
            assert t.started_at is not None and t.started_at >= tasks[dep].finished_at, (where, task_id, dep)
