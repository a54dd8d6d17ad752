"""Fixtures of the runtime's unit tests: a rig (tests/unit/brain/runtime/rig.py) per test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.unit.brain.runtime.rig import Rig, make_rig


@pytest.fixture
def rigs(tmp_path: Path, redis_client: redis.Redis) -> Iterator[Callable[..., Rig]]:
    """Make a rig with these settings (its store closed after the test)."""
    made: list[Iterator[Rig]] = []

    def make(**settings: Any) -> Rig:
        made.append(make_rig(tmp_path, redis_client, **settings))
        return next(made[-1])

    yield make
    for gen in made:
        next(gen, None)


@pytest.fixture
def rig(rigs: Callable[..., Rig]) -> Rig:
    return rigs()
