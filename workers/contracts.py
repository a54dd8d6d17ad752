"""Wire contracts shared by the brain, the server pool and the client agent.

Layer: workers (imported by everyone, imports nothing of ours but errors).
One job: queue names, task names, Redis key names and the message envelopes
that cross Celery. Nothing else may build these strings by hand.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from enum import StrEnum
from typing import Annotated, Any, Final, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    TypeAdapter,
    model_serializer,
)

# --- queues -----------------------------------------------------------------

SERVER_QUEUE = "server"
BRAIN_QUEUE = "brain"
# Trees submitted by other Celery apps (``vancetope.submit_tree``). Its own queue, not
# ``brain``: the server pool may write ``brain`` but must never start work on a workstation.
SUBMIT_QUEUE = "submit"
# fullmatch: "$" alone would let a trailing newline through
_CLIENT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def submit_queue_of(user: str) -> str:
    """The queue a user's submit credential may write (``vancetope submit-url --user U``): only
    the brain reads it, and every tree on it runs as ``user``."""
    if not _CLIENT_ID.fullmatch(user):
        raise ValueError(f"invalid user {user!r}: use letters, digits, '_', '.', '-' (max 64)")
    return f"{SUBMIT_QUEUE}.{user}"


# The MCP gateway's requests to the brain (brain.runtime.gateway_door): only the gateway writes it.
GATEWAY_QUEUE = "gateway"


def key_gateway_reply(request_id: str) -> str:
    """List: the brain's one reply to the gateway's request ``request_id`` (32 hex)."""
    if not re.fullmatch(r"[0-9a-f]{32}", request_id):
        raise ValueError(f"invalid gateway request id {request_id!r}")
    return f"{GATEWAY_QUEUE}.reply.{request_id}"


def client_queue(client_id: str) -> str:
    """The Celery queue a client agent consumes: ``client.<client_id>``."""
    if not _CLIENT_ID.fullmatch(client_id):
        raise ValueError(f"invalid client id {client_id!r}: use letters, digits, '_', '.', '-' (max 64)")
    return f"client.{client_id}"


# Server pools (DESIGN decision 4): the default pool consumes ``server``; a named pool
# ``<name>`` consumes ``server.<name>``, so a pool can run on any machine that reaches Redis.
DEFAULT_POOL = "default"
_POOL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,62}")


def check_pool_name(pool: str) -> str:
    """``pool`` when it is a valid pool name; else ValueError saying what to change."""
    if not _POOL_NAME.fullmatch(pool):
        raise ValueError(
            f"invalid pool name {pool!r}: use letters, digits, '_' and '-', starting with a letter "
            "or digit (max 63)"
        )
    return pool


def pool_queue(pool: str | None) -> str:
    """The Celery queue of a server pool: ``server`` for the default pool (None or
    ``default``), ``server.<name>`` for a named one."""
    if pool is None or pool == DEFAULT_POOL:
        return SERVER_QUEUE
    return f"{SERVER_QUEUE}.{check_pool_name(pool)}"


# kombu's Redis transport keeps a queue as one list per priority step: ``server`` for step 0,
# ``server\x06\x163`` for step 3, and so on; a worker's BRPOP names them in this order, so a
# lower step is always taken first (kombu ``transport/redis.py``: ``priority_steps``, ``sep``,
# ``_q_for_pri``). A message published with no priority goes to step 0.
BROKER_PRIORITY_STEPS: Final = (0, 3, 6, 9)
_BROKER_PRIORITY_SEP: Final = "\x06\x16"


def broker_priority(priority: int) -> int:
    """The kombu priority step of a server call of ``priority`` (0-9, 9 first), one step per
    word from its number up: high (8-9) is taken before normal (5-7), normal before low (2-4),
    low before 0-1."""
    for step, lowest in zip(BROKER_PRIORITY_STEPS, (8, 5, 2, 0), strict=True):
        if priority >= lowest:
            return step
    return BROKER_PRIORITY_STEPS[-1]


def queue_keys(queue: str) -> tuple[str, ...]:
    """Every Redis list a message of ``queue`` may wait in, one per priority step, in the order
    a worker takes them."""
    return tuple(
        queue if step == 0 else f"{queue}{_BROKER_PRIORITY_SEP}{step}" for step in BROKER_PRIORITY_STEPS
    )


def pool_of_queue(queue: str) -> str | None:
    """The pool that consumes ``queue`` (``default`` for ``server``), or None for any other queue."""
    if queue == SERVER_QUEUE:
        return DEFAULT_POOL
    prefix = SERVER_QUEUE + "."
    if queue.startswith(prefix) and _POOL_NAME.fullmatch(queue[len(prefix) :]):
        return queue[len(prefix) :]
    return None


def client_keyprefix(client_id: str) -> str:
    """kombu ``global_keyprefix`` of one client's connection (docs/security.md)."""
    client_queue(client_id)  # validates
    return f"c:{client_id}:"


