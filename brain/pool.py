"""Celery entry point of the server worker pool as the stack runs it (layer: brain, wiring).

``celery -A brain.pool worker -Q server`` (or ``-Q server.<pool>``) is ``workers.server_worker``
with one change: a finished task's result is recorded in the worker, and its ready dependents
are dispatched from there (``brain.runtime.recorder``); the brain gets the result only if that fails.
"""

import logging
import os

from brain.config import load_settings, sandbox_hidden
from brain.runtime import vault
from brain.runtime.recorder import InlineRecorder
from workers import sandbox
from workers.app import app
from workers.pool_presence import PoolPresence
from workers.proc_guard import protect_process
from workers.tasks import HotState, register, send_to_brain
from workers.tools.builtin import builtin_tools
from workers.tools.http_get import HttpHeaders
from workers.tools.netguard import HttpAllow

settings = load_settings()
# ${vault:NAME} in the server mcpServers file is resolved here, as each MCP server starts.
vault.install(settings)
if not settings.task_log:
    # Celery decides once, when a worker builds its task handlers, whether to log a line per
    # task received (main process) and finished (each child): set before either is built.
    for name in ("celery.worker.strategy", "celery.app.trace"):
        logging.getLogger(name).setLevel(logging.WARNING)
# workers.app turns them on for every worker; -E (brain.stack.embedded.celery_argv) follows the setting too.
app.conf.worker_send_task_events = settings.task_events
# Status asks whether anyone consumes a pool's queue: this worker says so (workers.pool_presence).
app.steps["consumer"].add(PoolPresence)
recorder = InlineRecorder(
    app, fallback=send_to_brain(app), begin_fallback=HotState(app).begin_run, settings=settings
)
run_tool = register(
    app,
    sink=recorder,
    begin=recorder.begin,
    builtins=builtin_tools(HttpAllow.from_env(os.environ), HttpHeaders.from_env(os.environ)),
    progress=recorder.progress,
    task_events=settings.task_events,
    channel=recorder,
    end=recorder.end,
)
# Everything is read: the credentials leave the environment, and the pool's memory and
# /proc/<pid>/environ are closed to its children, the MCP servers (workers.proc_guard); they
# start in bubblewrap without the data dir where it runs (workers.sandbox).
protect_process("server pool")
sandbox.install_chosen(settings.mcp_sandbox, sandbox_hidden(settings))

__all__ = ["app", "run_tool"]
