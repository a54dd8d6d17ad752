"""Shared plumbing of the benchmarks: result rows, bounded waits, settings, child processes.

Ideas borrowed from tests/conftest.py (bench/ must not import tests/): settings built
with ``load_settings(env={}, cwd=<tmp>)`` so neither the caller's ``VANCETOPE_*``
variables nor the checkout's vancetope.toml leak in, and every wait has a deadline.
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from brain.config import Settings, load_settings
from brain.stack.embedded import EmbeddedStack, tail

ROOT = Path(__file__).resolve().parent.parent
BIN_DIR = Path(sys.executable).parent

_T = TypeVar("_T")

Kind = Literal["latency", "throughput"]


class BenchError(RuntimeError):
    """A benchmark could not produce a number (a wait ran out, a run ended wrong)."""


@dataclass(frozen=True)
class Row:
    """One line of the results table.

    ``kind`` says how the ratio is formed so that it always reads "how many times
    Vancetope's cost is the baseline's" (> 1: Vancetope is slower / costlier):
    latency rows divide vancetope by baseline, throughput rows baseline by vancetope.
    """

    benchmark: str
    metric: str
    baseline: float
    vancetope: float
    kind: Kind
    baseline_label: str
    notes: str = ""
    # The goal for the ratio (Vancetope's cost / the baseline's), None: report only.
    goal: float | None = None
    # Anything else worth keeping in the JSON (sizes, spreads, worst pings).
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def unit(self) -> str:
        return self.metric

    @property
    def ratio_formula(self) -> str:
        """How the ratio is formed, for a row printed on its own (``python -m bench.chain``)."""
        return "vt/base" if self.kind == "latency" else "base/vt"

    @property
    def ratio(self) -> float:
        if math.isnan(self.baseline) or math.isnan(self.vancetope):
            return math.nan
        if self.kind == "latency":
            return self.vancetope / self.baseline if self.baseline else math.inf
        return self.baseline / self.vancetope if self.vancetope else math.inf

    def to_json(self) -> dict[str, Any]:
        """One object of ``--json``: NaN/inf become null (JSON has neither)."""

        def num(x: float) -> float | None:
            return None if math.isnan(x) or math.isinf(x) else x

        return {
            "benchmark": self.benchmark,
            "unit": self.metric,
            "baseline": num(self.baseline),
            "vancetope": num(self.vancetope),
            "ratio": num(self.ratio),
            "goal": self.goal,
            "met": None if self.goal is None or math.isnan(self.ratio) else self.ratio <= self.goal,
            "baseline_is": self.baseline_label,
            "notes": self.notes,
            **self.extra,
        }


def span(values: list[float]) -> str:
    """``1.48–1.59``: the spread of a row's repetitions, for its notes."""
    return f"{min(values):.2f}–{max(values):.2f}"


def not_measured(benchmark: str, metric: str, goal: float | None, why: str) -> Row:
    """A contract row that cannot be measured meaningfully today: NaN values, the reason in notes."""
    nan = math.nan
    return Row(benchmark, metric, nan, nan, "latency", "not measured", why, goal)


def cpu_jiffies() -> tuple[int, int] | None:
    """(busy, all) CPU time of the whole machine so far, from /proc/stat (None elsewhere)."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = ticks[3] + ticks[4]  # idle, iowait
    return sum(ticks) - idle, sum(ticks)


def busy_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """The share of all CPUs that was busy between two :func:`cpu_jiffies` readings."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