def client_keys_match() -> str:
    """SCAN MATCH pattern of every client's keys (``client_keyprefix`` of any id): what the
    brain measures against each client's quota. Client ids hold no ':' or glob character."""
    return "c:*"


# --- Celery task names ----------------------------------------------------

RUN_TOOL_TASK = "vancetope.run_tool"
# The Celery task event the brain sends Flower for a call waiting at the gate
# (brain.runtime.throttle_events); brain.flowerapp shows it as the state THROTTLED.
TASK_THROTTLED_EVENT = "task-throttled"
# Celery's own event for a task no worker will run: the brain sends it for a call it ended
# before a worker began it (brain.runtime.revoked); brain.flowerapp keeps it off the worker list.
TASK_REVOKED_EVENT = "task-revoked"
# Its fields for a call stopped while it ran, its task cancelled or expired (workers.call_stop):
# what a Celery worker sends for a task it terminated, but no signal (the call was given up).
TERMINATED_FIELDS: Final[dict[str, Any]] = {"terminated": True, "signum": None, "expired": False}
TASK_FAILED_EVENT = "task-failed"
RECORD_RESULT_TASK = "vancetope.record_result"
# A server worker that recorded a result hands the brain a dependent's call for a client.
PUBLISH_CALL_TASK = "vancetope.publish_call"
# Celery beat fires a `[[schedules]]` entry: the brain submits its tree (brain.runtime.schedule_runs).
RUN_SCHEDULE_TASK = "vancetope.run_schedule"
# Another Celery app submits a tree (docs/python-api.md): a message only the brain's own
# consumer of SUBMIT_QUEUE takes (brain.runtime.submit_queue); no worker registers it as a task.
SUBMIT_TREE_TASK = "vancetope.submit_tree"

# --- Redis keys (hot state lives under vt:) ----------------------------------

KEY_NS = "vt:"


def key_registry() -> str:
    """JSON snapshot of the brain's server-side registry (tools + MCP failures)."""
    return f"{KEY_NS}registry"


def key_pool_registry() -> str:
    """The same snapshot, written with ``key_registry`` for the server pools: the only registry
    key their Redis user reaches (Redis 6.2 has no read-only keys), so whatever a pool writes
    there changes how pools route and nobody else's routing (issue 20, M6)."""
    return f"{KEY_NS}pool-registry"


def key_registry_loaded_at() -> str:
    """When the snapshot in ``key_registry`` was built (a float as text), written with it: what
    a watcher (the MCP gateway) polls instead of reading the whole snapshot."""
    return f"{KEY_NS}registry:loaded_at"


def channel_tree_events(tree_id: str) -> str:
    """Pub/sub channel the brain publishes to when a tree changes (a wake-up, not a record)."""
    return f"{KEY_NS}tree:{tree_id}:events"


def key_tree_running(tree_id: str) -> str:
    """Hash: task id -> ``{run_id, worker, started_at}`` while a worker runs it (hot state only)."""
    return f"{KEY_NS}tree:{tree_id}:running"


def key_presence() -> str:
    """Hash: client id -> the accepted announcement of a connected client (its session)."""
    return f"{KEY_NS}presence"


def key_user_clients(user: str) -> str:
    """Set: the client ids of ``user``'s sessions in ``key_presence`` (an index the brain keeps
    beside it, so that routing a tree of one user reads that user's sessions, not every
    connected client's: with 1,000 connected, reading them all was ~5 ms of a brain's CPU)."""
    return f"{KEY_NS}presence:user:{user}"


def key_last_seen() -> str:
    """Hash: client id -> when its last session ended (a disconnect or a missed heartbeat), so
    `vancetope clients` and the web view say how long an offline client has been gone."""
    return f"{KEY_NS}last-seen"


def key_parked(owner: str) -> str:
    """List of ``{tree_id, task_id}`` waiting for a client, in order. ``owner`` is
    ``user:<name>`` or ``client:<id>``: whose connect may requeue them."""
    return f"{KEY_NS}parked:{owner}"


def key_requeueing(client_id: str) -> str:
    """List: parked refs taken atomically for one client's connect, until each is placed."""
    return f"{KEY_NS}requeueing:{client_id}"


def key_schedule_lock(schedule: str) -> str:
    """String (SET NX, expires): the token of the brain deciding a fire of ``schedule``, so two
    brains or a fire delivered twice never start two runs of an ``overlap = "skip"`` schedule."""
    return f"{KEY_NS}schedule:{schedule}:lock"


def key_schedule_queue(schedule: str) -> str:
    """List of ScheduleFire JSON: fires of an ``overlap = "queue"`` schedule waiting for its
    running run to end, oldest first."""
    return f"{KEY_NS}schedule:{schedule}:queued"


# The state a failed attempt leaves its task in when its retry policy covers it (the brain's
# TaskState.RETRYING): what a server pool's result sink answers, so that the pool's Celery
# task ends RETRY instead of FAILURE (Flower shows it so).
RETRYING = "retrying"


