"""Models of the brain's vocabulary (layer: brain/core; pure).

Tool specs and the registry (seed 000 §3), task trees (§6), and the records the
store keeps. Field-level checks live here; whole-tree checks (cycles, references,
argument schemas) live in ``brain.core.validation``.
"""

from __future__ import annotations

import re
from enum import StrEnum
from functools import cached_property
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    TypeAdapter,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from brain.core.retry import Attempt, RetryPolicy
from workers.contracts import (
    MAX_CALL_TIMEOUT_S,
    MAX_TOOL_NAME_CHARS,
    MAX_WIRE_ID_CHARS,
    READ_RESOURCE,
    ErrorInfo,
    McpSurface,
    ToolAnnotationsWire,
    ToolExecutionWire,
    ToolIconsWire,
    ToolMeta,
    ToolOutputSchema,
    ToolTitle,
    ToolType,
    check_pool_name,
    surface_op,
    surface_tool,
)
from workers.contracts import RETRYING as RETRYING_STATE
from workers.rates import Concurrency, RateLimitText
from workers.toolnames import LEGACY_SEPARATOR, canonical

# --- ids: one grammar, sized so that whatever a tree file may hold fits on the wire -------

# Letters, digits and `_ . : -`, starting with a letter or digit.
ID_BODY = r"[A-Za-z0-9][A-Za-z0-9_.:-]*"
_ID = re.compile(ID_BODY)
_ID_ADVICE = "use letters, digits, '_', '.', ':' and '-', starting with a letter or digit"
# A task id may not hold a dot-segment `result` after its first one: `${tasks.a.result.b.result}`
# could not tell task `a.result.b` from task `a`. The reference grammar (brain.core.validation._REF)
# relies on this to find the id unambiguously.
_RESULT_SEGMENT = re.compile(r"\.(?:results?|mcp|status|error)(?:\.|$)")  # the roots of a reference
# A run's tree id is `<tree.id>-<YYYYmmdd-HHMMSS>-<6 hex>` (Scheduler.submit): 23 characters on top.
RUN_TREE_ID_SUFFIX_CHARS = 23
MAX_TREE_ID_CHARS = MAX_WIRE_ID_CHARS - RUN_TREE_ID_SUFFIX_CHARS
MAX_TASK_ID_CHARS = MAX_WIRE_ID_CHARS
MAX_TOOL_ID_CHARS = 128  # within MAX_TOOL_NAME_CHARS, the wire's limit for tool names


def check_id(value: str, max_chars: int) -> str:
    """``value`` when it is a valid id of at most ``max_chars``; else ValueError saying what to change."""
    if not _ID.fullmatch(value):
        raise ValueError(f"{value!r} is not a valid id: {_ID_ADVICE}")
    if len(value) > max_chars:
        raise ValueError(
            f"is {len(value)} characters long; at most {max_chars} (it travels in every tool call)"
        )
    return value


_ITEM_ID = re.compile(r"(?P<parent>.+)\[(?P<index>\d+)\]")


def check_task_id(value: str) -> str:
    check_id(value, MAX_TASK_ID_CHARS)
    found = _RESULT_SEGMENT.search(value)
    if found:
        part = found.group(0).rstrip(".")
        raise ValueError(
            f"{value!r} holds {part!r} as a dot-separated part, which ${{tasks.<id>{part}}} "
            f"references could not tell apart; rename it (e.g. {part[1:]!r} -> {part[1:4]!r})"
        )
    return value


def check_pool(value: str | None) -> str | None:
    """A pool name (``[[pools]]`` in vancetope.toml, or ``default``); whether it is configured
    is checked against the configuration (``brain.core.pools``), not here."""
    return None if value is None else check_pool_name(value)


PRIORITY_WORDS = {"low": 2, "normal": 5, "high": 8}


def _priority(value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, str) and value.strip().lower() in PRIORITY_WORDS:
        return PRIORITY_WORDS[value.strip().lower()]
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 9:
        return value
    raise ValueError(
        f"{value!r} is not a priority: write high, normal or low, or a whole number 0-9 (9 first)"
    )


