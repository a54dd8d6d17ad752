"""Pool selection as a table: task > tool > tree > default, on every way to the server."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from brain.core.models import ExecutionTarget, SessionKind, ToolSpec
from brain.core.routing import (
    ClientView,
    Engine,
    Presence,
    RouteKind,
    RouteRequest,
    decide_route,
    route_without_presence,
)

SERVER, CLIENT, PENDING, FAIL = RouteKind.SERVER, RouteKind.CLIENT, RouteKind.PENDING_CLIENT, RouteKind.FAIL
POOLS = frozenset({"gpu", "io"})


def _spec(name: str, location: str, **fields: Any) -> ToolSpec:
    return ToolSpec.model_validate({"name": name, "location": location, **fields})


REGISTRY: dict[str, ToolSpec] = {
    s.name: s
    for s in [
        _spec("echo", "server"),
        _spec("train", "server", pool="gpu"),
        _spec("render", "both", pool="gpu"),
        _spec("render_local", "both", prefer="client", pool="gpu"),
        _spec("on_default", "server", pool="default"),
        _spec("lost_pool", "server", pool="gone"),
        _spec("local_note", "client", offline_strategy="fallback", fallback_tool="train"),
        _spec("local_plain", "client", offline_strategy="fallback", fallback_tool="echo"),
        _spec("read_local_file", "client"),
    ]
}
NOBODY = Presence(user="ada")
CONNECTED = Presence(
    user="ada",
    clients=(ClientView(client_id="laptop", user="ada", tools=frozenset({"render_local", "local_note"})),),
)


@dataclass(frozen=True)
class Row:
    why: str
    tool: str
    kind: RouteKind
    pool: str | None  # Route.pool
    summary: str
    task_pool: str | None = None
    tree_pool: str | None = None
    presence: Presence = NOBODY
    target: ExecutionTarget = ExecutionTarget.AUTO
    engine: Engine | None = None
    reason_has: str = ""

    def __str__(self) -> str:
        return self.why


# fmt: off
TABLE = [
    Row("no pool anywhere: the default pool, route 'server'", "echo", SERVER, None, "server"),
    Row("the tool names its pool", "train", SERVER, "gpu", "server:gpu",
        reason_has=", on pool 'gpu' (named by tool 'train')"),
    Row("the tree names a pool for tools that name none", "echo", SERVER, "io", "server:io", tree_pool="io",
        reason_has="(named by the tree)"),
    Row("the tool's pool wins over the tree's", "train", SERVER, "gpu", "server:gpu", tree_pool="io"),
    Row("the task's pool wins over the tool's", "train", SERVER, "io", "server:io", task_pool="io",
        tree_pool="gpu", reason_has="(named by the task)"),
    Row("a task naming 'default' sends a pooled tool to the default pool", "train", SERVER, None, "server",
        task_pool="default"),
    Row("a tool naming 'default' wins over the tree's pool", "on_default", SERVER, None, "server",
        tree_pool="io"),
    Row("pinned to the server: the pool still applies", "train", SERVER, "gpu", "server:gpu",
        target=ExecutionTarget.SERVER),
    Row("a both tool on the server side runs on its pool", "render", SERVER, "gpu", "server:gpu"),
    Row("a both tool preferring a connected client runs there: no pool", "render_local", CLIENT, None,
        "client:laptop", presence=CONNECTED),
    Row("a both tool whose client is away falls back to its pool", "render_local", SERVER, "gpu",
        "server:gpu", reason_has="Fallback to Server"),
    Row("a fallback_tool runs on its own pool", "local_note", SERVER, "gpu", "server:gpu",
        reason_has="calling fallback_tool 'train'"),
    Row("a fallback_tool naming no pool takes the tree's", "local_plain", SERVER, "io", "server:io",
        tree_pool="io"),
    Row("the task's pool applies to its fallback too", "local_note", SERVER, "io", "server:io", task_pool="io"),
    Row("a client route has no pool, whatever the tree says", "local_note", CLIENT, None, "client:laptop",
        tree_pool="io", presence=CONNECTED),
    Row("a parked call has no pool", "read_local_file", PENDING, None, "pending_client", tree_pool="io"),
    Row("an unconfigured pool on the task fails, naming the pools", "echo", FAIL, None, "fail",
        task_pool="tpu",
        reason_has="the task names pool 'tpu', which is not configured (pools: default, gpu, io); add a [[pools]] "
                   'table with name = "tpu" to vancetope.toml'),
    Row("an unconfigured pool on the tool fails", "lost_pool", FAIL, None, "fail",
        reason_has="tool 'lost_pool' names pool 'gone', which is not configured"),
    Row("an unconfigured pool on the tree fails", "echo", FAIL, None, "fail", tree_pool="gone",
        reason_has="the tree names pool 'gone'"),
    Row("an unconfigured pool of a client route does not matter", "read_local_file", PENDING, None,
        "pending_client", task_pool="gone"),
]
# fmt: on


def _request(row: Row) -> RouteRequest:
    return RouteRequest(
        tool=row.tool,
        execution_target=row.target,
        session=SessionKind.AUTONOMOUS,
        engine=row.engine,
        pool=row.task_pool,
        tree_pool=row.tree_pool,
        pools=POOLS,
    )


@pytest.mark.parametrize("row", TABLE, ids=str)
def test_pool_of_a_route(row: Row) -> None:
    route = decide_route(_request(row), REGISTRY, row.presence)
    assert (route.kind, route.pool, route.summary) == (row.kind, row.pool, row.summary), route.reason
    assert row.reason_has in route.reason
    if route.kind is SERVER:
        assert route.queue == ("server" if row.pool is None else f"server.{row.pool}")


@pytest.mark.parametrize("row", TABLE, ids=str)
def test_a_pooled_route_known_without_presence_is_the_same_under_presence(row: Row) -> None:
    route = route_without_presence(_request(row), REGISTRY)
    if route is not None:
        assert route == decide_route(_request(row), REGISTRY, row.presence)


def test_without_configured_pools_any_named_pool_fails_but_default_routes() -> None:
    request = RouteRequest(tool="train")
    assert decide_route(request, REGISTRY, NOBODY).kind is FAIL
    assert decide_route(RouteRequest(tool="on_default"), REGISTRY, NOBODY).summary == "server"
