"""Child processes of native tools (layer: workers).

One job: start a command for a native tool (``shell_execute``, ``git_status``) with a
minimal environment and a bounded run time. The environment is an allow-list, not a
deny-list: the agent's own variables (``VANCETOPE_*``: broker URL, credentials) and
anything else a tree should not see never reach a command a tree chose.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from workers.errors import Cancelled, ToolFailed, ToolTimeout

# What a command needs to find programs, a home, a locale and a temp folder; nothing else.
INHERITED_ENV = frozenset(
    {"PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "TZ", "LANG", "LANGUAGE", "TMPDIR", "TEMP", "TMP"}
)
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
STACK_PREFIX = "VANCETOPE_"
# How often a running command looks whether its call was stopped (``run_bounded``).
CANCEL_POLL_S = 0.2


def minimal_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The part of ``environ`` a tool's command may see: ``INHERITED_ENV`` and ``LC_*``."""
    env = {k: v for k, v in environ.items() if k in INHERITED_ENV or k.startswith("LC_")}
    env.setdefault("PATH", DEFAULT_PATH)
    return env


def mcp_server_env(configured: Mapping[str, str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The whole environment of an MCP server process: ``minimal_env`` of ours plus the
    server's own configured ``env`` (vault references already resolved). Never a ``VANCETOPE_*``
    variable: the stack's Redis URL, store URL and vault key are not a server's business
    (``workers.mcp_config`` refuses them in a server's ``env`` too)."""
    env = {**minimal_env(os.environ if environ is None else environ), **configured}
    return {k: v for k, v in env.items() if not k.startswith(STACK_PREFIX)}


def run_bounded(
    tool: str,
    argv: str | list[str],
    cwd: Path,
    env: dict[str, str],
    timeout: float,
    *,
    shell: bool,
    cancel: threading.Event | None = None,
) -> subprocess.CompletedProcess[bytes]:
    """Run in its own process group so a timeout kills the command and everything it started;
    so does ``cancel`` once set (the call was stopped, or the thread waiting on it gave up at
    its timeout), looked at every ``CANCEL_POLL_S``."""
    try:
        proc = subprocess.Popen(
            argv, cwd=cwd, env=env, shell=shell, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
    except OSError as exc:
        raise ToolFailed(f"{tool}: cannot start {argv!r}: {exc.strerror or exc}", tool=tool) from exc
    deadline = time.monotonic() + max(timeout, 0.001)
    while True:
        left = deadline - time.monotonic()
        wait = left if cancel is None else min(left, CANCEL_POLL_S)
        try:
            # Asked again after a TimeoutExpired, communicate loses none of the output.
            out, err = proc.communicate(timeout=max(wait, 0.001))
            return subprocess.CompletedProcess(argv, proc.returncode, out, err)
        except subprocess.TimeoutExpired:
            if cancel is not None and cancel.is_set():
                _kill_group(proc)
                raise Cancelled(
                    f"{tool}: {argv!r} was stopped and killed: its call was stopped", tool=tool
                ) from None
            if time.monotonic() >= deadline:
                _kill_group(proc)
                raise ToolTimeout(
                    f"{tool}: {argv!r} did not finish within {timeout:g}s and was killed", tool=tool
                ) from None


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.communicate()
