"""brain.core.sessions: what a connected client's session answers, and why an announcement is
refused (pure: a table)."""

from __future__ import annotations

import pytest

from brain.core.models import Enrollment, Location, ToolSpec
from brain.core.sessions import ClientSession, announced_schemas, check_announcement, names_of, user_sessions
from workers.contracts import MAX_ANNOUNCED_TOOLS, ClientConnected, ClientType, ToolDescriptor, ToolType

ENROLLED = Enrollment(client_id="laptop", user="ada", enrolled_at=0.0)


def native(name: str) -> ToolDescriptor:
    return ToolDescriptor(name=name, type=ToolType.NATIVE)


def mcp(server: str, name: str) -> ToolDescriptor:
    return ToolDescriptor(name=name, type=ToolType.MCP, mcp_server=server)


def session(
    client_id: str = "laptop", user: str = "ada", tools: list[ToolDescriptor] | None = None
) -> ClientSession:
    return ClientSession(
        client_id=client_id, user=user, session_id="s1", client_type=ClientType.CLI,
        tools=tools or [], connected_at=0.0,
    )  # fmt: skip


def announcement(client_id: str = "laptop", tools: list[ToolDescriptor] | None = None) -> ClientConnected:
    return ClientConnected(client_id=client_id, session_id="s1", available_tools=tools or [], sent_at=0.0)


@pytest.mark.parametrize(
    ("tool", "names"),
    [
        (native("read_local_file"), ("read_local_file",)),
        (mcp("fs", "read"), ("read", "fs.read")),
        (mcp("git", "git.git_status"), ("git.git_status",)),  # the agent qualified it (not git.git.…)
        # An older agent qualified it the deprecated way: it answers to both forms.
        (mcp("git", "git/git_status"), ("git.git_status", "git/git_status")),
        (mcp("io.github.fs", "read.file"), ("read.file", "io.github.fs.read.file")),  # dots in both
    ],
)
def test_names_of_a_tool(tool: ToolDescriptor, names: tuple[str, ...]) -> None:
    assert names_of(tool) == names


def test_a_session_finds_a_tool_by_its_bare_or_qualified_name() -> None:
    s = session(tools=[native("echo"), mcp("fs", "read")])
    assert s.tool("echo") == native("echo")
    assert s.tool("read") == s.tool("fs.read") == mcp("fs", "read")
    assert s.tool("other.read") is None and s.tool("nope") is None
    assert s.tool_names() == frozenset({"echo", "read", "fs.read"})


@pytest.mark.parametrize(
    ("msg", "owner", "enrollment", "refusal"),
    [
        (announcement(), "laptop", ENROLLED, None),
        (
            announcement(),
            "laptop",
            None,
            "client 'laptop' is not enrolled; run `vancetope clients enroll laptop --user NAME` on the brain",
        ),
        (
            announcement("desk"),
            "laptop",
            ENROLLED,
            "announcement names client 'desk' but came through 'laptop''s outbox",
        ),
        (
            announcement(tools=[native("a"), native("b"), native("a"), mcp("fs", "b")]),
            "laptop",
            ENROLLED,
            "tools announced twice: a, b",
        ),
        # The same tool name from two MCP servers is still one name announced twice.
        (
            announcement(tools=[mcp("x", "read"), mcp("y", "read")]),
            "laptop",
            ENROLLED,
            "tools announced twice: read",
        ),
        (announcement(tools=[native(f"t{i}") for i in range(MAX_ANNOUNCED_TOOLS)]), "laptop", ENROLLED, None),
    ],
)
def test_check_announcement(
    msg: ClientConnected, owner: str, enrollment: Enrollment | None, refusal: str | None
) -> None:
    assert check_announcement(msg, owner, enrollment) == refusal


def test_too_many_tools_is_refused_saying_the_limit() -> None:
    # ClientConnected itself refuses more than MAX_ANNOUNCED_TOOLS; the check holds for a
    # message built without validation too.
    msg = announcement().model_copy(
        update={"available_tools": [native(f"t{i}") for i in range(MAX_ANNOUNCED_TOOLS + 1)]}
    )
    assert check_announcement(msg, "laptop", ENROLLED) == (
        f"{MAX_ANNOUNCED_TOOLS + 1} tools announced; at most {MAX_ANNOUNCED_TOOLS}"
    )


def test_user_sessions_are_that_users_only_in_client_id_order() -> None:
    sessions = [session("zeta"), session("alpha"), session("bob-box", user="bob"), session("mid")]
    assert [s.client_id for s in user_sessions(sessions, "ada")] == ["alpha", "mid", "zeta"]
    assert user_sessions(sessions, "nobody") == []


def test_with_the_registry_a_clients_mcp_tool_answers_only_to_its_qualified_name_when_the_bare_is_taken() -> (
    None
):
    # Issue 24 item E: the registry's native git_status and a client's MCP git_status were one
    # name; the client counted as offering the native tool, and calls went to the wrong tool.
    registry = {
        "git_status": ToolSpec(name="git_status", location=Location.CLIENT, type=ToolType.NATIVE),
        "git_log": ToolSpec(name="git_log", location=Location.CLIENT, type=ToolType.MCP, mcp_server="git"),
    }
    s = session(tools=[mcp("git", "git_status"), mcp("git", "git_log")])
    assert s.tool_names(registry) == frozenset({"git.git_status", "git_log", "git.git_log"})
    assert s.tool_names() == frozenset({"git_status", "git.git_status", "git_log", "git.git_log"})
    assert s.tool("git_status", registry) is None and s.tool("git.git_status", registry) == mcp(
        "git", "git_status"
    )
    assert set(announced_schemas([s], registry)) == {"git.git_status", "git_log", "git.git_log"}
    assert s.clashes(registry) == {"git_status": ["registry's native tool", "git.git_status"]}