# ``priority:`` of a tree or a task: a word or 0-9, kept as the number (higher goes first).
Priority = Annotated[int | None, BeforeValidator(_priority)]


class Location(StrEnum):
    SERVER = "server"
    CLIENT = "client"
    BOTH = "both"


class Side(StrEnum):
    SERVER = "server"
    CLIENT = "client"


class OfflineStrategy(StrEnum):
    BLOCK = "block"
    SKIP = "skip"
    FALLBACK = "fallback"
    QUEUE = "queue"


class ExecutionTarget(StrEnum):
    AUTO = "auto"
    SERVER = "server"
    CLIENT = "client"
    ANY = "any"


class RunIf(StrEnum):
    """When a task with dependencies runs, by how they ended (``run_if:``)."""

    ALL_SUCCEEDED = "all_succeeded"  # every dependency done (the default)
    ALL_DONE = "all_done"  # every dependency final, whatever the outcome: clean-up
    ANY_FAILED = "any_failed"  # every dependency final, and one not done: notify
    NONE_FAILED = "none_failed"  # every dependency done or skipped


class SessionKind(StrEnum):
    INTERACTIVE = "interactive"
    AUTONOMOUS = "autonomous"


class ToolSpec(BaseModel):
    """One tool of the registry (seed 000 §3).

    ``location: prefer_server|prefer_client`` is accepted and normalised to
    ``both`` + ``prefer``, so code downstream only ever sees three locations.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    location: Location
    type: ToolType = ToolType.BUILT_IN
    mcp_server: str | None = None
    prefer: Side | None = None
    offline_strategy: OfflineStrategy | None = None
    fallback_tool: str | None = None
    description: str = ""
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    timeout_s: float | None = Field(default=None, gt=0, le=MAX_CALL_TIMEOUT_S)
    # How long a call may wait parked for a client before it expires (issue: client path).
    max_wait_s: float | None = Field(default=None, gt=0)
    # The server pool that runs this tool (a ``[[pools]]`` name); None: the tree's, else the default.
    pool: str | None = None
    # How a failed call of this tool is tried again, unless its task says otherwise (brain.core.retry).
    retry: RetryPolicy | None = None
    # How fast and how many at once its server runs may go, across every pool process
    # ("10/s", "100/m", "1000/h"; docs/fair-share.md).
    rate_limit: RateLimitText = None
    max_concurrency: Concurrency = None
    # What its MCP server said of it beyond description and input_schema (workers.contracts,
    # wire names inside: destructiveHint, mimeType); the gateway lists it whole. A registry
    # file may set them too (for a tool of any type).
    title: ToolTitle = None
    output_schema: ToolOutputSchema = None
    annotations: ToolAnnotationsWire = None
    icons: ToolIconsWire = None
    execution: ToolExecutionWire = None
    meta: ToolMeta = None
    # A surface tool's (``<server>#read_resource``, …): what its MCP server listed.
    surface: McpSurface | None = None

    _valid_pool = field_validator("pool")(check_pool)

    @field_validator("name")
    @classmethod
    def _valid_name(cls, v: str) -> str:
        # Resources, prompts and completion of MCP server S route as ``S#<op>``.
        surface = surface_op(v)
        if surface is not None:
            check_id(surface[0], MAX_TOOL_ID_CHARS)
            return v
        # A tool of an MCP server may be named ``<server>.<tool>``, an id like any (a dot is
        # an id's); the old ``<server>/<tool>`` is read as that (brain.core.toolnames).
        server, slash, tool = v.partition(LEGACY_SEPARATOR)
        if slash:
            check_id(server, MAX_TOOL_ID_CHARS)
            check_id(tool, MAX_TOOL_ID_CHARS)
        return check_id(canonical(v), MAX_TOOL_ID_CHARS)

    @field_validator("fallback_tool")
    @classmethod
    def _canonical_fallback(cls, v: str | None) -> str | None:
        return None if v is None else canonical(v)

    @model_validator(mode="before")
    @classmethod
    def _normalise_prefer_shorthand(cls, data: Any) -> Any:
        # Seed 000 §3 writes MCP tools as just `mcp_server: jira-mcp`, with no type.
        if isinstance(data, dict) and data.get("mcp_server") and "type" not in data:
            data = {**data, "type": ToolType.MCP.value}
        if isinstance(data, dict) and data.get("location") in ("prefer_server", "prefer_client"):
            side = data["location"].removeprefix("prefer_")
            if data.get("prefer") not in (None, side):
                raise ValueError(
                    f"location {data['location']!r} contradicts prefer {data['prefer']!r}; drop one"
                )
            data = {**data, "location": "both", "prefer": side}
        return data

    @model_validator(mode="after")
    def _check_consistency(self) -> ToolSpec:
        if self.type is ToolType.MCP and not self.mcp_server:
            raise ValueError("type 'mcp' needs mcp_server (the server's name in mcpServers)")
        if self.pool is not None and self.location is Location.CLIENT:
            raise ValueError(
                f"pool {self.pool!r} applies to server runs, and location 'client' never runs there"
            )
        for field in ("rate_limit", "max_concurrency"):
            if getattr(self, field) is not None and self.location is Location.CLIENT:
                raise ValueError(f"{field} applies to server runs, and location 'client' never runs there")
        if self.prefer is not None and self.location is not Location.BOTH:
            raise ValueError(f"prefer only applies to location 'both', not {self.location.value!r}")
        if self.offline_strategy is OfflineStrategy.FALLBACK and not (
            self.fallback_tool or self.location is Location.BOTH
        ):
            raise ValueError("offline_strategy 'fallback' needs fallback_tool (or location 'both')")
        return self

    @property
    def preferred_side(self) -> Side:
        """For ``both``: the side named by ``prefer`` (server when unset: it is the robust one)."""
        return self.prefer or Side.SERVER


class RegistryFile(BaseModel):
    """The ``tools:`` list of a registry file (seed 000 §3). Its ``engines:`` are parsed by
    ``brain.core.treefile``, which removes them before validating against this model."""

    model_config = ConfigDict(extra="forbid")

    tools: list[ToolSpec] = Field(default_factory=list)


def _canonical_any(name: Any) -> Any:
    return canonical(name) if isinstance(name, str) else name


class TaskSpec(BaseModel):
    """One task of a tree (seed 000 §6).

    ``tool`` is the call this task makes, ``args`` its arguments; a string arg
    ``"${tasks.<id>.result}"`` (optionally ``.result.<path>``) is replaced by an
    upstream task's result. ``tools`` is the task's declared toolset (defaults
    to ``[tool]``).
    """

    # populate_by_name: a stored tree keeps ``item_name``; files write ``as``.
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    id: str
    goal: str = ""
    tool: str = Field(min_length=1, max_length=MAX_TOOL_NAME_CHARS)
    args: dict[str, Any] = Field(default_factory=dict)
    tools: list[str] = Field(default_factory=list)
    depends_on: list[str] = Field(default_factory=list)
    execution_target: ExecutionTarget = ExecutionTarget.AUTO
    # How long one started call may run (overrides the tool's timeout_s).
    timeout_s: float | None = Field(default=None, gt=0, le=MAX_CALL_TIMEOUT_S)
    # How long the whole task may take, from first leaving `pending` to a final state,
    # waiting for a client and retries included (Temporal's schedule-to-close).
    max_total_s: float | None = Field(default=None, gt=0)
    # The server pool for this task's server runs; wins over the tool's and the tree's pool.
    pool: str | None = None
    # How a failed call is tried again; wins over the tool's, the tree's and the setting's.
    retry: RetryPolicy | None = None
    # Which outcomes of its dependencies let it run (Airflow's trigger rules).
    run_if: RunIf = RunIf.ALL_SUCCEEDED
    # One task per item of a dependency's list result, made when this task is ready:
    # "${tasks.<id>.result.<path>}"; each item is ``${<as>}`` in its args (brain.core.fanout).
    for_each: str | None = None
    item_name: str = Field(default="item", alias="as", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    # At most this many items (default: the max_fan_out setting); more fails the task.
    max_fan_out: int | None = Field(default=None, gt=0)
    # high | normal | low or 0-9 (kept as the number; wins over the tree's): brain.core.fairshare.
    priority: Priority = None

    _valid_pool = field_validator("pool")(check_pool)
    # The tool names as written, where they were the deprecated ``<server>/<tool>`` form
    # (``legacy_names``); never stored: the tree keeps ``<server>.<tool>``.
    _legacy: tuple[str, ...] = PrivateAttr(default=())

    @model_validator(mode="wrap")
    @classmethod
    def _read_legacy_names(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> TaskSpec:
        # ``git/git_status`` still works: read as ``git.git_status``, and remembered so that
        # the submission warns (brain.core.submission); a stored tree holds the new form only.
        if not isinstance(data, dict):
            return handler(data)
        tools = data.get("tools")
        written = [data.get("tool"), *(tools if isinstance(tools, list) else [])]
        legacy = tuple(n for n in written if isinstance(n, str) and LEGACY_SEPARATOR in n)
        if legacy:  # anything else is left for the fields' own errors
            data = {**data, "tool": _canonical_any(data.get("tool"))} if "tool" in data else dict(data)
            if isinstance(tools, list):
                data["tools"] = [_canonical_any(n) for n in tools]
        spec: TaskSpec = handler(data)
        spec._legacy = tuple(dict.fromkeys(legacy))
        return spec

    @property
    def legacy_names(self) -> tuple[str, ...]:
        """Tool names this task was written with in the deprecated ``<server>/<tool>`` form."""
        return self._legacy

    @model_validator(mode="before")
    @classmethod
    def _read_resource_of_a_server(cls, data: Any) -> Any:
        # ``tool: read_resource`` with ``args: {server: S, uri: U}`` reads a resource of MCP
        # server S (the brain's or a workstation's) wherever S runs: it is the call of
        # ``S#read_resource`` (workers.contracts.surface_tool), so it routes, parks and is
        # recorded like a tool call of S. The server is named here, not looked up by URI:
        # the route is chosen from it, and its client may be offline when the tree comes in.
        if not isinstance(data, dict) or data.get("tool") != READ_RESOURCE:
            return data
        args = data.get("args")
        server = args.get("server") if isinstance(args, dict) else None
        if not isinstance(server, str) or not server or "${" in server:
            raise ValueError(
                "read_resource needs args.server, the name of the MCP server whose resource it reads "
                "(as in the brain's mcpServers file or the workstation's mcp.json), and args.uri"
            )
        assert isinstance(args, dict)
        rest = {k: v for k, v in args.items() if k != "server"}
        return {**data, "tool": surface_tool(server, READ_RESOURCE), "args": rest}

    @field_validator("id")
    @classmethod
    def _valid_id(cls, v: str) -> str:
        # ``<id>[<i>]``: an item of a for_each task (brain.core.fanout), made by the brain,
        # never written in a tree file (TaskTree refuses it there).
        item = _ITEM_ID.fullmatch(v)
        return v if item and check_task_id(item["parent"]) else check_task_id(v)

    @field_validator("tools")
    @classmethod
    def _unique_tools(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("tools lists a tool twice")
        return v

    @model_validator(mode="after")
    def _run_if_needs_dependencies(self) -> TaskSpec:
        if self.run_if is not RunIf.ALL_SUCCEEDED and not self.depends_on:
            raise ValueError(
                f"run_if {self.run_if.value!r} decides by its dependencies, and it has no depends_on"
            )
        return self

    @property
    def toolset(self) -> list[str]:
        return self.tools or [self.tool]


class TaskTree(BaseModel):
    """A task tree file: an id, an optional goal, the think-process engine whose toolset
    bounds it (seed 000 §8; defined in the registry file), and its tasks."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    goal: str = ""
    engine: str | None = None
    # How long this tree's tasks may wait parked for a client (over the tool's max_wait_s).
    max_wait_s: float | None = Field(default=None, gt=0)
    # The server pool of this tree's server runs when neither the task nor its tool names one.
    pool: str | None = None
    # How this tree's failed calls are tried again when neither the task nor its tool says.
    retry: RetryPolicy | None = None
    # high | normal | low or 0-9 for its tasks that name none (brain.core.fairshare).
    priority: Priority = None
    tasks: list[TaskSpec] = Field(min_length=1)

    _valid_pool = field_validator("pool")(check_pool)

    @field_validator("id")
    @classmethod
    def _valid_id(cls, v: str) -> str:
        # The run's tree id adds a timestamp and a token, and must still fit the wire.
        return check_id(v, MAX_TREE_ID_CHARS)

    @model_validator(mode="after")
    def _no_item_ids(self) -> TaskTree:
        for t in self.tasks:
            if _ITEM_ID.fullmatch(t.id):
                raise ValueError(
                    f"task id {t.id!r}: '<id>[<n>]' names the items of a for_each task; rename it"
                )
        return self

    @model_serializer(mode="wrap")
    def _whole(self, handler: SerializerFunctionWrapHandler) -> Any:
        # A stored tree reads its tasks in when first asked (StoredTaskTree): before it is
        # written out, so that no copy of it ever lacks them.
        self.tasks  # noqa: B018
        return handler(self)

    def task(self, task_id: str) -> TaskSpec:
        return self._by_id[task_id]

    @cached_property
    def _by_id(self) -> dict[str, TaskSpec]:
        return {t.id: t for t in self.tasks}

    @cached_property
    def dependents(self) -> dict[str, list[str]]:
        """Task id -> the tasks that depend on it, in tree order: after a result, only these
        can become ready (or be skipped), so advancing costs O(dependents), not O(tree)."""
        index: dict[str, list[str]] = {}
        for t in self.tasks:
            for dep in t.depends_on:
                index.setdefault(dep, []).append(t.id)
        return index


