"""A stack process keeps its credentials from its children (layer: workers, process glue; issue 20, M5).

The brain and the server pools start server-side MCP servers: third-party code running as
the stack's OS user. Such a child gets a scrubbed environment (``workers.tools.process.
mcp_server_env``), but it could still read its parent's: ``/proc/<ppid>/environ`` shows the
environment the parent was *started* with, whatever ``os.environ`` says now, and
``/proc/<ppid>/mem`` its memory. So, once a process has read its settings:

- ``forget_secret_environment`` removes the credential variables (``SECRET_VARIABLES``, and
  any ``VANCETOPE_*`` URL that holds a user or password) from ``os.environ`` and overwrites
  their bytes in the initial environment block with NULs, so ``/proc/<pid>/environ`` — of
  this process and of the children it forks later (Celery's prefork pool) — no longer shows
  them, even to root;
- ``make_undumpable`` sets ``PR_SET_DUMPABLE`` to 0 (``prctl``): the kernel then makes
  ``/proc/<pid>/environ``, ``mem``, ``maps``, ``fd`` owned by root and refuses ``ptrace``, so
  a same-user process that is not root cannot read this process's memory, where the
  settings still are. It is inherited by forked children and reset by ``execve``, so an
  MCP server is dumpable as usual. No core dumps follow from a crash of this process.

Linux only; elsewhere both are no-ops (``protect_process`` says what it did). A root child
can still read everything: see docs/security.md, "Server-side MCP servers".
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys
from collections.abc import Iterable, Mapping
from urllib.parse import urlsplit

log = logging.getLogger("vancetope.worker")

# The settings that are credentials: Redis (with its password), the store (MongoDB's may hold
# one), the vault's keys, and http_headers (values may be literal tokens).
SECRET_VARIABLES = frozenset(
    {
        "VANCETOPE_REDIS_URL",
        "VANCETOPE_MONGO_URL",
        "VANCETOPE_STORE_URL",
        "VANCETOPE_VAULT_KEY",
        "VANCETOPE_HTTP_HEADERS",
    }
)
_PR_SET_DUMPABLE = 4
_PR_GET_DUMPABLE = 3
# /proc/<pid>/stat fields 50 and 51 (1-based, Linux >= 3.5): where the initial environment lies.
_ENV_START_FIELD = 50


def secret_variables(environ: Mapping[str, str]) -> list[str]:
    """The names in ``environ`` that hold a credential (pure)."""
    return sorted(
        name
        for name, value in environ.items()
        if name in SECRET_VARIABLES or (name.startswith("VANCETOPE_") and _url_with_userinfo(value))
    )


def _url_with_userinfo(value: str) -> bool:
    try:
        parts = urlsplit(value.strip())
    except ValueError:
        return False
    return bool(parts.scheme and parts.netloc and (parts.username or parts.password))


def forget_secret_environment() -> list[str]:
    """Drop the credential variables from ``os.environ`` and from ``/proc/self/environ``; the names."""
    names = secret_variables(os.environ)
    for name in names:
        os.environ.pop(name, None)  # unsetenv: children started later do not inherit it
    if names and sys.platform == "linux":
        _blank_initial_environment(names)
    return names


def _blank_initial_environment(names: Iterable[str]) -> None:
    """Overwrite ``NAME=value`` of each name in the block ``/proc/self/environ`` reads."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        # After the ")" closing the command name comes field 3.
        start, end = int(fields[_ENV_START_FIELD - 3]), int(fields[_ENV_START_FIELD - 2])
    except (OSError, IndexError, ValueError) as exc:
        log.warning("cannot find this process's initial environment to blank it: %s", exc)
        return
    if not 0 < start < end:
        return
    block = ctypes.string_at(start, end - start)
    prefixes = tuple(f"{name}=".encode() for name in names)
    offset = 0
    for entry in block.split(b"\0"):
        if entry.startswith(prefixes):
            # libc's environ no longer points here (unsetenv above), nor does os.environ (copies).
            ctypes.memset(start + offset, 0, len(entry))
        offset += len(entry) + 1


def make_undumpable() -> bool:
    """``prctl(PR_SET_DUMPABLE, 0)``; False where that is not possible (not Linux)."""
    if sys.platform != "linux":
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        log.warning("prctl(PR_SET_DUMPABLE, 0) failed: %s", os.strerror(ctypes.get_errno()))
        return False
    return bool(libc.prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0) == 0)


def protect_process(what: str) -> None:
    """Both of the above, once this process has read its settings; logs what was done."""
    names = forget_secret_environment()
    undumpable = make_undumpable()
    log.info(
        "%s: %s removed from the environment; %s",
        what,
        ", ".join(names) or "no credential variable",
        "not dumpable (children cannot read its memory or environ unless root)"
        if undumpable
        else "could not be made non-dumpable on this platform",
    )


__all__ = [
    "SECRET_VARIABLES",
    "forget_secret_environment",
    "make_undumpable",
    "protect_process",
    "secret_variables",
]
