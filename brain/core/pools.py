"""Named server pools (layer: brain/core; pure).

A server pool is a set of server workers consuming one queue: the default pool consumes
``server`` and its size is ``server_concurrency``; each ``[[pools]]`` table of
``vancetope.toml`` adds a named pool consuming ``server.<name>`` (``workers.contracts``).
A task's server run goes to the first pool named by, in this order: the task (``pool:``),
its tool (registry ``pool:``), the tree (``pool:``); else to the default pool. The most
specific wins: a task can move one call, a tool says what it needs (a GPU, a licence),
a tree only says where its work goes unless told otherwise.

Here: the pool's config model, the words for a route, and the validation of the pool names
a tree or a registry uses against the configured ones.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_validator,
)

from brain.core.models import TaskTree, ToolSpec
from workers.contracts import DEFAULT_POOL, SERVER_QUEUE, check_pool_name, pool_queue
from workers.rates import Concurrency, Limits, RateLimitText


class PoolSpec(BaseModel):
    """One ``[[pools]]`` table: a named server pool and its worker processes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    # Celery worker processes of `vancetope worker --pool NAME` (and of `vancetope up`'s one).
    concurrency: int = Field(default=2, ge=1, le=64)
    # Every run on this pool, across all its workers (docs/fair-share.md): "10/s", and a cap.
    rate_limit: RateLimitText = None
    max_concurrency: Concurrency = None

    @field_validator("rate_limit", "max_concurrency", mode="wrap")
    @classmethod
    def _named(cls, value: Any, handler: ValidatorFunctionWrapHandler, info: ValidationInfo) -> Any:
        # A bad limit names the pool, not only its index: "pools.0.max_concurrency: Value
        # error, pool 'crawl': -1 would let no call run …" (the name is validated first).
        try:
            return handler(value)
        except ValidationError as exc:
            name = info.data.get("name")
            if not isinstance(name, str):
                raise
            problems = "; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors())
            raise ValueError(f"pool {name!r}: {problems}") from None

    @field_validator("name")
    @classmethod
    def _valid_name(cls, v: str) -> str:
        if v == DEFAULT_POOL:
            raise ValueError(
                f"{DEFAULT_POOL!r} is the default pool (queue {SERVER_QUEUE!r}); set its size with "
                "server_concurrency in [vancetope], and give a named pool another name"
            )
        return check_pool_name(v)

    @property
    def queue(self) -> str:
        return pool_queue(self.name)

    @property
    def limits(self) -> Limits:
        return Limits(rate_limit=self.rate_limit, max_concurrency=self.max_concurrency)


def check_unique(pools: tuple[PoolSpec, ...]) -> tuple[PoolSpec, ...]:
    """``pools`` when no name is given twice; else ValueError naming it."""
    seen: set[str] = set()
    for pool in pools:
        if pool.name in seen:
            raise ValueError(f"pool {pool.name!r} is defined twice; keep one [[pools]] table per name")
        seen.add(pool.name)
    return pools


def pool_route(pool: str | None) -> str:
    """The route summary of a server run: ``server`` on the default pool, ``server:<pool>``."""
    return "server" if pool in (None, DEFAULT_POOL) else f"server:{pool}"


def known_pools(named: Collection[str]) -> str:
    """The configured pools in words, the default first."""
    return ", ".join([DEFAULT_POOL, *sorted(named)])


def unknown_pool(pool: str, named: Collection[str], who: str = "") -> str:
    """Why ``pool`` cannot be used, and what to do; ``who``: who names it (``tool 'x'``)."""
    subject = f"{who} names pool {pool!r}, which" if who else f"pool {pool!r}"
    return (
        f"{subject} is not configured (pools: {known_pools(named)}); add a [[pools]] table with "
        f'name = "{pool}" to vancetope.toml, or name a configured pool'
    )


def is_known(pool: str | None, named: Collection[str]) -> bool:
    return pool is None or pool == DEFAULT_POOL or pool in named


def tree_pool_problems(tree: TaskTree, registry: Mapping[str, ToolSpec], named: Collection[str]) -> list[str]:
    """One line per pool name in ``tree`` (its own, its tasks', its tools') that is not configured."""
    problems = []
    if not is_known(tree.pool, named):
        assert tree.pool is not None
        problems.append(f"pool: {unknown_pool(tree.pool, named)}")
    for task in tree.tasks:
        if not is_known(task.pool, named):
            assert task.pool is not None
            problems.append(f"task {task.id!r}: {unknown_pool(task.pool, named)}")
        for name in dict.fromkeys([task.tool, *task.tools]):
            spec = registry.get(name)
            if spec is not None and not is_known(spec.pool, named):
                assert spec.pool is not None
                problems.append(f"task {task.id!r}: {unknown_pool(spec.pool, named, f'tool {name!r}')}")
    return problems


def registry_pool_problems(tools: Mapping[str, ToolSpec], named: Collection[str]) -> list[str]:
    """One line per registry tool whose ``pool`` is not configured."""
    return [
        unknown_pool(spec.pool, named, f"tool {name!r}")
        for name, spec in sorted(tools.items())
        if spec.pool is not None and not is_known(spec.pool, named)
    ]