_TASK_LIST: TypeAdapter[list[TaskSpec]] = TypeAdapter(list[TaskSpec])


class StoredTaskTree(TaskTree):
    """A tree read back from the store to advance it (``TreeRecord.stored``). Its spec was
    validated whole when it was submitted and never changes, and a process recording one
    result asks about that task's dependents only: so its header is validated when it is
    read, a task when it is first asked for (``task``; ``dependents`` comes from the stored
    ``depends_on`` lists), and the whole list only when something reads ``tasks``. Every
    process that recorded a result of a 5,000-task tree validated all 5,000 specs once
    (bench/README.md, "The CPU rows"); it now reads the JSON and validates what it uses.

    It is a ``TaskTree`` in every other way: written out (``model_dump``) or compared, it
    reads its tasks in first."""

    _raw: list[dict[str, Any]] = PrivateAttr(default_factory=list)
    _specs: dict[str, TaskSpec] = PrivateAttr(default_factory=dict)

    @classmethod
    def of(cls, header: TaskTree, raw_tasks: list[dict[str, Any]]) -> StoredTaskTree:
        """``header``'s fields (validated) with ``raw_tasks`` (as stored) as its tasks."""
        fields = {name: getattr(header, name) for name in TaskTree.model_fields if name != "tasks"}
        tree = cls.model_construct(header.model_fields_set - {"tasks"}, **fields)
        tree._raw = raw_tasks
        return tree

    def __getattr__(self, name: str) -> Any:
        if name != "tasks":
            return super().__getattr__(name)  # type: ignore[misc]
        tasks = _TASK_LIST.validate_python(self._raw)
        self.__dict__["tasks"] = tasks
        return tasks

    def task(self, task_id: str) -> TaskSpec:
        if "tasks" in self.__dict__:
            return super().task(task_id)
        spec = self._specs.get(task_id)
        if spec is None:
            spec = self._specs[task_id] = TaskSpec.model_validate(self._raw_by_id[task_id])
        return spec

    @cached_property
    def _raw_by_id(self) -> dict[str, dict[str, Any]]:
        return {t["id"]: t for t in self._raw}

    @cached_property
    def dependents(self) -> dict[str, list[str]]:
        index: dict[str, list[str]] = {}
        for t in self._raw:
            for dep in t.get("depends_on") or ():
                index.setdefault(dep, []).append(t["id"])
        return index

    def __eq__(self, other: object) -> bool:
        # Also asked for ``TaskTree == StoredTaskTree`` (a subclass's __eq__ goes first).
        if not isinstance(other, TaskTree):
            return NotImplemented
        return self.model_dump() == other.model_dump()

    __hash__ = None  # type: ignore[assignment]