def percentile(samples: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile: with few samples p99 is simply the slowest one."""
    if not samples:
        raise BenchError("no samples")
    ordered = sorted(samples)
    rank = max(1, math.ceil(pct / 100.0 * len(ordered)))
    return ordered[rank - 1]


def wait_until(
    predicate: Callable[[], _T],
    timeout: float,
    what: str,
    interval: float = 0.01,
    on_timeout: Callable[[], str] | None = None,
) -> _T:
    """Poll ``predicate`` until it returns something truthy; BenchError after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            detail = on_timeout() if on_timeout else ""
            raise BenchError(
                f"timed out after {timeout:g}s waiting for {what}" + (f"\n{detail}" if detail else "")
            )
        time.sleep(interval)


def scrub_vancetope_env() -> None:
    """Child processes inherit os.environ (brain.stack.embedded.stack_env); a caller's VANCETOPE_* must
    not change what is measured (e.g. add MCP servers), so drop them from this process."""
    for name in [n for n in os.environ if n.startswith("VANCETOPE_")]:
        del os.environ[name]


def bench_settings(root: Path, **overrides: Any) -> Settings:
    """Settings of a benchmark stack: the defaults (server pool prefork -c 2, SQLite store,
    AOF everysec), no registry file, no MCP servers, no client agent."""
    values: dict[str, Any] = {"data_dir": root / "data", "server_concurrency": 2}
    values.update(overrides)
    return load_settings(env={}, cwd=root, **values)


@contextlib.contextmanager
def redis_only_stack(root: Path) -> Iterator[EmbeddedStack]:
    """An EmbeddedStack with only its redis-server running; the brain and the server pool
    are started by :func:`start_vancetope`, after the baseline's worker is up and warm on
    the very same Redis. Everything the stack started is stopped on the way out."""
    stack = EmbeddedStack(bench_settings(root), only=())
    try:
        # The stack's children inherit the cwd; the checkout's vancetope.toml (MCP servers,
        # client agent) must not be read by them, so they start in the temp dir.
        with contextlib.chdir(root):
            stack.start()
        yield stack
    finally:
        stack.stop()


def start_vancetope(stack: EmbeddedStack, ready_timeout: float = 60.0) -> None:
    """Start the brain worker and the server pool of ``stack`` and wait for the brain."""
    with contextlib.chdir(stack.settings.data_dir.parent):
        stack.start_service("brain")
        stack.start_service("server-pool")
    stack.wait_ready(ready_timeout)


def service_pid(stack: EmbeddedStack, name: str) -> int:
    """The pid of one of the stack's running services (``brain``, ``server-pool``, ...)."""
    process = stack.service(name).process
    assert process is not None, f"{name} is not running"
    return process.pid


def stack_logs(stack: EmbeddedStack, lines: int = 15) -> str:
    return "\n".join(f"--- {s.name} ({s.log_path})\n{tail(s.log_path, lines)}" for s in stack.services)


def child_env(**extra: str) -> dict[str, str]:
    """Environment of a bench child process: this checkout importable as ``bench.*``."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}


@dataclass
class Child:
    """A child process in its own session, so stopping it also stops its own children
    (Celery prefork pool processes)."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path | None = None

    @classmethod
    def start(
        cls,
        name: str,
        argv: list[str],
        env: dict[str, str],
        log_path: Path | None = None,
        stdout: int | None = None,
        cwd: Path = ROOT,
    ) -> Child:
        out: Any = stdout
        log_file = None
        if log_path is not None:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            log_file = out = open(log_path, "ab")  # noqa: SIM115 - the child keeps its own copy
        try:
            proc = subprocess.Popen(
                argv,
                env=env,
                cwd=str(cwd),
                stdout=out,
                stderr=subprocess.STDOUT if log_path else None,
                start_new_session=True,
            )
        finally:
            if log_file is not None:
                log_file.close()
        return cls(name, proc, log_path)

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 20) -> str:
        return f"--- {self.name} ({self.log_path})\n{tail(self.log_path, lines)}"

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM the whole process group, SIGKILL it if it is still there after ``timeout``."""
        if self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(5)


def redis_server_version() -> str:
    from brain.stack.redis_server import find_redis_server

    try:
        out = subprocess.run(
            [find_redis_server(), "--version"], check=False, capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unknown ({exc})"
    # "Redis server v=6.2.14 sha=... malloc=... bits=64 build=..."
    for part in out.split():
        if part.startswith("v="):
            return part[2:]
    return out.strip() or "unknown"


def environment() -> dict[str, str]:
    """The machine and the versions the numbers depend on."""
    from importlib.metadata import PackageNotFoundError, version

    def ver(dist: str) -> str:
        try:
            return version(dist)
        except PackageNotFoundError:
            return "not installed"

    return {
        "cpus": str(os.cpu_count()),
        "machine": f"{platform.system()} {platform.release()} {platform.machine()}",
        "python": platform.python_version(),
        "celery": ver("celery"),
        "kombu": ver("kombu"),
        "redis-py": ver("redis"),
        "hiredis": ver("hiredis"),
        "redis-server": redis_server_version(),
        "mcp": ver("mcp"),
        "pydantic": ver("pydantic"),
        "sqlite": __import__("sqlite3").sqlite_version,
    }