def key_retry_at() -> str:
    """Sorted set of the tasks waiting to retry, scored by when their next attempt starts
    (brain.hot.retries); a server pool that records a failed attempt sets its timer."""
    return f"{KEY_NS}retry-at"


# --- the admission gate of server pools (brain.hot.gate, docs/fair-share.md) ---------------
GATE_NS = f"{KEY_NS}gate:"


def key_gate_lanes() -> str:
    """ZSET of the lanes with calls waiting at the gate, by when each was last served."""
    return f"{GATE_NS}lanes"


def key_gate_lane(lane: str) -> str:
    """HASH of one lane: its pool queue, its wait list, its limits, why it waits."""
    return f"{GATE_NS}lane:{lane}"


def key_gate_fresh(lane: str) -> str:
    """Set while a lane was just recorded and its calls' messages may not be written yet."""
    return f"{GATE_NS}fresh:{lane}"


def gate_wait_prefix(lane: str) -> str:
    """kombu ``global_keyprefix`` of a lane's wait list: a call for pool queue Q waiting in lane L
    is kombu's own message for Q in list ``<prefix>Q``, moved unchanged into Q when admitted
    (its routing key already names Q, so a restored message goes back to Q)."""
    return f"{GATE_NS}w:{lane}:"


def key_gate_waiting() -> str:
    """HASH run id -> its lane and lease, while the run waits at the gate (status shows it throttled)."""
    return f"{GATE_NS}waiting"


def key_gate_held() -> str:
    """HASH run id -> the concurrency keys whose slots the admitted run holds."""
    return f"{GATE_NS}held"


def key_gate_pause(limit_key: str) -> str:
    """STRING ``<until µs>\t<why>`` while a limit key's budget is paused (a server's 429 with
    Retry-After: brain/hot/lua/pause.lua); the gate admits nothing under that key until then."""
    return f"{GATE_NS}pause:{limit_key}"


def key_gate_paused() -> str:
    """HASH limit key -> the end of its pause (µs, Redis time): what dispatchers and status read."""
    return f"{GATE_NS}paused"


def key_gate_wake() -> str:
    """LIST the brain's gate timer blocks on: a process that puts a call at the gate wakes it."""
    return f"{GATE_NS}wake"


def key_cancelled() -> str:
    """Set of run ids no worker may start (cancel survives offline workers: they check it).
    Under a client's connection prefix this is that client's own set."""
    return f"{KEY_NS}cancelled"


# The Celery message header saying a server call holds only a place in a queue window
# (``ToolCall.refills_window``). A header, not a body field: older pools ignore it.
REFILLS_WINDOW_HEADER: Final = "vt_refills_window"


def stop_member(run_id: str) -> str:
    """The member of the cancelled set that also stops ``run_id`` while it runs
    (``workers.call_stop``). Written for a cancel and an expiry only: a run taken back or
    re-sent is never started again, but one already running on a live agent goes on, and
    the new run is answered from its result (``workers.recent_calls``) instead of running
    the tool a second time."""
    return f"stop:{run_id}"


def key_tool_pins(client_id: str) -> str:
    """Hash: a client's tool name -> the digest of its definition the operator accepted (the
    brain's own key, outside ``c:<id>:``: a client must not be able to re-pin its tools)."""
    client_queue(client_id)  # validates
    return f"{KEY_NS}toolpins:{client_id}"


def key_misbehaving() -> str:
    """Hash: client id -> why the brain suspended that client (brain.hot.misbehaving), its causes
    as JSON. The brain's own key, outside ``c:<id>:``: a client must not clear its own mark."""
    return f"{KEY_NS}misbehaving"


def key_pool_workers(pool: str) -> str:
    """Sorted set: node name -> Redis time (s) until which that worker of ``pool`` counts as
    alive. Each pool worker renews its own entry (``workers.pool_presence``)."""
    return f"{KEY_NS}pool:{check_pool_name(pool)}:workers"


def key_deliveries(run_id: str) -> str:
    """Counter of how often one task run was delivered to a worker (poison-task guard)."""
    return f"{KEY_NS}run:{run_id}:deliveries"


# --- envelopes ----------------------------------------------------------------


class ToolType(StrEnum):
    MCP = "mcp"
    NATIVE = "native"
    BUILT_IN = "built_in"


# Wire limits of the ids and names a ToolCall carries; brain.core.models derives what a tree may hold.
MAX_WIRE_ID_CHARS = 128
# A run's id when its submitter chooses it: it names Redis keys and channels, so no ':' or space.
TREE_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"
MAX_TOOL_NAME_CHARS = 200
MAX_CALL_TIMEOUT_S = 24 * 3600
# The longest a client agent holds a call for its user's approval (its ``ask_timeout_s``). A
# run the brain took back meanwhile stays in that client's cancelled set longer than this
# (brain.hot.cancelled), so an approval given at the end of the wait never starts it.
MAX_ASK_TIMEOUT_S = 7 * 24 * 3600