# --- records kept by the store ---------------------------------------------------


class TaskState(StrEnum):
    PENDING = "pending"  # waiting for its dependencies
    QUEUED_SERVER = "queued_server"
    QUEUED_CLIENT = "queued_client"
    RUNNING = "running"
    # Held on the client agent until its user approves the call (vancetope-agent approve).
    AWAITING_APPROVAL = "awaiting_approval"
    BLOCKED = "blocked"
    PENDING_CLIENT = "pending_client"
    # An attempt failed in a way its retry policy covers; the next one starts at ``retry_at``.
    RETRYING = RETRYING_STATE
    # A for_each task that made one task per item (``<id>[0]``, ...): it ends when they all have.
    FANNED_OUT = "fanned_out"
    DONE = "done"
    FAILED = "failed"
    SKIPPED = "skipped"
    EXPIRED = "expired"
    # Its ``run_if`` did not hold (an ``any_failed`` notify when nothing failed, and what
    # depends on it): not run by design, so it does not fail its tree, as ``skipped`` does.
    NOT_TRIGGERED = "not_triggered"

    @property
    def is_final(self) -> bool:
        return self in _FINAL


_FINAL = frozenset(
    {TaskState.DONE, TaskState.FAILED, TaskState.SKIPPED, TaskState.EXPIRED, TaskState.NOT_TRIGGERED}
)


