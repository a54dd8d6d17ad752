"""The MongoDB store (layer: brain/store). One job: keep the record in MongoDB via pymongo.

The production store (DESIGN decision 2). Collections ``trees`` and ``tasks``, one
document per record; every compare-and-set is one ``find_one_and_update`` whose
filter carries the expected state and run id, so the server decides who wins.

Free-form payloads (a tree's definition, a task's ``result`` and ``error``) are kept
as JSON text: tool output and tool arguments may hold keys MongoDB refuses or
mangles (``$schema``, ``a.b``) and integers BSON cannot hold; the fields queries
need stay native.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Final

import pymongo
from pymongo import ASCENDING, DESCENDING, ReturnDocument
from pymongo.errors import BulkWriteError, DuplicateKeyError, PyMongoError

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
from brain.core.transitions import BEGINS_FROM, NOT_FINAL
from brain.errors import StoreError
from brain.store.base import (
    ANY,
    BACKFILLED,
    DEFAULT_MONGO_DATABASE,
    Ended,
    MaxTotals,
    _Any,
    check_final_status,
    check_new_tree,
    duplicate_tree_error,
    ends,
    state_values,
    task_changes,
)

_DUPLICATE_KEY = 11000  # MongoDB's error code for a unique index refusing a write

_TREE_OPAQUE: Final = frozenset({"tree"})
# Fields that hold anyone's keys (a result, an error's data, an item's arguments): kept as JSON
# text, since MongoDB refuses keys with "$" or ".".
_TASK_OPAQUE: Final = frozenset({"result", "error", "attempts", "spec"})
# Stripped on read: ``_id`` is Mongo's, ``ord`` keeps put_tree order (natural order is not promised).
# ``expires_at``: when an unfinished task passes its max_total_s (``tasks_expired``), kept
# beside the record, not in it: a TaskRecord forbids fields it does not know.
_HIDDEN: Final = {"_id": 0, "ord": 0, "expires_at": 0}


def _encode(doc: dict[str, Any], opaque: frozenset[str]) -> dict[str, Any]:
    return {k: json.dumps(v) if k in opaque else v for k, v in doc.items()}


def _decode(doc: dict[str, Any], opaque: frozenset[str]) -> dict[str, Any]:
    return {k: json.loads(v) if k in opaque else v for k, v in doc.items() if k not in _HIDDEN}


def _task(doc: dict[str, Any]) -> TaskRecord:
    return TaskRecord.model_validate(_decode(doc, _TASK_OPAQUE))


def _tree(doc: dict[str, Any]) -> TreeRecord:
    return TreeRecord.model_validate(_decode(doc, _TREE_OPAQUE))


class MongoStore:
    """``Store`` on MongoDB. Pass ``url`` (the store opens and owns a client) or ``client``
    (e.g. ``mongomock.MongoClient()``; the caller keeps ownership and closes it)."""

    def __init__(
        self,
        url: str | None = None,
        *,
        client: Any = None,
        database: str = DEFAULT_MONGO_DATABASE,
        read_only: bool = False,
    ) -> None:
        """``read_only``: creates no index (the MCP gateway's user has MongoDB's ``read`` role only,
        and a writer has made them already)."""
        if (url is None) == (client is None):
            raise StoreError("MongoStore needs exactly one of url (mongodb://...) or client")
        with self._errors("connect"):
            self._owns_client = client is None
            self._client = pymongo.MongoClient(url) if client is None else client
            self._db = self._client[database]
            self._trees = self._db["trees"]
            self._tasks = self._db["tasks"]
            self._enrollments = self._db["enrollments"]
            self._fires = self._db["schedule_fires"]
            self._summaries = self._db["summaries"]
            self._secrets = self._db["secrets"]
            self._gateway_tokens = self._db["gateway_tokens"]
            self._submitters = self._db["submitters"]
            self._meta = self._db["meta"]  # what was done once per store (backfill_deadlines)
            if not read_only:
                self._create_indexes()
        self.database = database

    def _create_indexes(self) -> None:
        # create_index is idempotent; the unique ones are what make duplicates impossible.
        self._trees.create_index([("tree_id", ASCENDING)], unique=True)
        self._trees.create_index([("submitted_at", DESCENDING)])
        self._trees.create_index(
            [("schedule", ASCENDING), ("status", ASCENDING), ("submitted_at", DESCENDING)]
        )
        self._tasks.create_index([("tree_id", ASCENDING), ("task_id", ASCENDING)], unique=True)
        self._tasks.create_index([("tree_id", ASCENDING), ("ord", ASCENDING)])
        self._tasks.create_index([("state", ASCENDING), ("updated_at", ASCENDING)])
        self._tasks.create_index([("tree_id", ASCENDING), ("state", ASCENDING)])
        self._tasks.create_index([("expires_at", ASCENDING)], sparse=True)
        self._enrollments.create_index([("client_id", ASCENDING)], unique=True)
        self._fires.create_index([("schedule", ASCENDING)], unique=True)
        self._summaries.create_index([("tree_id", ASCENDING), ("kind", ASCENDING)], unique=True)
        self._secrets.create_index([("name", ASCENDING)], unique=True)
        self._gateway_tokens.create_index([("user", ASCENDING)], unique=True)
        self._gateway_tokens.create_index([("token_sha256", ASCENDING)], unique=True)
        self._submitters.create_index([("user", ASCENDING)], unique=True)

    @contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        try:
            yield
        except PyMongoError as exc:
            raise StoreError(f"MongoDB store: {what} failed: {exc}") from exc

    def close(self) -> None:
        if self._owns_client:
            self._client.close()

    # --- trees ----------------------------------------------------------------------

    def put_tree(self, tree: TreeRecord, tasks: list[TaskRecord]) -> None:
        check_new_tree(tree, tasks)
        # Not one transaction (that needs a replica set): the tree goes first so its unique
        # index refuses a duplicate before any task is written under that id.
        with self._errors(f"put_tree({tree.tree_id!r})"):
            try:
                self._trees.insert_one(_encode(tree.model_dump(mode="json"), _TREE_OPAQUE))
            except DuplicateKeyError as exc:
                raise duplicate_tree_error(tree.tree_id) from exc
            if tasks:
                self._tasks.insert_many(
                    [
                        {**_encode(t.model_dump(mode="json"), _TASK_OPAQUE), "ord": i}
                        for i, t in enumerate(tasks)
                    ],
                    ordered=True,
                )

    def add_tasks(self, tree_id: str, tasks: list[TaskRecord]) -> None:
        if not tasks:
            return
        with self._errors(f"add_tasks({tree_id!r})"):
            last = self._tasks.find_one({"tree_id": tree_id}, {"ord": 1}, sort=[("ord", DESCENDING)])
            start = (last or {}).get("ord", -1) + 1
            docs = [
                {**_encode(t.model_dump(mode="json"), _TASK_OPAQUE), "ord": start + i}
                for i, t in enumerate(tasks)
            ]
            try:
                self._tasks.insert_many(docs, ordered=False)
            except BulkWriteError as exc:
                # Items added before (by another brain, or before a crash): kept as they are.
                if any(e.get("code") != _DUPLICATE_KEY for e in exc.details.get("writeErrors", [])):
                    raise

    def get_tree(self, tree_id: str, *, lazy: bool = False) -> TreeRecord | None:
        with self._errors(f"get_tree({tree_id!r})"):
            doc = self._trees.find_one({"tree_id": tree_id}, _HIDDEN)
        if doc is None:
            return None
        return TreeRecord.stored(_decode(doc, _TREE_OPAQUE)) if lazy else _tree(doc)

    def list_trees(
        self, limit: int = 50, *, since: float | None = None, until: float | None = None
    ) -> list[TreeRecord]:
        if limit <= 0:
            return []
        with self._errors("list_trees"):
            docs = list(
                self._trees.find(_submitted_between(since, until), _HIDDEN)
                .sort([("submitted_at", DESCENDING), ("_id", DESCENDING)])
                .limit(limit)
            )
        return [_tree(d) for d in docs]

    def finish_tree(self, tree_id: str, status: TreeStatus, finished_at: float) -> bool:
        status = check_final_status(tree_id, status)
        with self._errors(f"finish_tree({tree_id!r})"):
            res = self._trees.update_one(
                {"tree_id": tree_id, "status": TreeStatus.RUNNING.value},
                {"$set": {"status": status.value, "finished_at": finished_at}},
            )
        return res.modified_count == 1

    # --- tasks ----------------------------------------------------------------------

    def get_task(self, tree_id: str, task_id: str) -> TaskRecord | None:
        with self._errors(f"get_task({tree_id!r}, {task_id!r})"):
            doc = self._tasks.find_one({"tree_id": tree_id, "task_id": task_id}, _HIDDEN)
        return None if doc is None else _task(doc)

    def get_tasks(self, tree_id: str, task_ids: Collection[str] | None = None) -> list[TaskRecord]:
        query: dict[str, Any] = {"tree_id": tree_id}
        if task_ids is not None:
            query["task_id"] = {"$in": list(task_ids)}
        with self._errors(f"get_tasks({tree_id!r})"):
            docs = list(self._tasks.find(query, _HIDDEN).sort("ord", ASCENDING))
        return [_task(d) for d in docs]

    def first_task_in(
        self, tree_id: str, states: Collection[TaskState], among: Collection[str] | None = None
    ) -> tuple[str, TaskState] | None:
        values = state_values(states)
        if not values:
            return None
        query: dict[str, Any] = {"tree_id": tree_id, "state": {"$in": values}}
        if among is not None:
            query["task_id"] = {"$in": list(among)}
        with self._errors(f"first_task_in({tree_id!r})"):
            doc = self._tasks.find_one(query, {"_id": 0, "task_id": 1, "state": 1})
        return None if doc is None else (doc["task_id"], TaskState(doc["state"]))

    @contextmanager
    def batch(self) -> Iterator[None]:
        # Each compare-and-set must answer before the next is decided, so there is nothing
        # to group here; the writes are single-document and atomic on their own.
        yield

    def task_states(self, tree_id: str) -> dict[str, TaskState]:
        with self._errors(f"task_states({tree_id!r})"):
            docs = self._tasks.find({"tree_id": tree_id}, {"_id": 0, "task_id": 1, "state": 1})
            return {d["task_id"]: TaskState(d["state"]) for d in docs}

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
        values = task_changes(tree_id, task_id, changes)
        states = state_values(from_states)
        if not states:
            return None
        update: dict[str, Any] = {"$set": _encode(values, _TASK_OPAQUE)}
        if ends(changes) or expires_at is None:
            # Out of the sparse expiry index, which holds unfinished tasks with a deadline (it
            # would keep a field set to null).
            update["$unset"] = {"expires_at": ""}
        elif expires_at is not ANY:
            update["$set"]["expires_at"] = expires_at
        query: dict[str, Any] = {"tree_id": tree_id, "task_id": task_id, "state": {"$in": states}}
        if expect_run_id is not ANY:
            # run_id is always written (null included), so {"run_id": None} means "is null" here.
            query["run_id"] = expect_run_id
        if expect_client_id is not ANY:
            query["client_id"] = expect_client_id
        with self._errors(f"transition of task {task_id!r} in tree {tree_id!r}"):
            if not values:  # MongoDB refuses an empty $set; with nothing to change it is a read
                doc = self._tasks.find_one(query, _HIDDEN)
            else:
                doc = self._tasks.find_one_and_update(
                    query,
                    update,
                    # No projection: mongomock then re-reads with the (now stale) filter and
                    # returns None; _decode drops the hidden fields instead.
                    return_document=ReturnDocument.AFTER,
                )
        return None if doc is None else _task(doc)

    def begin_run(
        self, tree_id: str, task_id: str, run_id: str, worker: str, started_at: float
    ) -> int | None:
        query = {
            "tree_id": tree_id,
            "task_id": task_id,
            "run_id": run_id,
            # a redelivery of the same run (its worker died) finds it running and begins it again
            "state": {"$in": state_values(BEGINS_FROM)},
        }
        changes = {
            "state": TaskState.RUNNING.value, "worker": worker, "started_at": started_at,
            "updated_at": started_at,
        }  # fmt: skip
        with self._errors(f"begin_run of task {task_id!r} in tree {tree_id!r}"):
            doc = self._tasks.find_one_and_update(
                query,
                {"$inc": {"deliveries": 1}, "$set": changes},
                return_document=ReturnDocument.AFTER,
            )
        return None if doc is None else int(doc["deliveries"])

    def tasks_in_states(
        self,
        states: Collection[TaskState],
        *,
        updated_before: float | None = None,
        client_id: str | None = None,
        limit: int = 1000,
    ) -> list[TaskRecord]:
        values = state_values(states)
        if not values or limit <= 0:  # MongoDB reads limit 0 as "no limit"
            return []
        query: dict[str, Any] = {"state": {"$in": values}}
        if updated_before is not None:
            query["updated_at"] = {"$lt": updated_before}
        if client_id is not None:
            query["client_id"] = client_id
        with self._errors("tasks_in_states"):
            cursor = self._tasks.find(query, _HIDDEN).sort(
                [("updated_at", ASCENDING), ("tree_id", ASCENDING), ("ord", ASCENDING)]
            )
            docs = list(cursor.limit(limit))
        return [_task(d) for d in docs]

    def backfill_deadlines(self) -> int:
        if self._meta.find_one({"_id": BACKFILLED}) is not None:
            return 0  # done once for this store: every dispatch since writes its deadline
        # Queued by an older version: left pending once, yet no deadline.
        missing = {
            "state": {"$in": state_values(NOT_FINAL)},
            "first_queued_at": {"$ne": None},
            "expires_at": {"$exists": False},
        }
        fields = {"_id": 1, "tree_id": 1, "task_id": 1, "first_queued_at": 1, "spec": 1}
        limits = MaxTotals(self._tree_spec)
        done = 0
        with self._errors("backfill_deadlines"):
            for doc in self._tasks.find(missing, fields):  # a cursor: not every spec at once
                # An item of a for_each task carries its own spec (JSON text, _TASK_OPAQUE).
                own = json.loads(doc["spec"]) if isinstance(doc.get("spec"), str) else None
                limit = limits.of(doc["tree_id"], doc["task_id"], own)
                if limit is not None:  # once per store: a write per task is no burden
                    deadline = {"$set": {"expires_at": doc["first_queued_at"] + limit}}
                    done += self._tasks.update_one({"_id": doc["_id"], **missing}, deadline).modified_count
            self._meta.replace_one({"_id": BACKFILLED}, {"_id": BACKFILLED, "done": True}, upsert=True)
        return done

    def _tree_spec(self, tree_id: str) -> Any:
        tree = self._trees.find_one({"tree_id": tree_id}, {"_id": 0, "tree": 1})
        return json.loads(tree["tree"]) if tree else None

    def tasks_expired(self, now: float, *, limit: int = 1000) -> list[TaskRecord]:
        if limit <= 0:  # MongoDB reads limit 0 as "no limit"
            return []
        # The sparse index on expires_at holds only the tasks with a deadline; the state is
        # checked for tasks an older version ended without dropping theirs.
        query = {"expires_at": {"$lte": now}, "state": {"$in": state_values(NOT_FINAL)}}
        with self._errors("tasks_expired"):
            docs = list(self._tasks.find(query, _HIDDEN).sort("expires_at", ASCENDING).limit(limit))
        return [_task(d) for d in docs]

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
        states = state_values(from_states)
        if not states or (among is not None and not among):
            return []
        query: dict[str, Any] = {"tree_id": tree_id, "state": {"$in": states}}
        if task_id is not None:
            query["task_id"] = task_id
        if among is not None:  # and task_id, if given, as SQLite's AND reads it
            named = [t for t in among if task_id is None or t == task_id]
            if not named:
                return []
            query["task_id"] = {"$in": named}
        changes = {
            "state": TaskState(state).value, "reason": reason, "error": json.dumps(None),
            "finished_at": finished_at, "updated_at": finished_at,
        }  # fmt: skip
        # One find and one update_many (no multi-document transaction without a replica set): a
        # task re-sent between the two is ended too, and the run it got meanwhile is refused
        # anyway, since its record is final (begin_run, result acceptance).
        with self._errors(f"end_tasks({tree_id!r})"):
            found = list(
                self._tasks.find(query, {"_id": 0, "task_id": 1, "run_id": 1, "client_id": 1}).sort(
                    "ord", ASCENDING
                )
            )
            if not found:
                return []
            query["task_id"] = {"$in": [d["task_id"] for d in found]}
            self._tasks.update_many(query, {"$set": changes, "$unset": {"expires_at": ""}})
        return [Ended(d["task_id"], d.get("run_id"), d.get("client_id")) for d in found]

    def count_unfinished(self, user: str | None, states: Collection[TaskState]) -> int:
        values = state_values(states)
        if not values:
            return 0
        with self._errors("count_unfinished"):
            trees = [
                d["tree_id"]
                for d in self._trees.find(
                    {"status": TreeStatus.RUNNING.value, "user": user}, {"_id": 0, "tree_id": 1}
                )
            ]
            if not trees:
                return 0
            return int(self._tasks.count_documents({"tree_id": {"$in": trees}, "state": {"$in": values}}))

    # --- enrollments ------------------------------------------------------------------

    def put_enrollment(self, enrollment: Enrollment) -> None:
        with self._errors(f"put_enrollment({enrollment.client_id!r})"):
            self._enrollments.replace_one(
                {"client_id": enrollment.client_id}, enrollment.model_dump(mode="json"), upsert=True
            )

    def get_enrollment(self, client_id: str) -> Enrollment | None:
        with self._errors(f"get_enrollment({client_id!r})"):
            doc = self._enrollments.find_one({"client_id": client_id}, _HIDDEN)
        return None if doc is None else Enrollment.model_validate(doc)

    def list_enrollments(self) -> list[Enrollment]:
        with self._errors("list_enrollments"):
            docs = list(self._enrollments.find({}, _HIDDEN).sort([("client_id", ASCENDING)]))
        return [Enrollment.model_validate(d) for d in docs]

    def delete_enrollment(self, client_id: str) -> bool:
        with self._errors(f"delete_enrollment({client_id!r})"):
            return self._enrollments.delete_one({"client_id": client_id}).deleted_count == 1

    # --- schedules and summaries ----------------------------------------------------------

    def schedule_runs(
        self,
        schedule: str,
        *,
        running_only: bool = False,
        limit: int = 20,
        since: float | None = None,
        until: float | None = None,
    ) -> list[TreeRecord]:
        if limit <= 0:
            return []
        query: dict[str, Any] = {"schedule": schedule, **_submitted_between(since, until)}
        if running_only:
            query["status"] = TreeStatus.RUNNING.value
        with self._errors(f"schedule_runs({schedule!r})"):
            docs = list(
                self._trees.find(query, _HIDDEN)
                .sort([("submitted_at", DESCENDING), ("_id", DESCENDING)])
                .limit(limit)
            )
        return [_tree(d) for d in docs]

    def record_fire(self, schedule: str, fired_at: float) -> None:
        with self._errors(f"record_fire({schedule!r})"):
            self._fires.replace_one(
                {"schedule": schedule}, {"schedule": schedule, "fired_at": fired_at}, upsert=True
            )

    def last_fires(self) -> dict[str, float]:
        with self._errors("last_fires"):
            return {d["schedule"]: d["fired_at"] for d in self._fires.find({}, {"_id": 0})}

    def put_summary(self, summary: RunSummary) -> bool:
        # The unique (tree_id, kind) index decides who stored it first.
        doc = {"tree_id": summary.tree_id, "kind": summary.kind.value, "doc": summary.model_dump_json()}
        with self._errors(f"put_summary({summary.tree_id!r})"):
            try:
                self._summaries.insert_one(doc)
            except DuplicateKeyError:
                return False
        return True

    def get_summaries(self, tree_id: str) -> list[RunSummary]:
        with self._errors(f"get_summaries({tree_id!r})"):
            docs = list(self._summaries.find({"tree_id": tree_id}).sort("_id", ASCENDING))
        return [RunSummary.model_validate_json(d["doc"]) for d in docs]

    # --- secrets --------------------------------------------------------------------

    def put_secret(self, secret: SecretRecord) -> None:
        with self._errors(f"put_secret({secret.name!r})"):
            self._secrets.replace_one({"name": secret.name}, secret.model_dump(mode="json"), upsert=True)

    def get_secret(self, name: str) -> SecretRecord | None:
        with self._errors(f"get_secret({name!r})"):
            doc = self._secrets.find_one({"name": name}, _HIDDEN)
        return None if doc is None else SecretRecord.model_validate(doc)

    def list_secrets(self) -> list[SecretRecord]:
        with self._errors("list_secrets"):
            docs = list(self._secrets.find({}, _HIDDEN).sort([("name", ASCENDING)]))
        return [SecretRecord.model_validate(d) for d in docs]

    def delete_secret(self, name: str) -> bool:
        with self._errors(f"delete_secret({name!r})"):
            return self._secrets.delete_one({"name": name}).deleted_count == 1

    # --- gateway tokens -------------------------------------------------------------

    def put_gateway_token(self, token: GatewayToken) -> None:
        with self._errors(f"put_gateway_token({token.user!r})"):
            self._gateway_tokens.replace_one({"user": token.user}, token.model_dump(mode="json"), upsert=True)

    def find_gateway_token(self, token_sha256: str) -> GatewayToken | None:
        with self._errors("find_gateway_token"):
            doc = self._gateway_tokens.find_one({"token_sha256": token_sha256}, _HIDDEN)
        return None if doc is None else GatewayToken.model_validate(doc)

    def delete_gateway_token(self, user: str) -> bool:
        with self._errors(f"delete_gateway_token({user!r})"):
            return self._gateway_tokens.delete_one({"user": user}).deleted_count == 1

    # --- submit credentials -------------------------------------------------------------

    def put_submitter(self, credential: SubmitCredential) -> None:
        with self._errors(f"put_submitter({credential.user!r})"):
            self._submitters.replace_one(
                {"user": credential.user}, credential.model_dump(mode="json"), upsert=True
            )

    def list_submitters(self) -> list[SubmitCredential]:
        with self._errors("list_submitters"):
            docs = list(self._submitters.find({}, {"_id": 0}).sort("user", ASCENDING))
        return [SubmitCredential.model_validate(d) for d in docs]

    def delete_submitter(self, user: str) -> bool:
        with self._errors(f"delete_submitter({user!r})"):
            return self._submitters.delete_one({"user": user}).deleted_count == 1

    def __repr__(self) -> str:
        return f"MongoStore(database={self.database!r})"


def _submitted_between(since: float | None, until: float | None) -> dict[str, Any]:
    """The query of a ``since <= submitted_at < until`` window (empty: every tree)."""
    window = {op: at for op, at in (("$gte", since), ("$lt", until)) if at is not None}
    return {"submitted_at": window} if window else {}
