"""The SQLite store (layer: brain/store). One job: keep the record in one file, safely shared.

The embedded default (DESIGN decision 2). The CLI and the brain worker open the same
file from different processes, so: WAL (readers never block the writer), a busy
timeout (writers queue instead of failing), one connection per thread, and every
compare-and-set is a single ``UPDATE ... WHERE`` whose row count says who won.

Each row holds the whole record as JSON (``doc``) plus the columns queries need.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from os import PathLike
from pathlib import Path
from typing import Any, Final

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
    BACKFILL_CHUNK,
    BACKFILLED,
    Ended,
    MaxTotals,
    _Any,
    check_final_status,
    check_new_tree,
    duplicate_tree_error,
    ends,
    state_values,
    task_changes_json,
)

BUSY_TIMEOUT_S: Final = 10.0
SCHEMA_VERSION: Final = 1
# How a writer waits for the write lock: first pause, and the longest. SQLite's own busy
# handler sleeps 1, 2, 5, 10, 15, 20, 25 ... ms between tries, while a write here holds the lock
# for a tenth of a millisecond: with two pool processes, the brain and a submitter writing,
# waits of 10-25 ms were common (seen with strace: 3,000 tasks, ~500 sleeps, 1.6 s in all).
FIRST_PAUSE_S: Final = 0.00005
LONGEST_PAUSE_S: Final = 0.002
# The lock is busy: try again. Not SQLITE_BUSY_SNAPSHOT (a deferred transaction whose snapshot
# is stale can never write; SQLite's own handler is not called for it either).
_BUSY: Final = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_BUSY_RECOVERY, sqlite3.SQLITE_BUSY_TIMEOUT})


class PatientConnection(sqlite3.Connection):
    """A connection that waits for a busy database in short steps (``FIRST_PAUSE_S``, doubling
    up to ``LONGEST_PAUSE_S``) for up to ``BUSY_TIMEOUT_S``, instead of SQLite's millisecond
    sleeps. A statement that found the database busy did nothing, so trying it again is what
    SQLite's busy handler does too; only the pauses differ."""

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        return self._patiently(lambda: super(PatientConnection, self).execute(sql, parameters))

    def executemany(self, sql: str, parameters: Any, /) -> sqlite3.Cursor:
        rows = list(parameters)  # an iterator would be spent by the first try
        return self._patiently(lambda: super(PatientConnection, self).executemany(sql, rows))

    @staticmethod
    def _patiently(attempt: Callable[[], sqlite3.Cursor]) -> sqlite3.Cursor:
        """``attempt()`` now, then again after each pause while the database is busy."""
        deadline: float | None = None
        pause = FIRST_PAUSE_S
        while True:
            try:
                return attempt()
            except sqlite3.OperationalError as exc:
                if exc.sqlite_errorcode not in _BUSY:
                    raise
                if deadline is None:
                    deadline = time.monotonic() + BUSY_TIMEOUT_S
                elif time.monotonic() > deadline:
                    raise
            time.sleep(pause)
            pause = min(pause * 2, LONGEST_PAUSE_S)


