"""The live view of `vancetope run` when Redis goes away (brain.cli.watch): it retries, then gives
up naming the tree, which goes on (a real Redis, stopped under it)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from rich.console import Console

from brain.cli.watch import REDIS_RETRY_FOR_S, watch
from brain.core.models import Location
from brain.core.snapshot import RegistrySnapshot
from brain.core.treefile import spec_from_descriptor
from brain.errors import StackNotRunning
from brain.runtime.service import Brain
from brain.stack.redis_server import RedisServer
from tests.conftest import make_settings, tree
from workers.tools.builtin import builtin_descriptors

pytestmark = pytest.mark.integration


def test_giving_up_on_redis_names_the_tree_and_says_it_goes_on(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis").start()
    builtins = {d.name: spec_from_descriptor(d, Location.SERVER) for d in builtin_descriptors()}
    brain = Brain.connect(make_settings(tmp_path), server.url, RegistrySnapshot(tools=builtins))
    try:
        # No server pool runs: the task stays queued while Redis goes away.
        rec = brain.scheduler.submit(
            tree({"id": "w", "tasks": [{"id": "a", "tool": "echo", "args": {"value": 1}}]})
        )
        server.stop()
        ticks = itertools.count(step=REDIS_RETRY_FOR_S / 2)  # each look at the clock: a minute later
        out = Console(record=True, width=200)
        with pytest.raises(StackNotRunning) as raised:
            watch(brain, rec.tree_id, None, out, out, clock=lambda: float(next(ticks)))
    finally:
        brain.close()
        server.stop()
    message = str(raised.value)
    assert message.startswith("cannot reach Redis at ")
    assert (
        f"The tree {rec.tree_id} goes on once the stack is back: `vancetope status {rec.tree_id}`" in message
    )
    assert ".;" not in message