class ToolCall(BaseModel):
    """One tool call, the body of a ``vancetope.run_tool`` job.

    ``run_id`` identifies one attempt of one task; it is also the Celery task id.
    Secrets are never here: workers resolve them by name at call time.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: str = Field(min_length=1, max_length=MAX_WIRE_ID_CHARS)
    tree_id: str = Field(min_length=1, max_length=MAX_WIRE_ID_CHARS)
    task_id: str = Field(min_length=1, max_length=MAX_WIRE_ID_CHARS)
    tool: str = Field(min_length=1, max_length=MAX_TOOL_NAME_CHARS)
    tool_type: ToolType
    mcp_server: str | None = None
    args: dict[str, Any] = Field(default_factory=dict)
    timeout_s: float = Field(gt=0, le=MAX_CALL_TIMEOUT_S)
    max_result_bytes: int = Field(gt=0)
    max_deliveries: int = Field(default=3, ge=1)
    # Set on client routes; the brain accepts a result only from this client.
    client_id: str | None = None
    # A gateway tools/call (an MCP client, so an LLM host, waits for it): the MCP server's
    # sampling and elicitation requests are passed on to that MCP client. Inside a tree they
    # are refused. Sent only when true, so an older agent (extra="forbid") still parses
    # every ordinary call.
    interactive: bool = False
    # Admitted by the gate under a max_concurrency cap or its pool's queue window (brain.hot.gate):
    # the server worker that ends the run runs the gate (giving a slot back). Server calls only;
    # sent only when true, as above.
    holds_slot: bool = False
    # Of a call that holds only a place in a queue window (fair share on): its end's run of the
    # gate may serve the worker's other ends of the moment (brain.runtime.gate_ends). Never in
    # the body, where an older pool would refuse an unknown field: the brain says it in the
    # message's header ``REFILLS_WINDOW_HEADER``, which an older pool ignores (it runs the gate
    # at each end, as it always did), and the pool worker sets it from there.
    refills_window: bool = Field(default=False, exclude=True)

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if not self.interactive:
            data.pop("interactive", None)
        if not self.holds_slot:
            data.pop("holds_slot", None)
        return data


class ErrorInfo(BaseModel):
    """An error as data: it crosses Celery as ``{type, message, data}``, never as a pickle."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: str
    message: str
    data: dict[str, Any] = Field(default_factory=dict)


class QueuedRun(BaseModel):
    """The body of a ``vancetope.publish_call`` job: which run to send to which client.
    Ids only; the brain rebuilds the call from its store."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tree_id: str = Field(min_length=1, max_length=MAX_WIRE_ID_CHARS)
    task_id: str = Field(min_length=1, max_length=MAX_WIRE_ID_CHARS)
    run_id: str = Field(min_length=1, max_length=MAX_WIRE_ID_CHARS)
    client_id: str = Field(min_length=1, max_length=MAX_WIRE_ID_CHARS)


class ScheduleFire(BaseModel):
    """The body of a ``vancetope.run_schedule`` job: beat fired ``schedule`` at ``fired_at``
    (unix seconds). ``token`` is unique per fire and the same on a re-delivery, so the run it
    starts gets the same tree id and the store refuses a second one."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schedule: str = Field(min_length=1, max_length=64)
    fired_at: float
    token: str = Field(min_length=6, max_length=64, pattern=r"^[0-9a-f]+$")
    catch_up: bool = False  # sent by beat at start for a time it missed while down


class SubmitTree(BaseModel):
    """The keyword arguments of a ``vancetope.submit_tree`` job: an autonomous run of ``tree``
    (a tree file's content as data). The run's user is the one of the submit queue the message
    came through (``submit_queue_of``); ``user``, if given, must be that one or the message is
    refused. ``tree_id`` lets the sender follow the run it asked for (there is no result
    backend to return one)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tree: dict[str, Any]
    user: str | None = Field(default=None, min_length=1, max_length=MAX_WIRE_ID_CHARS)
    tree_id: str | None = Field(default=None, pattern=TREE_ID_PATTERN)


def result_size(value: Any, mcp: Mapping[str, Any] | None = None) -> int:
    """What a result's payload costs on the wire and in the store: its value and its whole MCP
    result, each as compact UTF-8 JSON. The one measure that the server worker, the client
    agent and the brain hold against ``max_result_bytes``: measured three ways, a result that
    passed the worker and the agent was refused by the brain at twice its size.

    Raises TypeError or ValueError when either part is not JSON (NaN included)."""
    size = 0
    for part in (value, mcp):
        if part is not None:
            size += len(json.dumps(part, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode())
    return size


class ToolResult(BaseModel):
    """Outcome of one tool call, the body of a ``vancetope.record_result`` job."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: str
    tree_id: str
    task_id: str
    tool: str
    ok: bool
    # A built-in's or native tool's value. For an MCP tool it stays None on the wire and
    # ``mcp`` holds the server's whole CallToolResult in the spec's JSON (content blocks of
    # every type, structuredContent): the convenient value is derived from it by whoever
    # records it (``workers.mcp_clients.value_of``), so nothing travels twice.
    value: Any = None
    mcp: dict[str, Any] | None = None
    error: ErrorInfo | None = None
    worker: str = ""
    started_at: float
    finished_at: float
    # Who executed it: None for the server pool, else the client id.
    client_id: str | None = None
    # How many matches of its redaction patterns the client agent replaced before sending it.
    redactions: int = Field(default=0, ge=0)