class TreeStatus(StrEnum):
    RUNNING = "running"
    DONE = "done"  # every task done (or not triggered: its run_if did not hold)
    FAILED = "failed"  # ended with a task failed, skipped or expired


class Progress(BaseModel):
    """Latest progress of a running call: ``progress`` of ``total`` (if known), a message."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    progress: float
    total: float | None = None
    message: str | None = None
    at: float


class TaskRecord(BaseModel):
    """The durable record of one task. ``run_id`` changes with every dispatch attempt."""

    model_config = ConfigDict(extra="forbid")

    tree_id: str
    task_id: str
    tool: str
    state: TaskState = TaskState.PENDING
    run_id: str | None = None
    attempt: int = 0
    route: str = ""  # human-readable route summary: "server", "server:gpu", "client:alice"; never parsed
    # The client this task's current run was sent to (None: the server pool). Written with
    # each new run id, kept while the task is parked; what authorises that client's result.
    client_id: str | None = None
    # The named server pool this task's current run was sent to (None: the default pool, or a
    # client). Written with each new run id: what the reconciler re-sends to.
    pool: str | None = None
    reason: str = ""  # why it is in this state (blocked_reason, skip reason, ...)
    result: Any = None  # the convenient value: ${tasks.<id>.result}
    # An MCP tool's whole CallToolResult (content blocks, structuredContent), as the server
    # sent it, on either route: ${tasks.<id>.mcp.content.0.data}
    mcp: dict[str, Any] | None = None
    # The latest progress notification of the current run (an MCP server's notifications/progress).
    progress: Progress | None = None
    error: ErrorInfo | None = None
    # Matches of the client agent's redaction patterns replaced in the result before it was sent.
    redactions: int = 0
    worker: str = ""
    # How often a server worker began the current run (``Store.begin_run``; 0: not yet). A
    # run past ``max_deliveries`` killed its worker each time: it fails as a poison task.
    deliveries: int = 0
    # How often a run of this task was running on a client when its agent went away (died,
    # restarted as a new session, or let its heartbeat lapse) and the brain took the call back
    # (brain.core.client_poison). Counted across the runs of one attempt: each take-back re-sends
    # the call as a new run whose ``deliveries`` start afresh, so this is the client route's
    # poison bound. A failed attempt waiting to retry starts it again at 0.
    taken_back: int = 0
    # How often the reconciler found this task's run lost (queued, and nothing held it: its
    # message gone between the brain and its worker or agent) and sent it again as a new run,
    # in this attempt (brain.runtime.sweeps). ``attempt`` counts every run, retries and
    # take-backs too, so it could not be the bound: a task on its fourth retry would have
    # failed as lost too often at its first lost message. A failed attempt waiting to retry
    # starts it again at 0, as ``taken_back``.
    resent: int = 0
    # Failed attempts before the current one, oldest first (brain.core.retry); the current
    # attempt's own outcome is this record's.
    attempts: list[Attempt] = Field(default_factory=list)
    retry_at: float | None = None  # when ``retrying``: when the next attempt starts
    # A for_each task: how many items it fanned out over. One of its items (``<id>[i]``): the
    # task it was made from, and its own spec (the item put in its args).
    fan_out: int | None = None
    parent: str | None = None
    spec: TaskSpec | None = None
    queued_at: float | None = None  # this attempt's dispatch, or when it was parked
    first_queued_at: float | None = None  # when the task first left `pending` (max_total_s)
    started_at: float | None = None
    finished_at: float | None = None
    updated_at: float = 0.0


class TreeRecord(BaseModel):
    """The durable record of one submitted tree."""

    model_config = ConfigDict(extra="forbid")

    tree_id: str
    tree: TaskTree
    session: SessionKind = SessionKind.AUTONOMOUS
    client_id: str | None = None
    user: str | None = None
    status: TreeStatus = TreeStatus.RUNNING
    submitted_at: float
    finished_at: float | None = None
    # The `[[schedules]]` entry that started this run (None: submitted by hand).
    schedule: str | None = None
    # One gateway tools/call: an MCP client waits for its one task, so that task's MCP server
    # may ask it (sampling, elicitation: ToolCall.interactive). No other tree has anyone to ask.
    gateway_call: bool = False

    @classmethod
    def stored(cls, data: dict[str, Any]) -> TreeRecord:
        """The record as the store keeps it (``data``: its JSON, parsed), with a tree whose tasks
        are validated as they are asked for (``StoredTaskTree``): for the processes that advance
        it, which use a few tasks per result. Everything else is validated now."""
        tree = data.get("tree")
        raw_tasks = tree.get("tasks") if isinstance(tree, dict) else None
        if (
            not isinstance(raw_tasks, list)
            or not raw_tasks
            or not all(isinstance(t, dict) for t in raw_tasks)
        ):
            return cls.model_validate(data)  # not the shape a store writes: all of it, and its errors
        assert isinstance(tree, dict)
        # The header with one task (a tree has at least one), which validates it as a tree's.
        record = cls.model_validate({**data, "tree": {**tree, "tasks": raw_tasks[:1]}})
        return record.model_copy(update={"tree": StoredTaskTree.of(record.tree, raw_tasks)})


class Enrollment(BaseModel):
    """A client agent allowed to connect: the store's record (DESIGN decision 7). Clients cannot
    write it; Redis holds only what the brain derives from it (the client's ACL user)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    client_id: str
    user: str
    enrolled_at: float
    # SHA-256 (hex) of the client's broker secret: enough to (re)create its Redis ACL user
    # (ACL SETUSER ... #<hash>), never the secret itself. Empty: no credential issued.
    secret_sha256: str = ""


class SecretRecord(BaseModel):
    """One vault entry as the store keeps it: the name, and the value only as ciphertext
    (``brain.runtime.vault``: encrypted with the vault key and bound to the name)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    ciphertext: str = Field(repr=False)
    created_at: float
    updated_at: float


class GatewayToken(BaseModel):
    """A user's MCP gateway token as the store keeps it (issue 13): only its SHA-256, never the
    token. One per user: issuing a new one replaces (and so revokes) the old."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    user: str = Field(min_length=1, max_length=MAX_TOOL_ID_CHARS)
    token_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    created_at: float


class SubmitCredential(BaseModel):
    """The credential `vancetope submit-url --user U` issued (issue 20): the store keeps only its
    SHA-256; Redis mirrors it as ACL user ``vts-<user>``, restored by the brain after a restart.
    One per user: issuing a new one replaces (and so revokes) the old."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    user: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    secret_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    created_at: float
