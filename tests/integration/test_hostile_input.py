"""Hostile input on the queues (issue 7): garbage pushed onto ``server``, ``brain`` and a
client's queue with a raw LPUSH stops none of the real consumers reading them.

One embedded stack: redis-server, the brain worker, the server pool and a real client agent.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from brain.core.models import SessionKind, TaskState, TreeStatus
from tests.conftest import tree, wait_for_tree, wait_until
from tests.integration.test_client_path import make_agent
from workers.contracts import BRAIN_QUEUE, MAX_MESSAGE_BYTES, SERVER_QUEUE, client_key, client_queue

pytestmark = pytest.mark.integration

GARBAGE = [
    b"not json at all",
    b"\xff\xfe\x00 not even utf-8",
    b"{}",
    b'{"body": 1, "properties": []}',
    b"[" * 10_000 + b"]" * 10_000,
]
# Larger than any consumer accepts: Redis itself refuses it (proto-max-bulk-len is the message
# limit, brain.stack.redis_server.RedisLimits), so it never reaches a queue; the consumers' own check
# stands behind it for a Redis run without that limit.
OVERSIZED = b'"' + b"x" * (MAX_MESSAGE_BYTES + 1) + b'"'


def test_garbage_on_every_queue_is_dropped_and_logged_and_every_consumer_keeps_working(
    tmp_path: Path, stack_factory, brain_factory
) -> None:
    stack = stack_factory(agent_config=make_agent(tmp_path))
    brain = brain_factory(stack)
    wait_until(lambda: brain.scheduler.presence.session("laptop"), timeout=120, what="agent announcement")
    keys = {
        SERVER_QUEUE: SERVER_QUEUE,
        BRAIN_QUEUE: BRAIN_QUEUE,
        client_queue("laptop"): client_key("laptop", client_queue("laptop")),
    }
    r = brain.hot.r
    for key in keys.values():
        with pytest.raises(redis.ConnectionError):
            r.lpush(key, OVERSIZED)
        r.lpush(key, *GARBAGE)
    wait_until(
        lambda: all(r.llen(key) == 0 for key in keys.values()), timeout=120, what="the garbage to be popped"
    )

    rec = brain.scheduler.submit(
        tree(
            {
                "id": "after-garbage",
                "tasks": [
                    {"id": "on_server", "tool": "add", "args": {"a": 2, "b": 40}},
                    {"id": "on_client", "tool": "read_local_file", "args": {"path": "notes.txt"}},
                ],
            }
        ),
        session=SessionKind.INTERACTIVE,
        client_id="laptop",
    )
    assert wait_for_tree(brain, rec.tree_id, timeout=120).status is TreeStatus.DONE
    tasks = {t.task_id: t for t in brain.store.get_tasks(rec.tree_id)}
    assert tasks["on_server"].result == 42 and tasks["on_server"].attempt == 1
    assert tasks["on_client"].state is TaskState.DONE and tasks["on_client"].client_id == "laptop"
    assert "kept on the laptop" in str(tasks["on_client"].result)

    consumers = {"server-pool": SERVER_QUEUE, "brain": BRAIN_QUEUE, "client-agent": client_queue("laptop")}
    for name, queue in consumers.items():
        service = next(s for s in stack.services if s.name == name)
        assert service.process is not None and service.process.poll() is None, f"{name} exited"
        assert service.log_path is not None
        log = service.log_path.read_text(errors="replace")
        assert log.count(f"dropped a message from queue {queue!r}") == len(GARBAGE), (name, log[-3000:])