def shown_failure(result: ToolResult) -> str:
    """What Flower shows of a failed call: the error's type and where its message is. The
    message may quote argument values or file contents (the store keeps it whole)."""
    kind = result.error.type if result.error else "failed"
    return f"{kind} (the message: vancetope status {result.tree_id})"


def _wire(model: str) -> Callable[[Any], Any]:
    """A check of one optional field of an MCP tool definition against the SDK's model of it,
    which returns it as it goes on the wire (camelCase, absent hints left out): what the
    gateway lists must be what the SDK can send."""

    def check(value: Any) -> Any:
        if value is None:
            return None
        from mcp import types  # here: only a tool that has such a field pays for the import

        found = getattr(types, model).model_validate(value)
        return found.model_dump(mode="json", by_alias=True, exclude_none=True)

    return check


def _wire_icons(value: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    return None if value is None else [_wire("Icon")(icon) for icon in value]


# What an MCP server may say of a tool beyond its name, description and inputSchema (MCP
# 2025-11-25 ``Tool``), kept as it said it so the gateway lists it whole: hosts act on
# annotations (``destructiveHint``), display title and icons, validate structuredContent
# against outputSchema. Every one optional and None by default, so an older agent's
# announcement and an older stored snapshot validate unchanged.
ToolTitle = Annotated[str | None, Field(default=None)]
ToolOutputSchema = Annotated[dict[str, Any] | None, Field(default=None)]
ToolAnnotationsWire = Annotated[
    dict[str, Any] | None, AfterValidator(_wire("ToolAnnotations")), Field(default=None)
]
ToolIconsWire = Annotated[list[dict[str, Any]] | None, AfterValidator(_wire_icons), Field(default=None)]
ToolExecutionWire = Annotated[
    dict[str, Any] | None, AfterValidator(_wire("ToolExecution")), Field(default=None)
]
ToolMeta = Annotated[dict[str, Any] | None, Field(default=None)]
# Those fields, by their names here and on the wire (``_meta`` is ``meta`` here).
TOOL_METADATA_FIELDS: dict[str, str] = {
    "title": "title",
    "output_schema": "outputSchema",
    "annotations": "annotations",
    "icons": "icons",
    "execution": "execution",
    "meta": "_meta",
}


def tool_metadata(tool: BaseModel) -> dict[str, Any]:
    """The metadata fields ``tool`` (a ToolDescriptor, ToolSpec, …) has, by their wire names."""
    found = {wire: getattr(tool, name, None) for name, wire in TOOL_METADATA_FIELDS.items()}
    return {wire: value for wire, value in found.items() if value is not None}


# --- what an MCP server offers beside tools: resources, prompts, completion -----------
#
# Each of these is routed like a tool (issue 24): an MCP server ``S`` that offers resources
# is also the tool ``S#read_resource``, prompts ``S#get_prompt``, completion ``S#complete``.
# The router, the offline strategies, parking, consent and the records then apply unchanged,
# on the server pool and on a workstation alike. ``#`` is outside the MCP name alphabet
# (``[A-Za-z0-9._-]``), so such a name can never be a real tool's, and the gateway never
# lists one as a tool. What the server listed travels with its entry (``McpSurface``).

SURFACE_MARK = "#"
READ_RESOURCE = "read_resource"
GET_PROMPT = "get_prompt"
COMPLETE = "complete"
SURFACE_OPS = (READ_RESOURCE, GET_PROMPT, COMPLETE)
# At most this many resources, templates and prompts of one server are listed (a filesystem
# server may offer every file it sees); a read of one left out is still routed (``truncated``).
MAX_SURFACE_ITEMS = 200


def surface_tool(server: str, op: str) -> str:
    """The tool name under which MCP server ``server``'s ``op`` is routed: ``notes#read_resource``."""
    return f"{server}{SURFACE_MARK}{op}"


def surface_op(name: str) -> tuple[str, str] | None:
    """(server, op) of a surface tool name, None for any other name."""
    server, mark, op = name.rpartition(SURFACE_MARK)
    if not mark or not server or op not in SURFACE_OPS:
        return None
    return server, op


# --- resources/updated, relayed to the gateway (issue 24) --------------------------------

# A gateway session's resources/subscribe reaches the process that holds the upstream session
# as a read with ``subscribe: true``; that process subscribes upstream (if the server declares
# ``resources.subscribe``) and keeps the subscription for the life of its session. Each
# ``notifications/resources/updated`` it then gets is a ``ResourceUpdated``: a server pool
# publishes it on ``channel_resource_updates``; a client agent (which may publish nowhere) sends
# it to its outbox, and the brain publishes it stamped with the outbox's owner.
MAX_RESOURCE_URI_CHARS = 2048
# What the gateway reads of one message on the channel before it parses anything.
MAX_RESOURCE_UPDATE_BYTES = 4 * 1024


class ResourceUpdated(BaseModel):
    """Upstream MCP server ``server`` said its resource ``uri`` changed. ``client_id``: the
    client whose server it is (set by the brain from the outbox it came through), None for a
    server of the server pool."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    server: str = Field(min_length=1, max_length=MAX_TOOL_NAME_CHARS)
    uri: str = Field(min_length=1, max_length=MAX_RESOURCE_URI_CHARS)
    client_id: str | None = Field(default=None, min_length=1, max_length=MAX_WIRE_ID_CHARS)


def channel_resource_updates() -> str:
    """Pub/sub channel of ``ResourceUpdated`` messages, which the gateway relays."""
    return f"{KEY_NS}resources:updated"


def _wire_list(model: str) -> Callable[[Any], Any]:
    one = _wire(model)
    return lambda items: [one(i) for i in items]


class McpSurface(BaseModel):
    """What one MCP server listed of one kind beside its tools, as the SDK puts it on the wire
    (camelCase): resources and resource templates on ``S#read_resource``, prompts on
    ``S#get_prompt`` (``S#complete`` carries none)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    resources: Annotated[list[dict[str, Any]], AfterValidator(_wire_list("Resource"))] = Field(
        default_factory=list, max_length=MAX_SURFACE_ITEMS
    )
    resource_templates: Annotated[list[dict[str, Any]], AfterValidator(_wire_list("ResourceTemplate"))] = (
        Field(default_factory=list, max_length=MAX_SURFACE_ITEMS)
    )
    prompts: Annotated[list[dict[str, Any]], AfterValidator(_wire_list("Prompt"))] = Field(
        default_factory=list, max_length=MAX_SURFACE_ITEMS
    )
    # The server listed more than MAX_SURFACE_ITEMS: what is here is the first of them.
    truncated: bool = False


