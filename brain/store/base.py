"""The store contract (layer: brain/store). One job: say what the durable record offers.

DESIGN decisions 2 and 6: the store is the record of every tree and task, and every
state change goes through a compare-and-set (``transition``) so a redelivered job
never completes a task twice. Two backends implement this protocol: a SQLite file
(the embedded default) and MongoDB (production). ``open_store`` picks one by URL.

Times are float unix seconds passed in by the caller; no backend reads the clock.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractContextManager
from typing import Any, Final, NamedTuple, Protocol, runtime_checkable

from pydantic import TypeAdapter, ValidationError

from brain.core.models import (
    Enrollment,
    GatewayToken,
    SecretRecord,
    SubmitCredential,
    TaskRecord,
    TaskState,
    TreeRecord,
    TreeStatus,
)
from brain.core.summary import RunSummary
from brain.errors import StoreError

DEFAULT_MONGO_DATABASE: Final = "vancetope"


# A task's key; transition() takes these as its own arguments, so they are never changes.
_IDENTITY_FIELDS: Final = frozenset({"tree_id", "task_id"})
# What ``transition`` may change, each field with its TaskRecord type.
_CHANGEABLE: Final = {
    name: TypeAdapter(field.annotation or Any)
    for name, field in TaskRecord.model_fields.items()
    if name not in _IDENTITY_FIELDS
}


class _Any(enum.Enum):
    """Type of ``ANY``; an enum member so type checkers can tell it from ``str | None``."""

    ANY = "ANY"

    def __repr__(self) -> str:
        return "ANY"


ANY: Final = _Any.ANY
"""``transition(expect_run_id=ANY)``: do not compare the run id (``None`` means "is null")."""


class Ended(NamedTuple):
    """A task ``end_tasks`` gave a final state: what its run was (to cancel it in Redis)."""

    task_id: str
    run_id: str | None
    client_id: str | None


@runtime_checkable
class Store(Protocol):
    """The narrow contract every backend keeps; the contract tests are its specification."""

    def put_tree(self, tree: TreeRecord, tasks: list[TaskRecord]) -> None:
        """Record a new tree and its tasks (kept in this order); a known tree id is a StoreError."""
        ...

    def get_tree(self, tree_id: str, *, lazy: bool = False) -> TreeRecord | None:
        """``lazy``: its tree's tasks validated as they are asked for (``TreeRecord.stored``), for
        a process that advances the tree and uses a few of its tasks per result."""
        ...

    def add_tasks(self, tree_id: str, tasks: list[TaskRecord]) -> None:
        """Add tasks to a recorded tree, after the ones it has (a for_each task's items). A
        task id it already has is left as it is: adding the same items twice adds them once."""
        ...

    def list_trees(
        self, limit: int = 50, *, since: float | None = None, until: float | None = None
    ) -> list[TreeRecord]:
        """Newest ``submitted_at`` first; with ``since``/``until``, only trees submitted at or
        after ``since`` and before ``until`` (an index range, not a scan: the web view's filter)."""
        ...

    def finish_tree(self, tree_id: str, status: TreeStatus, finished_at: float) -> bool:
        """Set a final status if the tree is still running; True only for the call that did."""
        ...

    def get_task(self, tree_id: str, task_id: str) -> TaskRecord | None: ...

    def get_tasks(self, tree_id: str, task_ids: Collection[str] | None = None) -> list[TaskRecord]:
        """The tree's tasks in ``put_tree`` order; with ``task_ids``, only those (unknown ids
        are left out): resolving a task's arguments reads just its dependencies."""
        ...

    def first_task_in(
        self, tree_id: str, states: Collection[TaskState], among: Collection[str] | None = None
    ) -> tuple[str, TaskState] | None:
        """One task of the tree (of ``among``, when given) whose state is in ``states``, or None.

        An index lookup, so advancing after each result costs O(its dependents), not O(tree):
        "is anything unfinished?" and "is a dependency not done yet?" are both this question.
        """
        ...

    def batch(self) -> AbstractContextManager[None]:
        """Group the writes made inside into as few round trips as the backend allows (SQLite:
        one transaction). A compare-and-set inside still answers at once; what the caller
        publishes about those writes must wait until the block has exited."""
        ...

    def task_states(self, tree_id: str) -> dict[str, TaskState]:
        """Task id -> state for the whole tree, without reading whole records: advancing a tree
        after each result needs only these, and a big tree's records cost O(N) to parse."""
        ...

    def transition(
        self,
        tree_id: str,
        task_id: str,
        *,
        from_states: Collection[TaskState],
        expect_run_id: str | None | _Any = ANY,
        expect_client_id: str | None | _Any = ANY,
        expires_at: float | None | _Any = ANY,
        **changes: Any,
    ) -> TaskRecord | None:
        """Compare-and-set: apply ``changes`` only if the state is in ``from_states`` and
        (unless ANY) the run id and the client id equal the expected ones. The updated
        record, or None. ``expires_at`` (unless ANY) sets when the task passes its
        ``max_total_s`` (``tasks_expired``); kept beside the record, not in it, and dropped
        when a change gives the task a final state."""
        ...

    def tasks_expired(self, now: float, *, limit: int = 1000) -> list[TaskRecord]:
        """Unfinished tasks whose ``expires_at`` is at or before ``now``, soonest first: read
        through an index of the tasks that have one, however many other tasks are unfinished."""
        ...

    def backfill_deadlines(self) -> int:
        """Give each unfinished task a version before the deadline index queued (a
        ``first_queued_at`` and a ``max_total_s`` in its spec, but no ``expires_at``) the deadline
        ``tasks_expired`` reads, as a dispatch writes it now; an older version's task is
        otherwise never expired until its next send. Once per store (remembered in the store;
        later calls return 0 at once): it reads the unfinished tasks and the specs of their
        trees outside any write lock and writes only what is missing, a few hundred at a time.
        The first sweep of each brain calls it. Returns how many tasks got one."""
        ...

    def begin_run(
        self, tree_id: str, task_id: str, run_id: str, worker: str, started_at: float
    ) -> int | None:
        """A server worker starts ``run_id``: if it is still the task's run and queued for the
        server, or running already (the same run delivered again after its worker died), move
        it to ``running`` (``updated_at`` = ``started_at``), count this delivery and note the
        worker and start, in one compare-and-set; return the delivery's number. None when the
        run is not the one to start (cancelled, expired, taken back, already recorded,
        superseded): the worker must not run it."""
        ...

    def tasks_in_states(
        self,
        states: Collection[TaskState],
        *,
        updated_before: float | None = None,
        client_id: str | None = None,
        limit: int = 1000,
    ) -> list[TaskRecord]:
        """Tasks of every tree in ``states`` (optionally ``updated_at < updated_before``, and only
        those sent to ``client_id``), stalest first. The client is matched in the store: a client
        going offline looks at its own calls without every other client's being parsed."""
        ...

    def end_tasks(
        self,
        tree_id: str,
        *,
        from_states: Collection[TaskState],
        state: TaskState,
        reason: str,
        finished_at: float,
        task_id: str | None = None,
        among: Sequence[str] | None = None,
    ) -> list[Ended]:
        """Give every task of the tree (or only ``task_id``, or only those of ``among``) whose
        state is in ``from_states`` the final ``state`` with ``reason`` (error cleared), in one
        statement (SQLite; one per ``among`` chunk) or one find and one update (MongoDB),
        whatever the tree's size: cancelling a 100,000-task tree, or a for_each task's 10,000
        items, must not be that many round trips. The tasks it ended, with their run and client."""
        ...

    def count_unfinished(self, user: str | None, states: Collection[TaskState]) -> int:
        """How many tasks in ``states`` the running trees of ``user`` hold (the per-user quota)."""
        ...

    # --- enrollments (the record of which client agents may connect, and as whom) ---

    def put_enrollment(self, enrollment: Enrollment) -> None:
        """Insert or replace the enrollment of ``enrollment.client_id``."""
        ...

    def get_enrollment(self, client_id: str) -> Enrollment | None: ...

    def list_enrollments(self) -> list[Enrollment]:
        """Every enrollment, by client id."""
        ...

    def delete_enrollment(self, client_id: str) -> bool:
        """Forget an enrollment; True if there was one."""
        ...

    # --- schedules (brain.runtime.schedule_runs, brain.beat) ---

    def schedule_runs(
        self,
        schedule: str,
        *,
        running_only: bool = False,
        limit: int = 20,
        since: float | None = None,
        until: float | None = None,
    ) -> list[TreeRecord]:
        """Runs started by ``schedule`` (``TreeRecord.schedule``), newest ``submitted_at`` first;
        with ``running_only``, only unfinished ones; ``since``/``until`` as for ``list_trees``."""
        ...

    def record_fire(self, schedule: str, fired_at: float) -> None:
        """Remember when beat last fired ``schedule`` (what catch_up measures downtime from)."""
        ...

    def last_fires(self) -> dict[str, float]:
        """Schedule name -> when beat last fired it."""
        ...

    # --- run summaries (brain.core.summary) ---

    def put_summary(self, summary: RunSummary) -> bool:
        """Keep a run's summary of its kind; True only for the call that stored it (a second
        summary of the same tree and kind is refused, so only one process sends it on)."""
        ...

    def get_summaries(self, tree_id: str) -> list[RunSummary]:
        """The tree's summaries, oldest first."""
        ...

    # --- secrets (the vault's ciphertexts; brain.runtime.vault encrypts and decrypts) ---

    def put_secret(self, secret: SecretRecord) -> None:
        """Insert or replace the secret ``secret.name``."""
        ...

    def get_secret(self, name: str) -> SecretRecord | None: ...

    def list_secrets(self) -> list[SecretRecord]:
        """Every secret, by name."""
        ...

    def delete_secret(self, name: str) -> bool:
        """Forget a secret; True if there was one."""
        ...

    # --- gateway tokens (brain.gateway: who an MCP client is; only their SHA-256) ---

    def put_gateway_token(self, token: GatewayToken) -> None:
        """Insert or replace the token of ``token.user`` (the old one stops counting)."""
        ...

    def find_gateway_token(self, token_sha256: str) -> GatewayToken | None:
        """The token whose SHA-256 is ``token_sha256``, if any."""
        ...

    def delete_gateway_token(self, user: str) -> bool:
        """Revoke ``user``'s token; True if there was one."""
        ...

    # --- submit credentials (`vancetope submit-url --user U`; only their SHA-256) ---

    def put_submitter(self, credential: SubmitCredential) -> None:
        """Insert or replace the submit credential of ``credential.user``."""
        ...

    def list_submitters(self) -> list[SubmitCredential]:
        """Every submit credential, by user."""
        ...

    def delete_submitter(self, user: str) -> bool:
        """Revoke ``user``'s submit credential; True if there was one."""
        ...

    def close(self) -> None: ...


# --- helpers shared by the backends ------------------------------------------------


def duplicate_tree_error(tree_id: str) -> StoreError:
    return StoreError(f"tree {tree_id!r} already exists in the store; give the run a new id")


def check_new_tree(tree: TreeRecord, tasks: list[TaskRecord]) -> None:
    """Refuse a tree whose tasks are not its own, before anything is written.

    MongoDB writes the tree and its tasks as separate documents, so a bad task
    found half-way would leave a partial tree behind; checking first keeps both
    backends all-or-nothing for every mistake a caller can make.
    """
    seen: set[str] = set()
    for task in tasks:
        if task.tree_id != tree.tree_id:
            raise StoreError(
                f"task {task.task_id!r} has tree_id {task.tree_id!r} but is stored with tree "
                f"{tree.tree_id!r}; build task records from the tree being stored"
            )
        if task.task_id in seen:
            raise StoreError(f"tree {tree.tree_id!r} lists task {task.task_id!r} twice")
        seen.add(task.task_id)


def check_final_status(tree_id: str, status: TreeStatus) -> TreeStatus:
    status = TreeStatus(status)
    if status is TreeStatus.RUNNING:
        raise StoreError(f"finish_tree({tree_id!r}) needs a final status (done or failed), not running")
    return status


# What ``backfill_deadlines`` writes once it has run for a store (SQLite: a ``meta`` row, MongoDB:
# a ``meta`` document), and how many tasks it writes at a time.
BACKFILLED: Final = "deadlines_backfilled"
BACKFILL_CHUNK: Final = 500


def max_total(spec: Any) -> float | None:
    """A stored task spec's ``max_total_s`` (JSON as it is: ``backfill_deadlines`` validates no
    spec), None when it has none."""
    limit = spec.get("max_total_s") if isinstance(spec, dict) else None
    if isinstance(limit, int | float) and not isinstance(limit, bool) and limit > 0:
        return float(limit)
    return None


class MaxTotals:
    """``max_total_s`` of a stored task for ``backfill_deadlines``: its own spec's (an item of a
    for_each task carries one), else its tree's task's; ``tree_spec(tree_id)`` reads a tree's
    ``TaskTree`` as JSON (None: no such tree), once per tree."""

    def __init__(self, tree_spec: Callable[[str], Any]) -> None:
        self.tree_spec = tree_spec
        self._of_tree: dict[str, dict[str, float]] = {}

    def of(self, tree_id: str, task_id: str, own_spec: Any) -> float | None:
        limit = max_total(own_spec)
        if limit is not None:
            return limit
        if tree_id not in self._of_tree:
            self._of_tree[tree_id] = _tree_max_totals(self.tree_spec(tree_id))
        return self._of_tree[tree_id].get(task_id)


def _tree_max_totals(tree: Any) -> dict[str, float]:
    """Task id -> ``max_total_s`` of a stored tree's tasks that have one."""
    tasks = tree.get("tasks") if isinstance(tree, dict) else None
    found: dict[str, float] = {}
    for spec in tasks if isinstance(tasks, list) else []:
        limit = max_total(spec)
        if limit is not None and isinstance(spec.get("id"), str):
            found[spec["id"]] = limit
    return found


def state_values(states: Collection[TaskState]) -> list[str]:
    # A member as it is (most callers pass members); anything else checked by TaskState().
    return [s.value if type(s) is TaskState else TaskState(s).value for s in states]


def ends(changes: dict[str, Any]) -> bool:
    """Whether ``transition`` changes give the task a final state (its ``expires_at`` goes)."""
    state = changes.get("state")
    return state is not None and TaskState(state).is_final


def task_changes(tree_id: str, task_id: str, changes: dict[str, Any]) -> dict[str, Any]:
    """Validate ``transition`` changes against TaskRecord; return them as JSON-compatible values.

    Validation runs before the write so a bad value (``state="done!"``) is refused
    instead of being stored and breaking every later read of the record.
    """
    return {
        name: _CHANGEABLE[name].dump_python(value, mode="json")
        for name, value in _validated(tree_id, task_id, changes).items()
    }


def task_changes_json(tree_id: str, task_id: str, changes: dict[str, Any]) -> dict[str, str]:
    """``task_changes``, each value as its JSON text: one step in pydantic's serializer instead
    of a JSON-compatible copy and then ``json.dumps`` of it (a store that writes JSON text)."""
    return {
        name: _CHANGEABLE[name].dump_json(value).decode()
        for name, value in _validated(tree_id, task_id, changes).items()
    }


def _validated(tree_id: str, task_id: str, changes: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(changes) - _CHANGEABLE.keys())
    if unknown:
        known = ", ".join(sorted(_CHANGEABLE))
        raise StoreError(
            f"transition of task {task_id!r} in tree {tree_id!r}: unknown TaskRecord field(s) {unknown}; "
            f"known fields: {known}"
        )
    values: dict[str, Any] = {}
    problems: list[str] = []
    for name, value in changes.items():
        # Each field on its own, as TaskRecord would validate it (it has no model-wide
        # validators): validating a whole probe record per write was a tenth of a result's cost.
        try:
            values[name] = _CHANGEABLE[name].validate_python(value)
        except ValidationError as exc:
            problems += [f"{'.'.join(map(str, (name, *e['loc'])))}: {e['msg']}" for e in exc.errors()]
    if problems:
        raise StoreError(
            f"transition of task {task_id!r} in tree {tree_id!r}: invalid value(s): {'; '.join(problems)}"
        )
    return values


# --- opening a store by URL ----------------------------------------------------------
