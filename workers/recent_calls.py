"""A client agent's memory of the calls it ran (layer: workers; no Redis, no Celery).

When a workstation's link is cut in the middle of a call, the brain stops hearing its
heartbeat and takes the call back (parked for the client, or sent elsewhere): it cannot tell
a dead agent from a cut link. The agent, still alive, finishes the call and cannot deliver
the result; once the link heals the brain refuses that result (it is no longer the task's
run) and sends the same task again as a new run. Without this memory the tool runs twice: a
commit made twice, a mail sent twice.

``RecentCalls`` is what lets the agent answer the new run with the first run's result instead:
the same task of the same tree with the same tool and arguments, re-sent as a new run (or the
same run delivered again), is answered from the successful result the agent already has, or
waits for the run still executing it. Only successes are kept: a failed call is tried again
on purpose (the retry policy), and must run again. Kept for ``keep_s`` and within
``max_bytes`` in all, oldest forgotten first; an agent restart forgets it all (a run that
died with its process runs again, as the reliability docs say).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from workers.contracts import ToolCall, ToolResult

KEEP_S = 6 * 3600.0  # a laptop offline for a working day still finds its results
MAX_BYTES = 64 * 1024 * 1024
MAX_ENTRIES = 20_000


def call_key(call: ToolCall) -> str:
    """What makes two runs the same call: the task of the tree, the tool and its arguments."""
    args = json.dumps(call.args, sort_keys=True, separators=(",", ":"), default=str)
    digest = hashlib.sha256(args.encode()).hexdigest()
    return f"{call.tree_id}\0{call.task_id}\0{call.tool}\0{digest}"


@dataclass
class _Entry:
    run_id: str
    done: threading.Event = field(default_factory=threading.Event)
    result: ToolResult | None = None  # set when done and successful
    size: int = 0
    at: float = 0.0


@dataclass(frozen=True)
class Reused:
    """A run answered from an earlier run of the same call."""

    result: ToolResult  # the earlier result, relabelled as this run's
    first_run_id: str
    age_s: float  # since the earlier run finished


class RecentCalls:
    """Thread-safe: a threads-pool agent runs several calls at once."""

    def __init__(
        self,
        keep_s: float = KEEP_S,
        max_bytes: int = MAX_BYTES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.keep_s = keep_s
        self.max_bytes = max_bytes
        self.clock = clock
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._bytes = 0

    def begin(self, call: ToolCall, wait_s: float) -> Reused | None:
        """Before ``call`` runs: the earlier result to answer it with, else None (and the call is
        now the one running for its key, to be ended with ``end``). A run of the same call still
        executing is waited for up to ``wait_s``; if it fails or is still running, this run goes
        ahead."""
        key = call_key(call)
        with self._lock:
            self._expire()
            entry = self._entries.get(key)
            if entry is None or (entry.done.is_set() and entry.result is None):
                self._put(key, _Entry(run_id=call.run_id))
                return None
        entry.done.wait(wait_s)
        with self._lock:
            if entry.result is not None:
                relabelled = entry.result.model_copy(update={"run_id": call.run_id})
                return Reused(relabelled, entry.run_id, max(0.0, self.clock() - entry.at))
            # Failed, or still running past wait_s: this run executes, and owns the key now.
            self._put(key, _Entry(run_id=call.run_id))
            return None

    def end(self, call: ToolCall, result: ToolResult | None) -> None:
        """``call`` (begun with ``begin`` returning None) finished with ``result`` (None: it
        raised). Waiters are released either way; only a success is kept."""
        key = call_key(call)
        size = len(result.model_dump_json()) if result is not None and result.ok else 0
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry.run_id != call.run_id:
                return  # forgotten meanwhile, or another run owns the key now
            if result is not None and result.ok and size <= self.max_bytes:
                entry.result, entry.size, entry.at = result, size, self.clock()
                self._bytes += size
                self._entries.move_to_end(key)
                self._expire()
            else:
                del self._entries[key]
            entry.done.set()

    def __len__(self) -> int:
        return len(self._entries)

    def _put(self, key: str, entry: _Entry) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self._bytes -= old.size
            old.done.set()
        self._entries[key] = entry

    def _expire(self) -> None:
        """Forget the oldest finished entries while past ``keep_s``, over ``max_bytes`` or over
        ``MAX_ENTRIES``. Finished entries are in the order they finished (``end`` moves each to
        the end), so this stops at the first one to keep; running ones are skipped."""
        now = self.clock()
        for key in list(self._entries):
            entry = self._entries[key]
            if not entry.done.is_set():
                continue  # running: kept whatever its age
            over = self._bytes > self.max_bytes or len(self._entries) > MAX_ENTRIES
            if not over and now - entry.at <= self.keep_s:
                break
            self._bytes -= entry.size
            del self._entries[key]
