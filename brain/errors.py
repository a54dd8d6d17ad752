"""The brain's exception hierarchy (layer: brain). One root, subclasses that carry fields.

Messages name the file, the task or tool, the field, and what to do.
"""

from __future__ import annotations


class BrainError(Exception):
    """Root of every error the brain raises on purpose."""


class ConfigError(BrainError):
    """A configuration value or file is wrong."""


class InvalidFile(BrainError):
    """A tree or registry file cannot be read or parsed (YAML/JSON syntax, not a mapping)."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"{path}: {problem}")


class InvalidTaskTree(BrainError):
    """A task tree fails validation. ``problems`` lists every finding, one line each."""

    def __init__(self, path: str, problems: list[str]) -> None:
        self.path = path
        self.problems = problems
        listing = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{path}: invalid task tree ({len(problems)} problem(s)):\n{listing}")


class InvalidRegistry(BrainError):
    """A tool registry file fails validation."""

    def __init__(self, path: str, problems: list[str]) -> None:
        self.path = path
        self.problems = problems
        listing = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{path}: invalid tool registry ({len(problems)} problem(s)):\n{listing}")


class StackNotRunning(BrainError):
    """No Vancetope stack (Redis + brain + workers) answers at the configured address."""


class StackAlreadyRunning(BrainError):
    """A stack already runs with this data dir: a second would share its Redis files."""


class StoreError(BrainError):
    """The durable store failed or was given something it cannot hold."""


class BadQuery(BrainError):
    """A web page's query parameter is malformed; the page answers 400 with this message."""


class NotFound(BrainError):
    """An operation (cancel, approve) named a tree, task or client the stack does not know."""


class TreeNotFound(NotFound):
    def __init__(self, tree_id: str) -> None:
        self.tree_id = tree_id
        super().__init__(f"no task tree with id {tree_id!r} in the store (see `vancetope status`)")


class TaskNotFound(NotFound):
    # Named, not listed, beyond this many: a fan-out's tree has thousands of tasks.
    SHOWN = 20

    def __init__(self, tree_id: str, task_id: str, known: list[str]) -> None:
        self.tree_id, self.task_id = tree_id, task_id
        listed = ", ".join(known[: self.SHOWN]) + (
            f" and {len(known) - self.SHOWN} more" if len(known) > self.SHOWN else ""
        )
        super().__init__(f"tree {tree_id!r} has no task {task_id!r}; its tasks: {listed or 'none'}")


class ToolNotHeld(NotFound):
    """approve-tools named a tool the client does not hold back for approval."""

    def __init__(self, client_id: str, tools: list[str]) -> None:
        self.client_id, self.tools = client_id, tools
        super().__init__(
            f"client {client_id!r} holds no changed tool {', '.join(tools)}; see `vancetope clients`"
        )
