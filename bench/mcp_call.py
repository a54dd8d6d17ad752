"""MCP call latency: a kept-alive session (what the server pool does) vs spawning per call.

Both call ``get_current_time {"timezone": "UTC"}`` on the real ``mcp-server-time``
through ``workers.mcp_clients.MCPClientManager``:

- Vancetope: one manager for the process, as ``get_manager`` keeps per worker
  process; the server is spawned once (its spawn + initialize time is reported in the
  notes), warmed with a few calls, then ``calls`` calls are timed one by one.
- Baseline: a fresh manager per call - spawn the server, initialize, list tools, call -
  the cost a worker would pay without kept-alive sessions. Few iterations (each ~1 s);
  closing the manager (the server's shutdown) is not in the timed part.

With only a handful of spawn samples their p99 is simply the slowest one.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from bench.common import BIN_DIR, BenchError, Row, percentile
from workers.mcp_clients import MCPClientManager
from workers.mcp_config import MCPConfig, load_mcp_config

NAME = "mcp call"
SERVER = "time"
TOOL = "get_current_time"
ARGS = {"timezone": "UTC"}
CALL_TIMEOUT_S = 30.0


def time_server_config(path: Path) -> MCPConfig:
    exe = shutil.which("mcp-server-time", path=os.pathsep.join([str(BIN_DIR), os.environ.get("PATH", "")]))
    if exe is None:
        raise BenchError("mcp-server-time is not installed (pip install mcp-server-time)")
    path.write_text(
        json.dumps({"mcpServers": {SERVER: {"command": exe, "args": ["--local-timezone", "UTC"]}}})
    )
    return load_mcp_config(path)


def call_once(manager: MCPClientManager) -> None:
    value = manager.call_tool(SERVER, TOOL, ARGS, timeout=CALL_TIMEOUT_S)
    if not isinstance(value, dict) or "datetime" not in value:
        raise BenchError(f"unexpected {TOOL} result: {value!r}")


def run(quick: bool = False) -> list[Row]:
    calls = 50 if quick else 300
    spawns = 3 if quick else 5
    with tempfile.TemporaryDirectory(prefix="vancetope-bench-") as tmp:
        config = time_server_config(Path(tmp) / "mcp.json")

        kept: list[float] = []
        manager = MCPClientManager(config)
        try:
            t0 = time.perf_counter()
            manager.connect(SERVER)
            first_spawn = time.perf_counter() - t0
            for _ in range(5):
                call_once(manager)
            for _ in range(calls):
                t0 = time.perf_counter()
                call_once(manager)
                kept.append(time.perf_counter() - t0)
        finally:
            manager.close()

        spawned: list[float] = []
        closes: list[float] = []
        for _ in range(spawns):
            fresh = MCPClientManager(config)
            try:
                t0 = time.perf_counter()
                call_once(fresh)
                spawned.append(time.perf_counter() - t0)
            finally:
                t1 = time.perf_counter()
                fresh.close()
                closes.append(time.perf_counter() - t1)

    rows = []
    for pct in (50, 99):
        base_ms = percentile(spawned, pct) * 1000
        vt_ms = percentile(kept, pct) * 1000
        rows.append(
            Row(
                benchmark=f"{NAME} p{pct} ({TOOL})",
                metric="ms",
                baseline=base_ms,
                vancetope=vt_ms,
                kind="latency",
                baseline_label="spawn server per call",
                notes=(
                    f"kept-alive: {calls} calls, one spawn+init {first_spawn * 1000:.0f} ms; "
                    f"spawn-per-call: {spawns} calls, close {statistics.median(closes) * 1000:.0f} ms each "
                    "(not timed)"
                )
                if pct == 50
                else f"p99 of {spawns} spawns = the slowest",
            )
        )
    return rows


if __name__ == "__main__":
    for row in run(quick=True):
        print(row, f"ratio {row.ratio:.3f} ({row.ratio_formula})")
