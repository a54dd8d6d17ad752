"""A worker knows its stack is gone when the kernel gave it another parent (workers.orphans)."""

from __future__ import annotations

import os

import pytest

from workers.orphans import STACK_PID_VARIABLE, stack_gone


@pytest.mark.parametrize(
    "env, gone",
    [
        ({}, False),  # not started by a stack (a worker an operator runs): never killed
        ({STACK_PID_VARIABLE: ""}, False),
        ({STACK_PID_VARIABLE: "not-a-pid"}, False),
        ({STACK_PID_VARIABLE: str(os.getppid())}, False),  # its stack is still its parent
        ({STACK_PID_VARIABLE: str(os.getppid() + 1)}, True),  # another parent: the stack died
    ],
)
def test_stack_gone_only_when_the_stack_that_started_the_worker_is_no_longer_its_parent(
    env: dict[str, str], gone: bool
) -> None:
    assert stack_gone(env) is gone
