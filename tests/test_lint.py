"""The house style is part of the suite: ruff clean everywhere, mypy clean on the packages."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *argv], cwd=ROOT, capture_output=True, text=True, check=False, timeout=600
    )


def test_ruff_finds_nothing() -> None:
    proc = run("ruff", "check", "brain", "workers", "client_agent", "vancetope", "tests", "bench", "agent")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy_finds_nothing_in_the_packages_and_the_benchmarks() -> None:
    # bench/ too: its rows import the packages' internals, and a type error there hid for a week.
    proc = run("mypy", "brain", "workers", "client_agent", "vancetope", "bench")
    assert proc.returncode == 0, proc.stdout + proc.stderr