class ToolDescriptor(BaseModel):
    """What an executor knows of one tool it can run: announced by a client agent,
    discovered from an MCP server with ``list_tools``, or declared by a built-in."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=MAX_TOOL_NAME_CHARS)
    type: ToolType
    mcp_server: str | None = None
    description: str = ""
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    title: ToolTitle = None
    output_schema: ToolOutputSchema = None
    annotations: ToolAnnotationsWire = None
    icons: ToolIconsWire = None
    execution: ToolExecutionWire = None
    meta: ToolMeta = None
    # Set on a surface tool (``surface_tool``) only: what its server listed.
    surface: McpSurface | None = None


class MCPServerFailure(BaseModel):
    """An MCP server that could not be started or listed, with the tail of its stderr."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    server: str
    message: str
    stderr_tail: str = ""

    def described(self, stderr_lines: int = 12) -> str:
        """What `explain` prints and the brain logs: the server, its command (in the message)
        and the last lines it wrote to stderr, which usually say why."""
        text = f"MCP server {self.server!r} failed to start: {self.message}"
        tail = self.stderr_tail.splitlines()[-stderr_lines:]
        if tail:
            text += "\n  its stderr ended with:\n" + "\n".join(f"    {line}" for line in tail)
        return text


# --- client agent <-> brain ----------------------------------------------------------
#
# A client agent's connection carries kombu's global_keyprefix ``c:<id>:`` and (in
# production) a Redis ACL confined to ``c:<id>:*``; every key below is relative to that
# prefix. The agent writes them through its prefix; the brain uses ``client_key``.

CLIENT_OUTBOX = "outbox"  # list: ClientMessage JSON, LPUSH by the agent, popped by the brain
CLIENT_HEARTBEAT = "heartbeat"  # string: the agent's session id, with a TTL
# string: the agent's round trip to Redis in ms ("12.5", the median of its last heartbeats),
# written with each heartbeat and with its TTL; `vancetope clients` shows it
CLIENT_ROUND_TRIP = "rtt"
MAX_ROUND_TRIP_BYTES = 16
CLIENT_ACK = "ack"  # string: the brain's AnnouncementAck JSON for the latest announcement
# kombu's Redis transport keeps a connection's in-flight (reserved, unacked) messages in this
# hash, with delivery times in the sorted set beside it (under the client's prefix too).
KOMBU_UNACKED = "unacked"
KOMBU_UNACKED_INDEX = "unacked_index"

MAX_ANNOUNCEMENT_BYTES = 256 * 1024
MAX_ANNOUNCED_TOOLS = 500


def client_key(client_id: str, name: str) -> str:
    """The full Redis key of one of a client's keys, as the brain (no prefix) sees it."""
    return client_keyprefix(client_id) + name


class ClientType(StrEnum):
    DESKTOP = "desktop"
    CLI = "cli"


