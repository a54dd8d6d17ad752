"""CPU-seconds of process trees from ``/proc/<pid>/stat`` (Linux), for the CPU rows.

A tree's CPU so far is, over every live process in it (the root and all its
descendants, found through each process's parent pid): utime + stime (its own threads)
+ cutime + cstime (its children that exited and were reaped). A prefork pool child that
exits between two readings moves its ticks into its parent's cutime/cstime when it is
reaped, so the difference of two readings still counts it; one reaped by nobody in the
tree would be lost, but every process here is reaped by its own parent (Celery's pool,
``multiprocessing``). A zombie not yet reaped still shows its own utime/stime.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
PROC = Path("/proc")


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (field 3 is index 0), or
    None if the process is gone. The name is in parentheses and may hold spaces or ')'."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return text[text.rindex(")") + 2 :].split()


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process now."""
    out: dict[int, int] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields is not None:
            out[int(entry.name)] = int(fields[1])  # field 4, ppid
    return out


def descendants(roots: Iterable[int]) -> set[int]:
    """``roots`` and every process below them, as of now."""
    children: dict[int, list[int]] = {}
    for pid, ppid in _parents().items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    todo = list(roots)
    while todo:
        pid = todo.pop()
        if pid in found:
            continue
        found.add(pid)
        todo.extend(children.get(pid, ()))
    return found


def process_cpu_s(pid: int) -> float:
    """One process's CPU-seconds so far: its own (all threads) and its reaped children's
    (fields 14-17: utime, stime, cutime, cstime); 0.0 if it is gone."""
    fields = _stat_fields(pid)
    if fields is None:
        return 0.0
    return sum(int(x) for x in fields[11:15]) * TICK_S


def tree_cpu_s(roots: Iterable[int]) -> float:
    """CPU-seconds so far of ``roots`` and all their live descendants (see the module doc)."""
    return sum(process_cpu_s(pid) for pid in descendants(roots))
