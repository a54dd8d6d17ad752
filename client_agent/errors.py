"""Errors of the client agent (layer: client_agent).

One job: name every way the agent can fail. ``AgentError`` is the root; a failure
that happens while a tool runs also derives from ``workers.errors.ToolFailed`` so the
executor turns it into a failed ``ToolResult`` with this message and fields, and the
brain sees a tool failure, not a crashed worker.
"""

from __future__ import annotations

from typing import Any

from workers.errors import ToolFailed


class AgentError(Exception):
    """Root of every error the client agent raises."""

    def __init__(self, message: str, **data: Any) -> None:
        super().__init__(message)
        self.message = message
        self.data = data


class AgentConfigError(AgentError):
    """The agent's config cannot be used; the message names the file (or env var) and the field."""

    def __init__(self, source: str, field: str, problem: str) -> None:
        where = f"{source}: {field}" if field else source
        super().__init__(f"{where}: {problem}", source=source, field=field)
        self.source = source
        self.field = field


class NoCredential(AgentError):
    """The config gives no credential of this client's own: no broker URL, or one without a
    password (the example's placeholder). The broker would refuse it, or let the agent retry a
    wrong address for ever: enrolling is the only way in."""

    def __init__(self, client_id: str, user: str) -> None:
        super().__init__(
            f"this client has no credential: enroll it on the brain: vancetope clients enroll {client_id} "
            f"--user {user} --output {client_id}.credential, then set credential_file",
            client_id=client_id,
            user=user,
        )
        self.client_id = client_id
        self.user = user


class AnnouncementTooLarge(AgentError):
    """The tool announcement does not fit the brain's limits even without descriptions."""


class PolicyViolation(AgentError, ToolFailed):
    """A call the local policy refuses (a tool outside ``allowed_tools``, an unannounced MCP tool).

    Derives from ``ToolFailed`` so a refused call is a failed result, not a worker crash.
    """

    def __init__(self, tool: str, path: str | None, why: str) -> None:
        message = f"{tool}: {why}" if path is None else f"{tool}: path {path!r}: {why}"
        ToolFailed.__init__(self, message, tool=tool, path=path, why=why)
        self.tool = tool
        self.path = path
        self.why = why


class BrokerUnavailable(AgentError):
    """The agent could not write to its broker after bounded retries."""


class NotEnrolled(AgentError):
    """The broker refused this agent's credentials (WRONGPASS/NOAUTH): the client is not
    enrolled, or was revoked. Retrying cannot help; the operator has to enroll it."""

    def __init__(self, client_id: str, user: str, detail: str) -> None:
        super().__init__(
            f"the broker refused the credentials of client {client_id!r} ({detail}): not enrolled or "
            f"revoked: ask the operator to run `vancetope clients enroll {client_id} --user {user}` and "
            "give this agent the VANCETOPE_AGENT_BROKER_URL it prints",
            client_id=client_id,
            user=user,
        )
        self.client_id = client_id
        self.user = user