class ClientConnected(BaseModel):
    """Seed 000 §5: sent on connect and whenever the agent's tools change."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["client_connected"] = "client_connected"
    client_id: str
    session_id: str = Field(min_length=1, max_length=128)
    client_type: ClientType = ClientType.DESKTOP
    available_tools: list[ToolDescriptor] = Field(default_factory=list, max_length=MAX_ANNOUNCED_TOOLS)
    sent_at: float


class ClientDisconnected(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["client_disconnected"] = "client_disconnected"
    client_id: str
    session_id: str
    reason: str = "graceful shutdown"
    sent_at: float


MAX_PROGRESS_MESSAGE_CHARS = 500


class ToolProgress(BaseModel):
    """A progress notification an MCP server sent while a call runs (notifications/progress)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: str = Field(min_length=1, max_length=MAX_WIRE_ID_CHARS)
    tree_id: str = Field(min_length=1, max_length=MAX_WIRE_ID_CHARS)
    task_id: str = Field(min_length=1, max_length=MAX_WIRE_ID_CHARS)
    progress: float
    total: float | None = None
    message: str | None = Field(default=None, max_length=MAX_PROGRESS_MESSAGE_CHARS)
    at: float
    client_id: str | None = None


class ClientToolProgress(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["tool_progress"] = "tool_progress"
    client_id: str
    progress: ToolProgress


# --- what a running call says besides its progress (issue 24): logs and asks -------------
#
# An MCP server's notifications/message and its sampling/elicitation requests during a gateway
# call reach the MCP client that made the call: from the worker (server pool) or through the
# client's outbox and the brain's relay (client agent), then as a ``TreeEvent`` on the tree's
# channel, which the gateway following the call reads. Everything here is bounded: a
# workstation sends it, and the gateway passes it to someone's LLM host.

LogLevel = Literal["debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"]
# RFC 5424 severities, least severe first (MCP's logging levels).
LOG_LEVELS: tuple[LogLevel, ...] = (
    "debug", "info", "notice", "warning", "error", "critical", "alert", "emergency",
)  # fmt: skip
MAX_LOG_DATA_BYTES = 8 * 1024
MAX_LOGGER_CHARS = 200
# An ask's params and an answer's result, as compact JSON (a sampling prompt, a form's schema).
MAX_ASK_BYTES = 256 * 1024
MAX_ASK_ERROR_CHARS = 2000
ASK_ID_PATTERN = r"^[0-9a-f]{32}$"


def json_size(value: Any) -> int:
    """Bytes of ``value`` as compact UTF-8 JSON (ValueError/TypeError when it is not JSON)."""
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode())


def _capped(limit: int, what: str) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if json_size(value) > limit:
            raise ValueError(f"{what} is over {limit} bytes as JSON")
        return value

    return check


