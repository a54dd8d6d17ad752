"""Run every benchmark and print one table of ratios against baselines measured in this run.

    python bench/run.py [--quick] [--only NAME ...] [--json FILE]

Ratios always read "Vancetope's cost / the baseline's cost" (> 1: Vancetope is slower
or costlier): for time or bytes per unit of work that is vancetope/baseline, for a rate
(tasks/s, refs/s) baseline/vancetope - the same thing in cost terms.
Nothing is compared with a fixed threshold - a slow machine changes both columns.
Exit status: 0 when every benchmark produced its numbers, 1 if one crashed.
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

# `python bench/run.py` puts bench/ itself on sys.path; the benchmarks import as bench.*.
ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from rich.console import Console
from rich.table import Table

from bench import (
    chain,
    client_rt,
    cpu,
    fair_share,
    fan_in,
    fan_out,
    fleet,
    growth,
    mcp_call,
    requeue,
    scale_out,
    throughput,
    wan,
)
from bench.common import Row, environment, scrub_vancetope_env

BENCHMARKS: dict[str, Callable[[bool], list[Row]]] = {
    "throughput": throughput.run,
    "chain": chain.run,
    "growth": growth.run,
    "fan_in": fan_in.run,
    "fan_out": fan_out.run,
    "client": client_rt.run,
    "wan": wan.run,
    "requeue": requeue.run,
    "scale_out": scale_out.run,
    "mcp": mcp_call.run,
    "cpu": cpu.run,
    "fleet": fleet.run,
    "fair_share": fair_share.run,
}


def fmt(value: float) -> str:
    if math.isnan(value) or math.isinf(value):
        return str(value)
    if value >= 1000:
        return f"{value:,.0f}"
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def fmt_ratio(ratio: float) -> str:
    if math.isnan(ratio) or math.isinf(ratio):
        return str(ratio)
    return f"{ratio:.3f}×" if ratio < 0.1 else f"{ratio:.2f}×"


def table(rows: list[Row], title: str) -> Table:
    t = Table(title=title, title_justify="left", caption=RATIO_LEGEND, caption_justify="left")
    t.add_column("benchmark", style="bold", max_width=28)
    t.add_column("unit")
    t.add_column("baseline", justify="right")
    t.add_column("vancetope", justify="right")
    t.add_column("ratio", justify="right")
    t.add_column("goal", justify="right")
    t.add_column("baseline is / notes", overflow="fold")
    for row in rows:
        t.add_row(
            row.benchmark,
            row.metric,
            fmt(row.baseline),
            fmt(row.vancetope),
            fmt_ratio(row.ratio),
            _goal(row),
            f"[italic]{row.baseline_label}[/italic]. {row.notes}",
        )
    return t


def _goal(row: Row) -> str:
    if row.goal is None:
        return "-"
    if math.isnan(row.ratio):
        return f"≤ {row.goal:g} ?"
    return f"≤ {row.goal:g} " + ("[green]met[/green]" if row.ratio <= row.goal else "[red]missed[/red]")


RATIO_LEGEND = (
    "ratio: always Vancetope's cost / the baseline's cost (for a rate such as tasks/s that is "
    "baseline/vancetope): > 1 means Vancetope costs more (is slower), < 1 less. goal: the issue's bound "
    "on that ratio; '-' = reported without a goal; nan = not measured, the notes say why."
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="smaller runs (about a third of the time)")
    parser.add_argument(
        "--only",
        nargs="+",
        choices=sorted(BENCHMARKS),
        metavar="NAME",
        help=f"run only these: {', '.join(BENCHMARKS)}",
    )
    parser.add_argument("--json", metavar="FILE", type=Path, help="also write the rows as a JSON list")
    args = parser.parse_args(argv)
    # SIGTERM (a CI timeout, `kill`) must unwind like Ctrl-C does, so every benchmark's
    # finally block stops its workers and redis-server instead of leaving them behind.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    scrub_vancetope_env()
    # Wide enough for the notes even when piped (rich would assume 80 columns).
    console = Console(width=max(Console().width, 150))

    env = environment()
    console.print("[bold]machine / versions[/bold]: " + ", ".join(f"{k} {v}" for k, v in env.items()))
    started = time.monotonic()
    rows: list[Row] = []
    crashed: list[str] = []
    for name, bench in BENCHMARKS.items():
        if args.only and name not in args.only:
            continue
        t0 = time.monotonic()
        with console.status(f"running {name}{' (quick)' if args.quick else ''} ..."):
            try:
                got = bench(args.quick)
            except Exception:  # noqa: BLE001 - report it, run the others, exit 1 at the end
                crashed.append(name)
                console.print(f"[red]{name} crashed[/red]:\n{traceback.format_exc()}")
                continue
        rows.extend(got)
        console.print(f"{name}: done in {time.monotonic() - t0:.1f}s")

    title = (
        f"Vancetope vs baselines measured in this run ({'quick' if args.quick else 'full'}, "
        f"{time.strftime('%Y-%m-%d %H:%M')}, {time.monotonic() - started:.0f}s) — "
        "ratio > 1: Vancetope slower"
    )
    console.print(table(rows, title))
    if args.json is not None:
        doc = [{**row.to_json(), "quick": args.quick} for row in rows]
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
        console.print(f"rows written to {args.json}")
    if crashed:
        console.print(f"[red]crashed: {', '.join(crashed)}[/red]")
        return 1
    return 0


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    sys.exit(main())
