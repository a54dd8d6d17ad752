"""Client round trip: one tool call on a connected client agent, p50 (and p99) ms.

Vancetope: the embedded stack with its own enrolled client agent (``bench-laptop``,
user ``bench``, threads pool ``-c 2`` as the agent's default) connected; one tree of a
single ``read_local_file`` task (a 20-byte file in the agent's sandbox), submitted as
an interactive session of that client, so it routes to the agent. Time: submit() ->
the store says the tree is done: the brain's dispatch, the client queue, the agent's
call, its result through its outbox and the brain's relay.

Baseline: plain Celery routed to a second worker's queue (``client.bench``, a worker
with ``-P threads -c 2`` like the agent) with ``delay().get()`` on Celery's Redis result
backend on the same redis-server; the task returns its argument.

Sides alternate call by call after a warm-up; ``calls`` each (quick 15, full 200).
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench import celery_baseline
from bench.common import BenchError, Row, bench_settings, percentile, start_vancetope
from bench.rigs import Vancetope, baseline_on
from brain.core.models import SessionKind, TaskTree
from brain.runtime.service import Brain
from brain.stack.embedded import EmbeddedStack

NAME = "client_round_trip"
CLIENT_ID = "bench-laptop"
USER = "bench"
QUEUE = f"client.{USER}"
GOAL = 1.3


def agent_config(root: Path) -> Path:
    sandbox = root / "sandbox"
    sandbox.mkdir(parents=True, exist_ok=True)
    (sandbox / "notes.txt").write_text("kept on the laptop\n")
    config = root / "agent.toml"
    config.write_text(
        "[agent]\n"
        f'client_id = "{CLIENT_ID}"\nuser = "{USER}"\nclient_type = "cli"\n'
        'broker_url = "redis://127.0.0.1:1/0"\n'  # replaced by the stack's enrolled credential
        f'sandbox_roots = ["{sandbox}"]\n'
        'log_level = "WARNING"\n'
    )
    return config


def one_call_tree() -> TaskTree:
    return TaskTree.model_validate(
        {
            "id": "client-rt",
            "tasks": [{"id": "read", "tool": "read_local_file", "args": {"path": "notes.txt"}}],
        }
    )


@contextlib.contextmanager
def client_stack(root: Path, **overrides: Any) -> Iterator[EmbeddedStack]:
    """An embedded stack in ``root`` with its brain, server pool and its own enrolled client
    agent (``bench-laptop``, see :func:`agent_config`) connected; stopped on the way out.
    ``overrides``: more settings (a registry file, say)."""
    settings = bench_settings(root, agent_config=agent_config(root), **overrides)
    stack = EmbeddedStack(settings, only=())
    try:
        with contextlib.chdir(root):
            stack.start()
        start_vancetope(stack)
        with contextlib.chdir(root):
            stack.start_service("client-agent")
        if not stack.wait_connected(CLIENT_ID, 60.0):
            raise BenchError(f"the client agent did not connect; see {settings.data_dir}/logs")
        yield stack
    finally:
        stack.stop()


def run(quick: bool = False) -> list[Row]:
    calls = 15 if quick else 200
    base_ms: list[float] = []
    vt_ms: list[float] = []
    with tempfile.TemporaryDirectory(prefix="vancetope-bench-") as tmp, client_stack(Path(tmp)) as stack:
        brain = Brain.connect(stack.settings, stack.redis_url)
        vt = Vancetope(stack, brain)
        try:
            with baseline_on(stack, queue=QUEUE, result_backend=True, pool="threads") as celery:
                for i in range(calls + 3):
                    t0 = time.perf_counter()
                    got = celery.app.send_task(celery_baseline.ECHO_TASK, args=[f"v{i}"], queue=QUEUE).get(
                        timeout=30
                    )
                    b = time.perf_counter() - t0
                    if got != f"v{i}":
                        raise BenchError(f"baseline echo returned {got!r}")
                    _, _, v = _client_call(vt)
                    if i >= 3:  # the first three of each side warm up
                        base_ms.append(b * 1000)
                        vt_ms.append(v * 1000)
        finally:
            vt.close()
            brain.close()
    return [
        Row(
            benchmark=NAME,
            metric="ms p50",
            baseline=percentile(base_ms, 50),
            vancetope=percentile(vt_ms, 50),
            kind="latency",
            baseline_label="plain Celery to a 2nd worker's queue, delay().get()",
            goal=GOAL,
            extra={
                "calls": calls,
                "baseline_p99": percentile(base_ms, 99),
                "vancetope_p99": percentile(vt_ms, 99),
            },
            notes=(
                f"{calls} calls each, alternating; p99 {percentile(base_ms, 99):.1f} vs {percentile(vt_ms, 99):.1f} ms. "
                "Vancetope: submit of a 1-task tree (read_local_file) -> tree done, via the agent"
            ),
        )
    ]


def _client_call(vt: Vancetope) -> tuple[object, float, float]:
    """One client call: a one-task interactive tree of the agent's client, submit -> done."""
    return vt.run_tree(one_call_tree(), 30.0, session=SessionKind.INTERACTIVE, client_id=CLIENT_ID)


if __name__ == "__main__":
    for row in run(quick=True):
        print(row, f"ratio {row.ratio:.2f}")
