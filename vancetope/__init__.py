"""Vancetope's Python API: submit task trees and follow them from a program.

    import vancetope

    with vancetope.connect() as vt:
        report = vt.run("examples/night-batch.yaml", timeout=300)

See ``brain.api`` for the whole surface, and docs/python-api.md.
"""

from brain.api import TimedOut, TreeReport, TreeRun, Vancetope, connect, embedded
from brain.core.limits import TreeRefused
from brain.core.models import SessionKind, TaskRecord, TaskSpec, TaskState, TaskTree, TreeRecord, TreeStatus
from brain.errors import BrainError, InvalidFile, InvalidTaskTree, StackNotRunning, StoreError, TreeNotFound
from workers.contracts import SUBMIT_QUEUE, SUBMIT_TREE_TASK, submit_queue_of

__all__ = [
    "SUBMIT_QUEUE",
    "SUBMIT_TREE_TASK",
    "BrainError",
    "InvalidFile",
    "InvalidTaskTree",
    "SessionKind",
    "StackNotRunning",
    "StoreError",
    "TaskRecord",
    "TaskSpec",
    "TaskState",
    "TaskTree",
    "TimedOut",
    "TreeNotFound",
    "TreeRecord",
    "TreeRefused",
    "TreeReport",
    "TreeRun",
    "TreeStatus",
    "Vancetope",
    "connect",
    "embedded",
    "submit_queue_of",
]
