"""Every Redis script of the project compiles on a real redis-server, and is loaded by name."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from workers.scripts import lua

ROOT = Path(__file__).resolve().parents[3]
SCRIPTS = sorted(p for pkg in ("brain", "workers", "client_agent") for p in (ROOT / pkg).glob("**/lua/*.lua"))


def package_of(path: Path) -> str:
    return ".".join(path.parent.parent.relative_to(ROOT).parts)


def test_there_are_scripts_to_check_and_none_is_the_workers() -> None:
    # Only the brain runs scripts: a client agent's Redis user may run none (issue 20, H3), and
    # what workers do atomically is a MULTI/EXEC (workers.tasks.HotState.begin_run).
    assert {package_of(p) for p in SCRIPTS} == {"brain.hot"}


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: f"{package_of(p)}/{p.name}")
def test_each_script_compiles_in_redis(path: Path, redis_client: redis.Redis) -> None:
    text = lua(package_of(path), path.stem)
    assert text == path.read_text(encoding="utf-8")
    sha = redis_client.script_load(text)  # SCRIPT LOAD compiles; a syntax error raises here
    assert redis_client.script_exists(sha) == [True]