class ToolLog(BaseModel):
    """A log message an MCP server sent while a call runs (notifications/message)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: str = Field(min_length=1, max_length=MAX_WIRE_ID_CHARS)
    tree_id: str = Field(min_length=1, max_length=MAX_WIRE_ID_CHARS)
    task_id: str = Field(min_length=1, max_length=MAX_WIRE_ID_CHARS)
    level: LogLevel
    logger: str | None = Field(default=None, max_length=MAX_LOGGER_CHARS)
    data: Annotated[Any, AfterValidator(_capped(MAX_LOG_DATA_BYTES, "a log message's data"))] = None
    at: float = Field(allow_inf_nan=False)
    client_id: str | None = Field(default=None, max_length=MAX_WIRE_ID_CHARS)


class ClientToolLog(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["tool_log"] = "tool_log"
    client_id: str = Field(max_length=MAX_WIRE_ID_CHARS)
    log: ToolLog


AskKind = Literal["sampling", "elicitation"]


class ToolAsk(BaseModel):
    """An MCP server's sampling/createMessage or elicitation/create request during a gateway
    call, to be put to the MCP client that made the call. ``params`` are the request's params
    as the spec spells them (the gateway validates them with the SDK's models)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: str = Field(min_length=1, max_length=MAX_WIRE_ID_CHARS)
    tree_id: str = Field(min_length=1, max_length=MAX_WIRE_ID_CHARS)
    task_id: str = Field(min_length=1, max_length=MAX_WIRE_ID_CHARS)
    ask_id: str = Field(pattern=ASK_ID_PATTERN)
    kind: AskKind
    params: Annotated[dict[str, Any], AfterValidator(_capped(MAX_ASK_BYTES, "an ask's params"))]
    # When the worker stops waiting (unix seconds; the call's timeout bounds it): the gateway
    # stops asking its MCP client then, and writes no answer nobody would read.
    answer_by: float = Field(allow_inf_nan=False)
    # The client the call runs on (None: the server pool): where the answer goes. Set by
    # whoever passes the ask on (the brain's relay: the outbox it came through), never taken
    # from a workstation's word.
    client_id: str | None = Field(default=None, max_length=MAX_WIRE_ID_CHARS)


class ClientToolAsk(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["tool_ask"] = "tool_ask"
    client_id: str = Field(max_length=MAX_WIRE_ID_CHARS)
    ask: ToolAsk


class AskAnswer(BaseModel):
    """The gateway's answer to a ``ToolAsk``: the MCP client's result (a CreateMessageResult or
    an ElicitResult as the spec spells it), or why there is none."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ask_id: str = Field(pattern=ASK_ID_PATTERN)
    ok: bool
    result: Annotated[dict[str, Any], AfterValidator(_capped(MAX_ASK_BYTES, "an answer"))] | None = None
    error: str = Field(default="", max_length=MAX_ASK_ERROR_CHARS)


def key_answer(ask_id: str) -> str:
    """List: the gateway's ``AskAnswer`` to a server pool's ask (the pool BLPOPs it)."""
    if not re.fullmatch(ASK_ID_PATTERN, ask_id):
        raise ValueError(f"invalid ask id {ask_id!r}")
    return f"{KEY_NS}answer:{ask_id}"


def client_answer_key(ask_id: str) -> str:
    """The same for a client agent's ask, relative to the client's prefix (``client_key``): a
    key of its own, the only kind it can read."""
    if not re.fullmatch(ASK_ID_PATTERN, ask_id):
        raise ValueError(f"invalid ask id {ask_id!r}")
    return f"answer:{ask_id}"


class ProgressEvent(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["progress"] = "progress"
    progress: ToolProgress


class LogEvent(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["log"] = "log"
    log: ToolLog


class AskEvent(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["ask"] = "ask"
    ask: ToolAsk


# A message on ``channel_tree_events`` that says more than "something changed" (b"1"): every
# listener wakes on any message; the gateway reads these.
TreeEvent = Annotated[ProgressEvent | LogEvent | AskEvent, Field(discriminator="kind")]
TREE_EVENT: TypeAdapter[TreeEvent] = TypeAdapter(TreeEvent)


class ToolStarted(BaseModel):
    """A client agent began a call it was sent (its delivery was counted, not cancelled, within
    ``max_deliveries``), before asking its user's approval if it asks: the brain records the
    run as ``running``. An agent that never sends it leaves the call ``queued_client``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: str = Field(min_length=1, max_length=MAX_WIRE_ID_CHARS)
    tree_id: str = Field(min_length=1, max_length=MAX_WIRE_ID_CHARS)
    task_id: str = Field(min_length=1, max_length=MAX_WIRE_ID_CHARS)
    # unix seconds on the workstation's clock; a finite number, never NaN or infinity
    started_at: float = Field(ge=0, allow_inf_nan=False)
    client_id: str | None = Field(default=None, max_length=MAX_WIRE_ID_CHARS)


class ClientToolStarted(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["tool_started"] = "tool_started"
    client_id: str = Field(max_length=MAX_WIRE_ID_CHARS)
    started: ToolStarted


class ToolAwaiting(BaseModel):
    """A client's call held for its user's approval (``waiting``), or let go again after it
    was approved (not ``waiting``). A denial or a timeout is a failed ``ToolResult``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: str = Field(min_length=1, max_length=MAX_WIRE_ID_CHARS)
    tree_id: str = Field(min_length=1, max_length=MAX_WIRE_ID_CHARS)
    task_id: str = Field(min_length=1, max_length=MAX_WIRE_ID_CHARS)
    waiting: bool
    # The id the user approves it by (``vancetope-agent approve ID``), shown in ``status``.
    approval_id: str = Field(default="", max_length=MAX_WIRE_ID_CHARS)
    at: float
    client_id: str | None = None


class ClientToolAwaiting(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["tool_awaiting"] = "tool_awaiting"
    client_id: str
    awaiting: ToolAwaiting


class ClientToolResult(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["tool_result"] = "tool_result"
    client_id: str
    result: ToolResult


class ClientResourceUpdated(BaseModel):
    """A server of the client's mcp.json said a resource it subscribed to changed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["resource_updated"] = "resource_updated"
    client_id: str = Field(max_length=MAX_WIRE_ID_CHARS)
    updated: ResourceUpdated


ClientMessage = Annotated[
    ClientConnected
    | ClientDisconnected
    | ClientToolResult
    | ClientToolProgress
    | ClientToolStarted
    | ClientToolAwaiting
    | ClientToolLog
    | ClientToolAsk
    | ClientResourceUpdated,
    Field(discriminator="type"),
]
CLIENT_MESSAGE: TypeAdapter[ClientMessage] = TypeAdapter(ClientMessage)


class AnnouncementAck(BaseModel):
    """The brain's answer to an announcement, written to the client's ``ack`` key."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    session_id: str
    accepted: bool
    reason: str = ""
    tools: int = 0


# --- limits every consumer enforces on what it pops (workers.transport) ----------

# A result of max_result_bytes (default 1 MiB) travels JSON-escaped inside a Celery body,
# base64-encoded inside kombu's envelope: well under this. Raise it with max_result_bytes.
MAX_MESSAGE_BYTES = 8 * 1024 * 1024
# Deeper than any tool's real JSON, far below what a recursive parser (CPython's json:
# ~1000, pydantic's jiter: 200) can survive.
MAX_JSON_DEPTH = 128
