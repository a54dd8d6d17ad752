"""The tool router as a table: one row per branch of seed 000 §4 (+ §6 execution_target, §8 engines)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from brain.core.models import ExecutionTarget, Location, OfflineStrategy, SessionKind, Side, ToolSpec
from brain.core.routing import (
    ClientView,
    Engine,
    Presence,
    Route,
    RouteKind,
    RouteRequest,
    client_tools,
    decide_route,
    route_without_presence,
)

AUTO, SERVER_T, CLIENT_T, ANY = (
    ExecutionTarget.AUTO,
    ExecutionTarget.SERVER,
    ExecutionTarget.CLIENT,
    ExecutionTarget.ANY,
)
INTERACTIVE, AUTONOMOUS = SessionKind.INTERACTIVE, SessionKind.AUTONOMOUS
SERVER, CLIENT, BLOCKED, PENDING, SKIP, FAIL = (
    RouteKind.SERVER,
    RouteKind.CLIENT,
    RouteKind.BLOCKED,
    RouteKind.PENDING_CLIENT,
    RouteKind.SKIP,
    RouteKind.FAIL,
)


def _spec(name: str, location: str, **fields: Any) -> ToolSpec:
    return ToolSpec.model_validate({"name": name, "location": location, **fields})


REGISTRY: dict[str, ToolSpec] = {
    s.name: s
    for s in [
        _spec("web_search", "server"),
        _spec("read_local_file", "client"),
        _spec("notes_block", "client", offline_strategy="block"),
        _spec("notes_queue", "client", offline_strategy="queue"),
        _spec("notes_skip", "client", offline_strategy="skip"),
        _spec("notes_fallback", "client", offline_strategy="fallback", fallback_tool="notes_server"),
        _spec("notes_server", "server"),
        _spec("fallback_missing", "client", offline_strategy="fallback", fallback_tool="nowhere"),
        _spec("fallback_to_client", "client", offline_strategy="fallback", fallback_tool="read_local_file"),
        _spec("local_with_alt", "client", fallback_tool="notes_server"),
        _spec("drive", "both"),
        _spec("drive_server", "prefer_server"),
        _spec("drive_client", "prefer_client"),
        _spec("drive_client_explicit", "both", prefer="client"),
        _spec("drive_client_block", "both", prefer="client", offline_strategy="block"),
        # The model refuses 'fallback' without a fallback_tool; the router must still not crash on it.
        ToolSpec.model_construct(
            name="no_alternative", location=Location.CLIENT, offline_strategy=OfflineStrategy.FALLBACK
        ),
    ]
}

CLIENT_TOOLS = frozenset(
    {
        "read_local_file",
        "notes_block",
        "notes_queue",
        "notes_skip",
        "notes_fallback",
        "local_with_alt",
        "drive",
        "drive_server",
        "drive_client",
        "drive_client_explicit",
        "drive_client_block",
        "git_status",  # announced, not in the registry
    }
)
LAPTOP = ClientView(client_id="alice-laptop", user="alice", tools=CLIENT_TOOLS)
DESKTOP = ClientView(client_id="alice-desktop", user="alice", tools=CLIENT_TOOLS)
A_BOX = ClientView(client_id="alice-a", user="alice", tools=CLIENT_TOOLS)
BARE_LAPTOP = ClientView(client_id="alice-laptop", user="alice", tools=frozenset())
BOB = ClientView(client_id="bob-pc", user="bob", tools=CLIENT_TOOLS)

NOBODY = Presence(session_client="alice-laptop", user="alice")
OWN = Presence(session_client="alice-laptop", user="alice", clients=(LAPTOP,))
OWN_WITHOUT_TOOLS = Presence(session_client="alice-laptop", user="alice", clients=(BARE_LAPTOP,))
OTHER_DEVICE = Presence(session_client="alice-laptop", user="alice", clients=(DESKTOP,))
BOTH_DEVICES = Presence(session_client="alice-laptop", user="alice", clients=(DESKTOP, LAPTOP))
SESSION_LACKS = Presence(session_client="alice-laptop", user="alice", clients=(DESKTOP, BARE_LAPTOP, A_BOX))
OTHER_USER = Presence(session_client="alice-laptop", user="alice", clients=(BOB,))
NO_USER = Presence(clients=(LAPTOP,))
NO_USER_SESSION = Presence(session_client="alice-laptop", clients=(LAPTOP,))
FOREIGN_SESSION = Presence(session_client="bob-pc", user="alice", clients=(BOB,))
# Unbound (an autonomous run of a user): any client of the user.
ANY_OF_ALICE = Presence(user="alice", clients=(DESKTOP, BOB))
ALICE_NOBODY = Presence(user="alice", clients=(BOB,))
UNBOUND_LACKS = Presence(user="alice", clients=(DESKTOP, BARE_LAPTOP, A_BOX))

_ENGINE_SERVER = ["web_search", "drive_client", "notes_server", "notes_block"]
_ENGINE_CLIENT = [
    "read_local_file",
    "drive_client",
    "local_with_alt",
    "notes_fallback",
    "drive_client_explicit",
]
ENGINE = Engine(id="eng_review", server=_ENGINE_SERVER, client=_ENGINE_CLIENT)
ENGINE_AUTO = Engine(id="eng_auto", server=_ENGINE_SERVER, client=_ENGINE_CLIENT, auto_fallback=True)
# Allows local_with_alt and notes_fallback but not their fallback_tool notes_server.
ENGINE_STRICT = Engine(id="eng_strict", server=["web_search"], client=_ENGINE_CLIENT, auto_fallback=True)
BARRED = "not falling back: fallback_tool 'notes_server' is not allowed by engine 'eng_strict'"

LAPTOP_RUNS = "client 'alice-laptop' (this session's client) runs it"


@dataclass(frozen=True)
class Row:
    tool: str
    presence: Presence
    kind: RouteKind
    reason: str
    target: ExecutionTarget = AUTO
    session: SessionKind = AUTONOMOUS
    engine: Engine | None = None
    client_id: str | None = None
    routed_tool: str | None = None
    fell_back_from: str | None = None


def row(sentence: str, *args: Any, **kwargs: Any) -> Any:
    return pytest.param(Row(*args, **kwargs), id=sentence)


# One row per branch reads better than one argument per line.
# fmt: off
TABLE = [
    # --- location server ---------------------------------------------------------------
    row(
        "a server tool runs on the server",
        "web_search", NOBODY, SERVER, "tool 'web_search' has location server: the server pool runs it",
    ),
    row(
        "a server tool runs on the server even with a client connected",
        "web_search", OWN, SERVER, "tool 'web_search' has location server: the server pool runs it",
    ),
    # --- location client, client connected -----------------------------------------------
    row(
        "a client tool goes to the session's connected client",
        "read_local_file", OWN, CLIENT, f"tool 'read_local_file' has location client: {LAPTOP_RUNS}",
        client_id="alice-laptop",
    ),
    # --- location client, no client: strategies x session defaults ------------------------
    row(
        "an offline client tool without strategy blocks in an interactive session",
        "read_local_file", NOBODY, BLOCKED, "Waiting for Client for Tool: read_local_file",
        session=INTERACTIVE,
    ),
    row(
        "an offline client tool without strategy is queued in an autonomous session",
        "read_local_file", NOBODY, PENDING, "Queued for Client: read_local_file (client 'alice-laptop' not connected)",
    ),
    row(
        "strategy block blocks even in an autonomous session",
        "notes_block", NOBODY, BLOCKED, "Waiting for Client for Tool: notes_block",
    ),
    row(
        "strategy queue queues even in an interactive session",
        "notes_queue", NOBODY, PENDING, "Queued for Client: notes_queue (client 'alice-laptop' not connected)",
        session=INTERACTIVE,
    ),
    row(
        "strategy skip skips the task",
        "notes_skip", NOBODY, SKIP, "Skipped: client 'alice-laptop' not connected for Tool: notes_skip",
        session=INTERACTIVE,
    ),
    row(
        "strategy fallback runs the fallback_tool on the server",
        "notes_fallback", NOBODY, SERVER,
        "Fallback to Server: client 'alice-laptop' not connected; calling fallback_tool 'notes_server' instead of 'notes_fallback'",
        routed_tool="notes_server", fell_back_from="notes_fallback",
    ),
    row(
        "strategy fallback fails when the fallback_tool is not in the registry",
        "fallback_missing", NOBODY, FAIL,
        "offline_strategy fallback: tool 'fallback_missing' needs a client (client 'alice-laptop' not connected) "
        "and its fallback_tool 'nowhere' is not in the registry",
    ),
    row(
        "strategy fallback fails when the fallback_tool is client-only too",
        "fallback_to_client", NOBODY, FAIL,
        "offline_strategy fallback: tool 'fallback_to_client' needs a client (client 'alice-laptop' not connected) "
        "and its fallback_tool 'read_local_file' does not run on the server (location client)",
    ),
    row(
        "strategy fallback without any fallback_tool fails",
        "no_alternative", NOBODY, FAIL,
        "offline_strategy fallback: tool 'no_alternative' needs a client (client 'alice-laptop' not connected) "
        "and has no fallback_tool",
    ),
    row(
        "a connected client that does not offer the tool counts as no client",
        "read_local_file", OWN_WITHOUT_TOOLS, PENDING,
        "Queued for Client: read_local_file (client 'alice-laptop' does not offer this tool)",
    ),
    row(
        "skip says when a client is connected but lacks the tool",
        "notes_skip", OWN_WITHOUT_TOOLS, SKIP, "Skipped: client 'alice-laptop' does not offer this tool for Tool: notes_skip",
    ),
    # --- location both --------------------------------------------------------------------
    row(
        "a both tool without prefer runs on the server",
        "drive", OWN, SERVER, "tool 'drive' has location both, prefer server: the server pool runs it",
    ),
    row(
        "prefer_server shorthand runs on the server even with a client connected",
        "drive_server", OWN, SERVER, "tool 'drive_server' has location both, prefer server: the server pool runs it",
    ),
    row(
        "prefer_client shorthand runs on the connected client",
        "drive_client", OWN, CLIENT, f"tool 'drive_client' has location both, prefer client: {LAPTOP_RUNS}",
        client_id="alice-laptop",
    ),
    row(
        "both with prefer client runs on the connected client",
        "drive_client_explicit", OWN, CLIENT,
        f"tool 'drive_client_explicit' has location both, prefer client: {LAPTOP_RUNS}",
        client_id="alice-laptop",
    ),
    row(
        "both with prefer client falls back to the server when no client is connected",
        "drive_client", NOBODY, SERVER, "Fallback to Server: client 'alice-laptop' not connected",
    ),
    row(
        "both with prefer client falls back to the server in an interactive session too",
        "drive_client", NOBODY, SERVER, "Fallback to Server: client 'alice-laptop' not connected", session=INTERACTIVE,
    ),
    row(
        "both with prefer client and strategy block waits for the client",
        "drive_client_block", NOBODY, BLOCKED, "Waiting for Client for Tool: drive_client_block",
    ),
    # --- unknown tools --------------------------------------------------------------------
    row("an unknown tool fails", "nope", OWN, FAIL, "Tool unknown: nope"),
    row(
        "a tool only the session's client announces is a client tool",
        "git_status", OWN, CLIENT, f"tool 'git_status' is not in the registry; a client announces it: {LAPTOP_RUNS}",
        client_id="alice-laptop",
    ),
    row(
        "a tool only another user's client announces is unknown",
        "git_status", OTHER_USER, FAIL, "Tool unknown: git_status",
    ),
    # --- execution_target x location ------------------------------------------------------
    row(
        "target server on a server tool runs on the server",
        "web_search", OWN, SERVER, "execution_target server: the server pool runs tool 'web_search'",
        target=SERVER_T,
    ),
    row(
        "target server on a prefer-client tool runs on the server despite a connected client",
        "drive_client", OWN, SERVER, "execution_target server: the server pool runs tool 'drive_client'",
        target=SERVER_T,
    ),
    row(
        "target server on a client-only tool fails",
        "read_local_file", OWN, FAIL, "task must run on the server but tool 'read_local_file' is client-only",
        target=SERVER_T,
    ),
    row(
        "target client on a server-only tool fails",
        "web_search", OWN, FAIL, "task must run on the client but tool 'web_search' is server-only",
        target=CLIENT_T,
    ),
    row(
        "target client on a client tool goes to the client",
        "read_local_file", OWN, CLIENT, f"execution_target client: {LAPTOP_RUNS}",
        target=CLIENT_T, client_id="alice-laptop",
    ),
    row(
        "target client on a prefer-server tool goes to the client",
        "drive_server", OWN, CLIENT, f"execution_target client: {LAPTOP_RUNS}",
        target=CLIENT_T, client_id="alice-laptop",
    ),
    row(
        "target client on a both tool without client waits instead of falling back",
        "drive_client", NOBODY, BLOCKED, "Waiting for Client for Tool: drive_client",
        target=CLIENT_T, session=INTERACTIVE,
    ),
    row(
        "target client overrides strategy fallback with the session default",
        "notes_fallback", NOBODY, PENDING, "Queued for Client: notes_fallback (client 'alice-laptop' not connected)",
        target=CLIENT_T,
    ),
    row(
        "target client without client still honours strategy skip",
        "notes_skip", NOBODY, SKIP, "Skipped: client 'alice-laptop' not connected for Tool: notes_skip", target=CLIENT_T,
    ),
    row(
        "target any on a server tool runs on the server",
        "web_search", OWN, SERVER, "tool 'web_search' has location server: the server pool runs it",
        target=ANY,
    ),
    row(
        "target any on a prefer-client tool takes the always-available server",
        "drive_client", OWN, SERVER, "execution_target any: tool 'drive_client' runs on the server, always available",
        target=ANY,
    ),
    row(
        "target any on a client tool goes to a connected client",
        "read_local_file", OWN, CLIENT, f"tool 'read_local_file' has location client: {LAPTOP_RUNS}",
        target=ANY, client_id="alice-laptop",
    ),
    row(
        "target any on a client tool without client uses the offline strategy",
        "notes_skip", NOBODY, SKIP, "Skipped: client 'alice-laptop' not connected for Tool: notes_skip", target=ANY,
    ),
    # --- which client ---------------------------------------------------------------------
    row(
        "a bound tree waits for its own client even when another client of the user offers the tool",
        "read_local_file", OTHER_DEVICE, PENDING, "Queued for Client: read_local_file (client 'alice-laptop' not connected)",
    ),
    row(
        "a bound interactive tree blocks for its own client, not another client of the user",
        "read_local_file", OTHER_DEVICE, BLOCKED, "Waiting for Client for Tool: read_local_file", session=INTERACTIVE,
    ),
    row(
        "a bound tree whose client is away follows strategy skip, never another client of the user",
        "notes_skip", OTHER_DEVICE, SKIP, "Skipped: client 'alice-laptop' not connected for Tool: notes_skip",
    ),
    row(
        "a bound tree whose client is away follows strategy fallback to the server",
        "notes_fallback", OTHER_DEVICE, SERVER,
        "Fallback to Server: client 'alice-laptop' not connected; calling fallback_tool 'notes_server' instead "
        "of 'notes_fallback'",
        routed_tool="notes_server", fell_back_from="notes_fallback",
    ),
    row(
        "a bound both tool whose client is away falls back to the server",
        "drive_client", OTHER_DEVICE, SERVER, "Fallback to Server: client 'alice-laptop' not connected",
    ),
    row(
        "a tool only another client of the user announces is unknown to a bound tree",
        "git_status", OTHER_DEVICE, FAIL, "Tool unknown: git_status",
    ),
    row(
        "an unbound tree runs on any connected client of its user",
        "read_local_file", ANY_OF_ALICE, CLIENT,
        "tool 'read_local_file' has location client: client 'alice-desktop' (a client of user 'alice') runs it",
        client_id="alice-desktop",
    ),
    row(
        "an unbound tree parks for any client of its user when none is connected",
        "read_local_file", ALICE_NOBODY, PENDING, "Queued for Client: read_local_file (no client connected)",
    ),
    row(
        "the session's client is preferred over other clients of the user",
        "read_local_file", BOTH_DEVICES, CLIENT, f"tool 'read_local_file' has location client: {LAPTOP_RUNS}",
        client_id="alice-laptop",
    ),
    row(
        "a bound tree whose client lacks the tool waits for it while other clients of the user offer it",
        "read_local_file", SESSION_LACKS, PENDING,
        "Queued for Client: read_local_file (client 'alice-laptop' does not offer this tool)",
    ),
    row(
        "among equally loaded clients of the user the first in client_id order runs the tool",
        "read_local_file", UNBOUND_LACKS, CLIENT,
        "tool 'read_local_file' has location client: client 'alice-a' (the least loaded of 2 clients of "
        "user 'alice', 0 call(s) queued) runs it",
        client_id="alice-a",
    ),
    row(
        "another user's client is never used",
        "read_local_file", OTHER_USER, PENDING, "Queued for Client: read_local_file (client 'alice-laptop' not connected)",
    ),
    row(
        "a session client that belongs to another user is not used",
        "read_local_file", FOREIGN_SESSION, PENDING, "Queued for Client: read_local_file (client 'bob-pc' is not a client of user 'alice')",
    ),
    row(
        "without a known user and without a session client no client is used",
        "read_local_file", NO_USER, PENDING, "Queued for Client: read_local_file (no client connected)",
    ),
    row(
        "without a known user the session's own client is used",
        "read_local_file", NO_USER_SESSION, CLIENT, f"tool 'read_local_file' has location client: {LAPTOP_RUNS}",
        client_id="alice-laptop",
    ),
    # --- think-process engines --------------------------------------------------------------
    row(
        "an engine denies a tool it does not list",
        "notes_skip", OWN, FAIL, "tool 'notes_skip' is not allowed by engine 'eng_review'", engine=ENGINE,
    ),
    row(
        "an engine denies an unknown tool by its allow-list first",
        "nope", OWN, FAIL, "tool 'nope' is not allowed by engine 'eng_review'", engine=ENGINE,
    ),
    row(
        "an engine client tool goes to the client",
        "read_local_file", OWN, CLIENT,
        f"engine 'eng_review' lists tool 'read_local_file' under client: {LAPTOP_RUNS}",
        engine=ENGINE, client_id="alice-laptop",
    ),
    row(
        "an engine server tool runs on the server",
        "web_search", OWN, SERVER,
        "engine 'eng_review' lists tool 'web_search' under server: the server pool runs tool 'web_search'",
        engine=ENGINE,
    ),
    row(
        "a tool the engine lists on both sides follows its location",
        "drive_client", OWN, CLIENT, f"tool 'drive_client' has location both, prefer client: {LAPTOP_RUNS}",
        engine=ENGINE, client_id="alice-laptop",
    ),
    row(
        "an engine client tool without client and without auto_fallback gets the session default",
        "local_with_alt", NOBODY, BLOCKED, "Waiting for Client for Tool: local_with_alt",
        engine=ENGINE, session=INTERACTIVE,
    ),
    row(
        "an engine without auto_fallback does not apply a tool's fallback strategy",
        "notes_fallback", NOBODY, PENDING, "Queued for Client: notes_fallback (client 'alice-laptop' not connected)",
        engine=ENGINE,
    ),
    row(
        "an engine without auto_fallback keeps a both tool it lists under client waiting",
        "drive_client_explicit", NOBODY, BLOCKED, "Waiting for Client for Tool: drive_client_explicit",
        engine=ENGINE, session=INTERACTIVE,
    ),
    row(
        "engine auto_fallback runs the fallback_tool on the server",
        "local_with_alt", NOBODY, SERVER,
        "Fallback to Server: client 'alice-laptop' not connected; calling fallback_tool 'notes_server' instead of "
        "'local_with_alt' (engine 'eng_auto' auto_fallback)",
        engine=ENGINE_AUTO, session=INTERACTIVE, routed_tool="notes_server", fell_back_from="local_with_alt",
    ),
    row(
        "engine auto_fallback runs a both tool on the server",
        "drive_client_explicit", NOBODY, SERVER,
        "Fallback to Server: client 'alice-laptop' not connected (engine 'eng_auto' auto_fallback)",
        engine=ENGINE_AUTO, session=INTERACTIVE,
    ),
    row(
        "engine auto_fallback without a server alternative uses the offline strategy",
        "read_local_file", NOBODY, PENDING, "Queued for Client: read_local_file (client 'alice-laptop' not connected)",
        engine=ENGINE_AUTO,
    ),
    row(
        "engine auto_fallback is not used when the task targets the client",
        "local_with_alt", NOBODY, BLOCKED, "Waiting for Client for Tool: local_with_alt",
        engine=ENGINE_AUTO, target=CLIENT_T, session=INTERACTIVE,
    ),
    row(
        "engine auto_fallback never calls a fallback_tool the engine does not allow",
        "local_with_alt", NOBODY, BLOCKED, f"Waiting for Client for Tool: local_with_alt; {BARRED}",
        engine=ENGINE_STRICT, session=INTERACTIVE,
    ),
    row(
        "strategy fallback gives way to the session default when the engine does not allow the fallback_tool",
        "notes_fallback", NOBODY, PENDING, f"Queued for Client: notes_fallback (client 'alice-laptop' not connected); {BARRED}",
        engine=ENGINE_STRICT,
    ),
    row(
        "an engine that does not allow the fallback_tool still lets a connected client run the tool",
        "notes_fallback", OWN, CLIENT, f"engine 'eng_strict' lists tool 'notes_fallback' under client: {LAPTOP_RUNS}",
        engine=ENGINE_STRICT, client_id="alice-laptop",
    ),
    row(
        "an engine listing a client-only tool under server fails",
        "notes_block", OWN, FAIL,
        "engine 'eng_review' lists tool 'notes_block' under server but tool 'notes_block' is client-only",
        engine=ENGINE,
    ),
    row(
        "an execution_target that contradicts the engine's side fails",
        "web_search", OWN, FAIL,
        "execution_target client conflicts with engine 'eng_review', which lists tool 'web_search' under server only",
        engine=ENGINE, target=CLIENT_T,
    ),
]
# fmt: on


@pytest.mark.parametrize("case", TABLE)
def test_route(case: Row) -> None:
    request = RouteRequest(
        tool=case.tool, execution_target=case.target, session=case.session, engine=case.engine
    )
    route = decide_route(request, REGISTRY, case.presence)
    assert (route.kind, route.reason) == (case.kind, case.reason)
    assert route.tool == (case.routed_tool or case.tool)
    assert route.client_id == case.client_id
    assert route.fell_back_from == case.fell_back_from


PRESENCES = [
    NOBODY, OWN, OWN_WITHOUT_TOOLS, OTHER_DEVICE, BOTH_DEVICES, SESSION_LACKS, OTHER_USER, NO_USER,
    NO_USER_SESSION, FOREIGN_SESSION, ANY_OF_ALICE, ALICE_NOBODY, UNBOUND_LACKS,
]  # fmt: skip


@pytest.mark.parametrize("case", TABLE)
def test_a_route_known_without_presence_is_the_route_under_every_presence(case: Row) -> None:
    """The scheduler skips reading presence when route_without_presence answers: that answer
    must be what decide_route says whoever is connected."""
    request = RouteRequest(
        tool=case.tool, execution_target=case.target, session=case.session, engine=case.engine
    )
    route = route_without_presence(request, REGISTRY)
    if route is None:
        return
    assert route.kind is RouteKind.SERVER
    assert all(decide_route(request, REGISTRY, p) == route for p in PRESENCES)


def test_routes_that_depend_on_presence_are_not_answered_without_it() -> None:
    assert route_without_presence(RouteRequest(tool="web_search"), REGISTRY) is not None
    for tool in ("read_local_file", "drive_client", "notes_fallback", "not_in_registry"):
        assert route_without_presence(RouteRequest(tool=tool), REGISTRY) is None


@pytest.mark.parametrize(
    ("tool", "strategy"),
    [
        ("read_local_file", OfflineStrategy.QUEUE),
        ("notes_block", OfflineStrategy.BLOCK),
        ("notes_skip", OfflineStrategy.SKIP),
        ("drive_client", OfflineStrategy.FALLBACK),
        ("web_search", None),
    ],
)
def test_route_names_the_offline_strategy_it_applied(tool: str, strategy: OfflineStrategy | None) -> None:
    assert decide_route(RouteRequest(tool=tool), REGISTRY, NOBODY).strategy is strategy


@pytest.mark.parametrize(
    ("route", "queue"),
    [
        (Route(kind=SERVER, tool="t", reason="r"), "server"),
        (Route(kind=CLIENT, tool="t", client_id="alice-laptop", reason="r"), "client.alice-laptop"),
        (Route(kind=BLOCKED, tool="t", reason="r"), None),
        (Route(kind=PENDING, tool="t", reason="r"), None),
        (Route(kind=SKIP, tool="t", reason="r"), None),
        (Route(kind=FAIL, tool="t", reason="r"), None),
    ],
    ids=lambda v: str(v) if v is None or isinstance(v, str) else v.kind.value,
)
def test_route_queue(route: Route, queue: str | None) -> None:
    assert route.queue == queue


def test_engine_accepts_the_seed_shape() -> None:
    seed = {
        "id": "eng_literature_review",
        "tools": {"server": ["web_search"], "client": ["read_local_file"], "auto_fallback": True},
    }
    engine = Engine.model_validate(seed)
    assert engine == Engine(
        id="eng_literature_review", server=("web_search",), client=("read_local_file",), auto_fallback=True
    )


def test_an_engine_written_with_the_old_slash_names_lists_the_dotted_ones() -> None:
    engine = Engine.model_validate(
        {"id": "e", "tools": {"server": ["git/git_status"], "client": ["fs.read"]}}
    )
    assert engine.side_for("git.git_status") is Side.SERVER and engine.allows("fs.read")


def test_engine_refuses_a_field_both_inside_and_beside_tools() -> None:
    with pytest.raises(ValueError, match="auto_fallback given both inside and beside 'tools'"):
        Engine.model_validate({"id": "e", "auto_fallback": True, "tools": {"auto_fallback": False}})


def test_decide_route_is_pure() -> None:
    request = RouteRequest(tool="drive_client", session=INTERACTIVE)
    assert decide_route(request, REGISTRY, OWN) == decide_route(request, REGISTRY, OWN)


# --- spreading over the user's clients (load passed in) -------------------------------------------


def loaded(client: ClientView, load: int, tools: frozenset[str] = CLIENT_TOOLS) -> ClientView:
    return client.model_copy(update={"load": load, "tools": tools})


@pytest.mark.parametrize(
    ("session_client", "clients", "picked"),
    [
        pytest.param(
            None, (loaded(A_BOX, 3), loaded(DESKTOP, 1)), "alice-desktop", id="the least loaded wins"
        ),
        pytest.param(
            None, (loaded(A_BOX, 2), loaded(DESKTOP, 2)), "alice-a", id="ties go in client_id order"
        ),
        pytest.param(
            None,
            (loaded(DESKTOP, 1), loaded(A_BOX, 0, frozenset())),
            "alice-desktop",
            id="an idle client without the tool is not picked",
        ),
        pytest.param(
            "alice-laptop",
            (loaded(LAPTOP, 9), loaded(DESKTOP, 0)),
            "alice-laptop",
            id="the session's own client stays first however loaded",
        ),
        pytest.param(
            None,
            (loaded(BARE_LAPTOP, 0, frozenset()), loaded(DESKTOP, 4), loaded(A_BOX, 5)),
            "alice-desktop",
            id="an unbound tree: the least loaded client that offers the tool runs it",
        ),
        pytest.param(
            None,
            (loaded(BOB, 0), loaded(DESKTOP, 7)),
            "alice-desktop",
            id="an idle client of another user is never picked",
        ),
    ],
)
def test_client_work_goes_to_the_least_loaded_client_of_the_user_offering_the_tool(
    session_client: str | None, clients: tuple[ClientView, ...], picked: str
) -> None:
    presence = Presence(session_client=session_client, user="alice", clients=clients)
    route = decide_route(RouteRequest(tool="read_local_file"), REGISTRY, presence)
    assert (route.kind, route.client_id) == (CLIENT, picked)


@pytest.mark.parametrize(
    "clients",
    [
        pytest.param((loaded(DESKTOP, 0),), id="only another client of the user is connected"),
        pytest.param(
            (loaded(BARE_LAPTOP, 0, frozenset()), loaded(DESKTOP, 0)),
            id="the bound client is connected without the tool",
        ),
    ],
)
def test_a_bound_tree_never_runs_on_another_client_of_its_user(clients: tuple[ClientView, ...]) -> None:
    presence = Presence(session_client="alice-laptop", user="alice", clients=clients)
    for session in (INTERACTIVE, AUTONOMOUS):
        route = decide_route(RouteRequest(tool="read_local_file", session=session), REGISTRY, presence)
        assert route.kind in (BLOCKED, PENDING) and route.client_id is None, route
    assert client_tools(presence) == (
        clients[0].tools if clients[0].client_id == "alice-laptop" else frozenset()
    )


def test_routing_one_call_after_another_from_one_view_alternates_between_equal_clients() -> None:
    presence = Presence(user="alice", clients=(DESKTOP, A_BOX))
    picked = []
    for _ in range(6):
        route = decide_route(RouteRequest(tool="read_local_file"), REGISTRY, presence)
        assert route.client_id is not None
        picked.append(route.client_id)
        presence = presence.with_call_sent_to(route.client_id)
    assert picked == ["alice-a", "alice-desktop"] * 3
    assert {c.client_id: c.load for c in presence.clients} == {"alice-desktop": 3, "alice-a": 3}