_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS trees (
    seq          INTEGER PRIMARY KEY,
    tree_id      TEXT NOT NULL UNIQUE,
    status       TEXT NOT NULL,
    submitted_at REAL NOT NULL,
    doc          TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS trees_by_submitted ON trees (submitted_at, seq);
CREATE TABLE IF NOT EXISTS tasks (
    seq        INTEGER PRIMARY KEY,
    tree_id    TEXT NOT NULL,
    task_id    TEXT NOT NULL,
    state      TEXT NOT NULL,
    run_id     TEXT,
    updated_at REAL NOT NULL,
    doc        TEXT NOT NULL,
    expires_at REAL,
    UNIQUE (tree_id, task_id)
);
CREATE INDEX IF NOT EXISTS tasks_by_state ON tasks (state, updated_at);
CREATE INDEX IF NOT EXISTS tasks_by_expiry ON tasks (expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS tasks_by_tree_state ON tasks (tree_id, state);
CREATE TABLE IF NOT EXISTS enrollments (
    client_id TEXT PRIMARY KEY,
    doc       TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS trees_by_schedule
    ON trees (json_extract(doc, '$.schedule'), status, submitted_at);
CREATE INDEX IF NOT EXISTS trees_by_user
    ON trees (json_extract(doc, '$.user'), status);
CREATE TABLE IF NOT EXISTS schedule_fires (
    schedule TEXT PRIMARY KEY,
    fired_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS summaries (
    seq     INTEGER PRIMARY KEY,
    tree_id TEXT NOT NULL,
    kind    TEXT NOT NULL,
    doc     TEXT NOT NULL,
    UNIQUE (tree_id, kind)
);
-- What was done once for this store (key -> 'done'): a version before it ignores the table.
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS secrets (
    name TEXT PRIMARY KEY,
    doc  TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS gateway_tokens (
    user         TEXT PRIMARY KEY,
    token_sha256 TEXT NOT NULL UNIQUE,
    doc          TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS submitters (
    user TEXT PRIMARY KEY,
    doc  TEXT NOT NULL
);
"""

# Columns mirrored from the JSON doc, so the WHERE clauses and indexes can see them.
_TASK_COLUMNS: Final = ("state", "run_id", "updated_at")


class SQLiteStore:
    """``Store`` on a SQLite file; safe for several threads and processes at once."""

    def __init__(self, path: str | PathLike[str], *, read_only: bool = False) -> None:
        self.path = Path(path)
        # read_only: connections opened with mode=ro (the MCP gateway reads, never writes: issue
        # 20); the schema is the writers' to create, so the file must exist.
        self.read_only = read_only
        self._local = threading.local()
        self._conns: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._closed = False
        self._pid = os.getpid()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create the directory of store file {self.path}: {exc}") from exc
        if read_only:
            if not self.path.is_file():
                raise StoreError(
                    f"store file {self.path} does not exist (a read-only store opens an existing one)"
                )
            return
        with self._errors("open"):
            self._create_schema()

    # --- connections ---------------------------------------------------------------

    def _conn(self) -> sqlite3.Connection:
        if self._closed:
            raise StoreError(f"store {self.path} is closed")
        if self._pid != os.getpid():
            # Forked (e.g. a prefork pool): a SQLite connection must not cross fork(), and
            # closing the parent's copies here could release the parent's file locks, so
            # they are abandoned, not closed, and this process opens its own.
            with self._lock:
                self._local, self._conns, self._pid = threading.local(), [], os.getpid()
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is not None:
            return conn
        # isolation_level=None: no implicit transactions; BEGIN IMMEDIATE where we need one.
        # check_same_thread=False only so close() may close other threads' connections.
        target = f"{self.path.resolve().as_uri()}?mode=ro" if self.read_only else str(self.path)
        # timeout=0: no SQLite busy handler; PatientConnection waits instead, in shorter steps.
        conn = sqlite3.connect(
            target,
            timeout=0,
            isolation_level=None,
            check_same_thread=False,
            uri=self.read_only,
            factory=PatientConnection,
        )
        with self._lock:
            if self._closed:
                conn.close()
                raise StoreError(f"store {self.path} is closed")
            self._conns.append(conn)
        # WAL + NORMAL: a commit is durable once in the WAL; only a power loss or OS crash
        # can take back the last commits (never corrupt the file) - the same bound as Redis's
        # AOF everysec beside it. FULL's fsync per commit cost ~0.17 ms, several per task.
        conn.execute("PRAGMA synchronous = NORMAL")
        self._local.conn = conn
        return conn

    def _create_schema(self) -> None:
        conn = self._conn()
        # Switching a new file to WAL needs an exclusive lock; when several processes open
        # a new file together it can still report "locked" despite the busy timeout.
        deadline = time.monotonic() + BUSY_TIMEOUT_S
        while True:
            try:
                conn.execute("PRAGMA journal_mode = WAL")
                break
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        with self._tx() as c:
            version = c.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"store file {self.path} has schema version {version}, newer than this "
                    f"vancetope understands ({SCHEMA_VERSION}); upgrade vancetope"
                )
            columns = {row[1] for row in c.execute("PRAGMA table_info(tasks)")}
            if columns and "expires_at" not in columns:
                # Added beside version 1, which it leaves readable by older code: they never
                # read the column, and a task they end keeps a stale one that tasks_expired
                # skips by its state.
                c.execute("ALTER TABLE tasks ADD COLUMN expires_at REAL")
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    c.execute(statement)
            c.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        # IMMEDIATE takes the write lock up front, so a transaction that reads and then
        # writes cannot fail half-way with SQLITE_BUSY when another writer got there first.
        # Inside batch() the outer transaction is joined: the batch commits (or not) as one.
        conn = self._conn()
        if conn.in_transaction:
            yield conn
            return
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    @contextmanager
    def batch(self) -> Iterator[None]:
        with self._errors("batch"), self._tx():
            yield

    @contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as exc:
            raise StoreError(f"store {self.path}: {what} failed: {exc}") from exc

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns, self._conns = self._conns, []
        if self._pid != os.getpid():
            return  # inherited across fork(): the parent's to close (see _conn)
        for conn in conns:
            conn.close()

    # --- trees ----------------------------------------------------------------------

    def put_tree(self, tree: TreeRecord, tasks: list[TaskRecord]) -> None:
        check_new_tree(tree, tasks)
        with self._errors(f"put_tree({tree.tree_id!r})"), self._tx() as c:
            try:
                c.execute(
                    "INSERT INTO trees (tree_id, status, submitted_at, doc) VALUES (?, ?, ?, ?)",
                    (tree.tree_id, tree.status.value, tree.submitted_at, tree.model_dump_json()),
                )
            except sqlite3.IntegrityError as exc:
                raise duplicate_tree_error(tree.tree_id) from exc
            c.executemany(
                "INSERT INTO tasks (tree_id, task_id, state, run_id, updated_at, doc) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                [
                    (t.tree_id, t.task_id, t.state.value, t.run_id, t.updated_at, t.model_dump_json())
                    for t in tasks
                ],
            )

    def add_tasks(self, tree_id: str, tasks: list[TaskRecord]) -> None:
        with self._errors(f"add_tasks({tree_id!r})"), self._tx() as c:
            c.executemany(
                "INSERT OR IGNORE INTO tasks (tree_id, task_id, state, run_id, updated_at, doc) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                [
                    (tree_id, t.task_id, t.state.value, t.run_id, t.updated_at, t.model_dump_json())
                    for t in tasks
                ],
            )

    def get_tree(self, tree_id: str, *, lazy: bool = False) -> TreeRecord | None:
        with self._errors(f"get_tree({tree_id!r})"):
            row = self._conn().execute("SELECT doc FROM trees WHERE tree_id = ?", (tree_id,)).fetchone()
        if row is None:
            return None
        return TreeRecord.stored(json.loads(row[0])) if lazy else TreeRecord.model_validate_json(row[0])

    def list_trees(
        self, limit: int = 50, *, since: float | None = None, until: float | None = None
    ) -> list[TreeRecord]:
        if limit <= 0:
            return []
        where, params = _submitted_between(since, until)
        sql = f"SELECT doc FROM trees WHERE 1{where} ORDER BY submitted_at DESC, seq DESC LIMIT ?"
        with self._errors("list_trees"):
            rows = self._conn().execute(sql, (*params, limit)).fetchall()
        return [TreeRecord.model_validate_json(r[0]) for r in rows]

    def finish_tree(self, tree_id: str, status: TreeStatus, finished_at: float) -> bool:
        status = check_final_status(tree_id, status)
        with self._errors(f"finish_tree({tree_id!r})"):
            cur = self._conn().execute(
                "UPDATE trees SET status = ?, doc = json_set(doc, '$.status', ?, '$.finished_at', ?) "
                "WHERE tree_id = ? AND status = ?",
                (status.value, status.value, finished_at, tree_id, TreeStatus.RUNNING.value),
            )
        return cur.rowcount == 1

    # --- tasks ----------------------------------------------------------------------

    def get_task(self, tree_id: str, task_id: str) -> TaskRecord | None:
        with self._errors(f"get_task({tree_id!r}, {task_id!r})"):
            row = (
                self._conn()
                .execute("SELECT doc FROM tasks WHERE tree_id = ? AND task_id = ?", (tree_id, task_id))
                .fetchone()
            )
        return None if row is None else TaskRecord.model_validate_json(row[0])

    def get_tasks(self, tree_id: str, task_ids: Collection[str] | None = None) -> list[TaskRecord]:
        with self._errors(f"get_tasks({tree_id!r})"):
            if task_ids is None:
                rows = (
                    self._conn()
                    .execute("SELECT doc FROM tasks WHERE tree_id = ? ORDER BY seq", (tree_id,))
                    .fetchall()
                )
            else:
                rows = []
                for chunk in _chunks(list(task_ids)):
                    rows += (
                        self._conn()
                        .execute(
                            f"SELECT seq, doc FROM tasks WHERE tree_id = ? AND task_id IN ({_marks(chunk)})",
                            (tree_id, *chunk),
                        )
                        .fetchall()
                    )
                rows = [(doc,) for _, doc in sorted(rows)]
        return [TaskRecord.model_validate_json(r[0]) for r in rows]

    def first_task_in(
        self, tree_id: str, states: Collection[TaskState], among: Collection[str] | None = None
    ) -> tuple[str, TaskState] | None:
        values = state_values(states)
        if not values:
            return None
        sql = f"SELECT task_id, state FROM tasks WHERE tree_id = ? AND {_in_states(values, named=among is not None)}"
        with self._errors(f"first_task_in({tree_id!r})"):
            conn = self._conn()
            if among is None:
                row = conn.execute(sql + " LIMIT 1", (tree_id, *values)).fetchone()
                return None if row is None else (row[0], TaskState(row[1]))
            for chunk in _chunks(list(among)):
                row = conn.execute(
                    sql + f" AND task_id IN ({_marks(chunk)}) LIMIT 1", (tree_id, *values, *chunk)
                ).fetchone()
                if row is not None:
                    return row[0], TaskState(row[1])
        return None

    def task_states(self, tree_id: str) -> dict[str, TaskState]:
        with self._errors(f"task_states({tree_id!r})"):
            rows = (
                self._conn()
                .execute("SELECT task_id, state FROM tasks WHERE tree_id = ?", (tree_id,))
                .fetchall()
            )
        return {task_id: TaskState(state) for task_id, state in rows}

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
        values = task_changes_json(tree_id, task_id, changes)
        states = state_values(from_states)
        if not states:
            return None
        # One statement: the check and the write are atomic, and RETURNING hands back the
        # row this call wrote (no second read that another writer could slip in front of).
        sets = ["doc = json_set(doc" + ", ?, json(?)" * len(values) + ")"] if values else ["seq = seq"]
        params: list[Any] = []
        for name, text in values.items():
            params += [f"$.{name}", text]
        for name in _TASK_COLUMNS:
            if name in values:
                sets.append(f"{name} = ?")
                params.append(json.loads(values[name]))  # a state, a run id or a time: a scalar
        if ends(changes):
            sets.append("expires_at = NULL")  # out of tasks_by_expiry: it holds unfinished tasks
        elif expires_at is not ANY:
            sets.append("expires_at = ?")
            params.append(expires_at)
        where = f"tree_id = ? AND task_id = ? AND state IN ({_marks(states)})"
        params += [tree_id, task_id, *states]
        if expect_run_id is not ANY:
            where += " AND run_id IS ?"  # IS: NULL-safe, so expect_run_id=None means "is null"
            params.append(expect_run_id)
        if expect_client_id is not ANY:
            where += " AND json_extract(doc, '$.client_id') IS ?"
            params.append(expect_client_id)
        sql = f"UPDATE tasks SET {', '.join(sets)} WHERE {where} RETURNING doc"
        with self._errors(f"transition of task {task_id!r} in tree {tree_id!r}"):
            rows = self._conn().execute(sql, params).fetchall()  # fetchall: finish the statement
        return TaskRecord.model_validate_json(rows[0][0]) if rows else None

    def begin_run(
        self, tree_id: str, task_id: str, run_id: str, worker: str, started_at: float
    ) -> int | None:
        # One UPDATE: the check, the count and the move to running are atomic, as transition()'s.
        # A redelivery of the same run (its worker died) finds it running and begins it again.
        sql = (
            "UPDATE tasks SET state = ?, updated_at = ?, doc = json_set(doc, '$.state', ?, '$.updated_at', ?, "
            "'$.deliveries', coalesce(json_extract(doc, '$.deliveries'), 0) + 1, "
            "'$.worker', ?, '$.started_at', ?) "
            "WHERE tree_id = ? AND task_id = ? AND run_id = ? AND state IN (?, ?) "
            "RETURNING json_extract(doc, '$.deliveries')"
        )
        running = TaskState.RUNNING.value
        params = (
            running, started_at, running, started_at, worker, started_at,
            tree_id, task_id, run_id, *state_values(BEGINS_FROM),
        )  # fmt: skip
        with self._errors(f"begin_run of task {task_id!r} in tree {tree_id!r}"):
            rows = self._conn().execute(sql, params).fetchall()  # fetchall: finish the statement
        return int(rows[0][0]) if rows else None

    def tasks_in_states(
        self,
        states: Collection[TaskState],
        *,
        updated_before: float | None = None,
        client_id: str | None = None,
        limit: int = 1000,
    ) -> list[TaskRecord]:
        values = state_values(states)
        if not values or limit <= 0:  # SQLite reads a negative LIMIT as "all"
            return []
        sql = f"SELECT doc FROM tasks WHERE state IN ({', '.join('?' * len(values))})"
        params: list[Any] = list(values)
        if updated_before is not None:
            sql += " AND updated_at < ?"
            params.append(updated_before)
        if client_id is not None:
            sql += " AND json_extract(doc, '$.client_id') = ?"
            params.append(client_id)
        sql += " ORDER BY updated_at, seq LIMIT ?"
        params.append(limit)
        with self._errors("tasks_in_states"):
            rows = self._conn().execute(sql, params).fetchall()
        return [TaskRecord.model_validate_json(r[0]) for r in rows]

    def backfill_deadlines(self) -> int:
        if self._conn().execute("SELECT 1 FROM meta WHERE key = ?", (BACKFILLED,)).fetchone():
            return 0  # done once for this store: every dispatch since writes its deadline
        unfinished = state_values(NOT_FINAL)
        # Queued by an older version: left pending once, yet no deadline (the state index keeps
        # this a read of the unfinished tasks, not of the whole table).
        missing = (
            f"expires_at IS NULL AND state IN ({_marks(unfinished)}) "
            "AND json_extract(doc, '$.first_queued_at') IS NOT NULL"
        )
        with self._errors("backfill_deadlines"):
            # Read without the write lock; an item of a for_each task carries its own spec.
            rows = (
                self._conn()
                .execute(
                    "SELECT seq, tree_id, task_id, json_extract(doc, '$.first_queued_at'), "
                    f"json_extract(doc, '$.spec.max_total_s') FROM tasks WHERE {missing}",
                    unfinished,
                )
                .fetchall()
            )
            limits = MaxTotals(self._tree_spec)
            deadlines: list[tuple[float, int]] = []
            for seq, tree_id, task_id, first, own in rows:
                limit = limits.of(tree_id, task_id, {"max_total_s": own})
                if limit is not None:
                    deadlines.append((float(first) + limit, seq))
            done = 0
            for start in range(0, len(deadlines), BACKFILL_CHUNK):
                with self._tx() as c:  # short writes: the pools write meanwhile
                    done += c.executemany(
                        f"UPDATE tasks SET expires_at = ? WHERE seq = ? AND {missing}",
                        [(*d, *unfinished) for d in deadlines[start : start + BACKFILL_CHUNK]],
                    ).rowcount
            with self._tx() as c:
                c.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, 'done')", (BACKFILLED,))
        return done

    def _tree_spec(self, tree_id: str) -> Any:
        row = (
            self._conn()
            .execute("SELECT json_extract(doc, '$.tree') FROM trees WHERE tree_id = ?", (tree_id,))
            .fetchone()
        )
        return json.loads(row[0]) if row and row[0] else None

    def tasks_expired(self, now: float, *, limit: int = 1000) -> list[TaskRecord]:
        if limit <= 0:
            return []
        unfinished = state_values(NOT_FINAL)
        # The partial index tasks_by_expiry holds only the tasks with a deadline, so this reads
        # those past it and not every unfinished task (the state is checked for rows an older
        # version ended without clearing their deadline).
        sql = (
            "SELECT doc FROM tasks INDEXED BY tasks_by_expiry "
            f"WHERE expires_at IS NOT NULL AND expires_at <= ? AND state IN ({_marks(unfinished)}) "
            "ORDER BY expires_at LIMIT ?"
        )
        with self._errors("tasks_expired"):
            rows = self._conn().execute(sql, [now, *unfinished, limit]).fetchall()
        return [TaskRecord.model_validate_json(r[0]) for r in rows]

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
        # One UPDATE: the check and the write are atomic per row, as transition()'s are.
        sql = (
            "UPDATE tasks SET state = ?, updated_at = ?, expires_at = NULL, "
            "doc = json_set(doc, '$.state', ?, '$.reason', ?, "
            "'$.error', json('null'), '$.finished_at', ?, '$.updated_at', ?) "
            f"WHERE tree_id = ? AND {_in_states(states, named=among is not None)}"
        )
        params: list[Any] = [
            TaskState(state).value, finished_at, TaskState(state).value, reason, finished_at, finished_at,
            tree_id, *states,
        ]  # fmt: skip
        if task_id is not None:
            sql += " AND task_id = ?"
            params.append(task_id)
        returning = " RETURNING seq, task_id, run_id, json_extract(doc, '$.client_id')"
        with self._errors(f"end_tasks({tree_id!r})"):
            conn = self._conn()
            if among is None:
                rows = conn.execute(sql + returning, params).fetchall()
            else:
                rows = []
                for chunk in _chunks(list(among)):
                    rows += conn.execute(
                        sql + f" AND task_id IN ({_marks(chunk)})" + returning, [*params, *chunk]
                    ).fetchall()
        return [Ended(*row[1:]) for row in sorted(rows)]  # RETURNING's order is arbitrary: put_tree's

    def count_unfinished(self, user: str | None, states: Collection[TaskState]) -> int:
        values = state_values(states)
        if not values:
            return 0
        # Every submit asks (max_unfinished_tasks_per_user). Without the index, json_extract
        # parsed the whole doc of every running tree, a 5,000-task batch's included: 1-5 ms per
        # submit of anyone, while that batch ran (bench interactive_under_batch, bench/README.md).
        sql = (
            f"SELECT COUNT(*) FROM tasks WHERE state IN ({_marks(values)}) AND tree_id IN "
            "(SELECT tree_id FROM trees INDEXED BY trees_by_user "
            "WHERE json_extract(doc, '$.user') IS ? AND status = ?)"
        )
        with self._errors("count_unfinished"):
            row = self._conn().execute(sql, (*values, user, TreeStatus.RUNNING.value)).fetchone()
        return int(row[0])

    # --- enrollments ------------------------------------------------------------------

    def put_enrollment(self, enrollment: Enrollment) -> None:
        with self._errors(f"put_enrollment({enrollment.client_id!r})"):
            self._conn().execute(
                "INSERT INTO enrollments (client_id, doc) VALUES (?, ?) "
                "ON CONFLICT (client_id) DO UPDATE SET doc = excluded.doc",
                (enrollment.client_id, enrollment.model_dump_json()),
            )

    def get_enrollment(self, client_id: str) -> Enrollment | None:
        with self._errors(f"get_enrollment({client_id!r})"):
            row = (
                self._conn()
                .execute("SELECT doc FROM enrollments WHERE client_id = ?", (client_id,))
                .fetchone()
            )
        return None if row is None else Enrollment.model_validate_json(row[0])

    def list_enrollments(self) -> list[Enrollment]:
        with self._errors("list_enrollments"):
            rows = self._conn().execute("SELECT doc FROM enrollments ORDER BY client_id").fetchall()
        return [Enrollment.model_validate_json(r[0]) for r in rows]

    def delete_enrollment(self, client_id: str) -> bool:
        with self._errors(f"delete_enrollment({client_id!r})"):
            cur = self._conn().execute("DELETE FROM enrollments WHERE client_id = ?", (client_id,))
        return cur.rowcount == 1

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
        sql = "SELECT doc FROM trees WHERE json_extract(doc, '$.schedule') = ?"
        params: list[Any] = [schedule]
        if running_only:
            sql += " AND status = ?"
            params.append(TreeStatus.RUNNING.value)
        where, between = _submitted_between(since, until)
        sql += where
        params += between
        sql += " ORDER BY submitted_at DESC, seq DESC LIMIT ?"
        with self._errors(f"schedule_runs({schedule!r})"):
            rows = self._conn().execute(sql, (*params, limit)).fetchall()
        return [TreeRecord.model_validate_json(r[0]) for r in rows]

    def record_fire(self, schedule: str, fired_at: float) -> None:
        with self._errors(f"record_fire({schedule!r})"):
            self._conn().execute(
                "INSERT INTO schedule_fires (schedule, fired_at) VALUES (?, ?) "
                "ON CONFLICT (schedule) DO UPDATE SET fired_at = excluded.fired_at",
                (schedule, fired_at),
            )

    def last_fires(self) -> dict[str, float]:
        with self._errors("last_fires"):
            rows = self._conn().execute("SELECT schedule, fired_at FROM schedule_fires").fetchall()
        return {name: at for name, at in rows}

    def put_summary(self, summary: RunSummary) -> bool:
        with self._errors(f"put_summary({summary.tree_id!r})"):
            cur = self._conn().execute(
                "INSERT INTO summaries (tree_id, kind, doc) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
                (summary.tree_id, summary.kind.value, summary.model_dump_json()),
            )
        return cur.rowcount == 1

    def get_summaries(self, tree_id: str) -> list[RunSummary]:
        with self._errors(f"get_summaries({tree_id!r})"):
            rows = (
                self._conn()
                .execute("SELECT doc FROM summaries WHERE tree_id = ? ORDER BY seq", (tree_id,))
                .fetchall()
            )
        return [RunSummary.model_validate_json(r[0]) for r in rows]

    # --- secrets --------------------------------------------------------------------

    def put_secret(self, secret: SecretRecord) -> None:
        with self._errors(f"put_secret({secret.name!r})"):
            self._conn().execute(
                "INSERT INTO secrets (name, doc) VALUES (?, ?) ON CONFLICT (name) DO UPDATE SET doc = excluded.doc",
                (secret.name, secret.model_dump_json()),
            )

    def get_secret(self, name: str) -> SecretRecord | None:
        with self._errors(f"get_secret({name!r})"):
            row = self._conn().execute("SELECT doc FROM secrets WHERE name = ?", (name,)).fetchone()
        return None if row is None else SecretRecord.model_validate_json(row[0])

    def list_secrets(self) -> list[SecretRecord]:
        with self._errors("list_secrets"):
            rows = self._conn().execute("SELECT doc FROM secrets ORDER BY name").fetchall()
        return [SecretRecord.model_validate_json(r[0]) for r in rows]

    def delete_secret(self, name: str) -> bool:
        with self._errors(f"delete_secret({name!r})"):
            cur = self._conn().execute("DELETE FROM secrets WHERE name = ?", (name,))
        return cur.rowcount == 1

    # --- gateway tokens -------------------------------------------------------------

    def put_gateway_token(self, token: GatewayToken) -> None:
        with self._errors(f"put_gateway_token({token.user!r})"):
            self._conn().execute(
                "INSERT INTO gateway_tokens (user, token_sha256, doc) VALUES (?, ?, ?) ON CONFLICT (user) "
                "DO UPDATE SET token_sha256 = excluded.token_sha256, doc = excluded.doc",
                (token.user, token.token_sha256, token.model_dump_json()),
            )

    def find_gateway_token(self, token_sha256: str) -> GatewayToken | None:
        with self._errors("find_gateway_token"):
            row = (
                self._conn()
                .execute("SELECT doc FROM gateway_tokens WHERE token_sha256 = ?", (token_sha256,))
                .fetchone()
            )
        return None if row is None else GatewayToken.model_validate_json(row[0])

    def delete_gateway_token(self, user: str) -> bool:
        with self._errors(f"delete_gateway_token({user!r})"):
            cur = self._conn().execute("DELETE FROM gateway_tokens WHERE user = ?", (user,))
        return cur.rowcount == 1

    # --- submit credentials -------------------------------------------------------------

    def put_submitter(self, credential: SubmitCredential) -> None:
        with self._errors(f"put_submitter({credential.user!r})"):
            self._conn().execute(
                "INSERT INTO submitters (user, doc) VALUES (?, ?) ON CONFLICT (user) DO UPDATE SET doc = excluded.doc",
                (credential.user, credential.model_dump_json()),
            )

    def list_submitters(self) -> list[SubmitCredential]:
        with self._errors("list_submitters"):
            rows = self._conn().execute("SELECT doc FROM submitters ORDER BY user").fetchall()
        return [SubmitCredential.model_validate_json(r[0]) for r in rows]

    def delete_submitter(self, user: str) -> bool:
        with self._errors(f"delete_submitter({user!r})"):
            cur = self._conn().execute("DELETE FROM submitters WHERE user = ?", (user,))
        return cur.rowcount == 1

    def __repr__(self) -> str:
        return f"SQLiteStore({str(self.path)!r})"


# SQLite allows 32,766 bound parameters per statement (3.32+); a task may depend on more.
_CHUNK: Final = 900


def _chunks(items: list[str]) -> Iterator[list[str]]:
    for start in range(0, len(items), _CHUNK):
        yield items[start : start + _CHUNK]


def _in_states(values: Collection[str], *, named: bool) -> str:
    """``state IN (...)`` of a WHERE clause; ``+state`` when the statement also names its tasks
    (``task_id IN (...)``): it keeps SQLite off the (tree_id, state) index, through which a
    statement about a few named tasks read every task of the tree in those states (each item's
    result of a fan-out of N, each member's of a fan-in, read its unfinished siblings: O(N²)).
    The (tree_id, task_id) key is a lookup per task named."""
    return f"{'+' if named else ''}state IN ({_marks(values)})"


def _marks(items: Collection[Any]) -> str:
    return ", ".join("?" * len(items))


def _submitted_between(since: float | None, until: float | None) -> tuple[str, list[float]]:
    """The ``AND`` clauses (and their parameters) of a ``since <= submitted_at < until`` window."""
    bounds = [(op, at) for op, at in ((">=", since), ("<", until)) if at is not None]
    return "".join(f" AND submitted_at {op} ?" for op, _ in bounds), [at for _, at in bounds]
