"""What `explain` says bounds each server task (brain.cli.explain_limits): its priority and
where it comes from, its limits, and with fair share on its user's weight and cap."""

from __future__ import annotations

from brain.cli.explain_limits import limit_lines
from brain.core.fairshare import Fairness
from brain.core.models import SessionKind, TaskSpec, TaskTree, ToolSpec
from brain.core.routing import Route, RouteKind
from brain.core.snapshot import RegistrySnapshot
from workers.rates import Limits

OFF_NOTE = (
    "Fair share is off (queue_window 0): priorities order nothing, and no user weight "
    "or max_in_flight_per_user applies (docs/fair-share.md#fair-share-across-users)."
)


def _tool(name: str, **kw: object) -> ToolSpec:
    return ToolSpec.model_validate({"name": name, "location": "server", **kw})


REGISTRY = RegistrySnapshot(
    tools={"http_get": _tool("http_get", rate_limit="5/s"), "echo": _tool("echo")},
    pool_limits={"gpu": Limits(max_concurrency=1)},
)


def _routes(tree: TaskTree) -> list[tuple[TaskSpec, Route]]:
    pools = {"b": "gpu"}
    return [
        (spec, Route(kind=RouteKind.SERVER, tool=spec.tool, reason="", pool=pools.get(spec.id)))
        for spec in tree.tasks
    ]


def _tree(priority: str | None = None, **task_priority: str) -> TaskTree:
    tools = {"a": "http_get", "b": "echo", "c": "echo"}
    tasks = [
        {"id": i, "tool": tool, **({"priority": task_priority[i]} if i in task_priority else {})}
        for i, tool in tools.items()
    ]
    return TaskTree.model_validate(
        {"id": "t", "tasks": tasks, **({"priority": priority} if priority else {})}
    )


def test_with_fair_share_off_each_task_has_its_default_priority_and_its_limits() -> None:
    tree = _tree()
    assert limit_lines(tree, _routes(tree), REGISTRY, {}) == [
        "task a: priority normal (5), the default of an autonomous run",
        "task a: limits: rate_limit 5/s of tool http_get",
        "task b: priority normal (5), the default of an autonomous run",
        "task b: limits: max_concurrency 1 of pool gpu",
        "task c: priority normal (5), the default of an autonomous run",
        OFF_NOTE,
    ]
    interactive = limit_lines(tree, _routes(tree), REGISTRY, {}, session=SessionKind.INTERACTIVE)
    assert interactive[0] == "task a: priority high (8), the default of an interactive session"


def test_a_paused_budget_is_named_beside_the_limits_even_where_none_is_written() -> None:
    tree = _tree()
    why = "paused by HTTP 429 from tool echo (Retry-After 5s) until 18:49:25"
    assert limit_lines(tree, _routes(tree), REGISTRY, {"tool:echo": why})[3:6] == [
        f"task b: limits: max_concurrency 1 of pool gpu, {why}",
        "task c: priority normal (5), the default of an autonomous run",
        f"task c: limits: {why}",
    ]


def test_with_fair_share_on_the_users_weight_and_cap_apply_to_each_server_task() -> None:
    tree = _tree("low", c="high")
    fair = Fairness(queue_window=32, max_in_flight_per_user=200, weights={"ada": 3})
    assert limit_lines(tree, _routes(tree), REGISTRY, {}, fairness=fair, user="ada") == [
        (
            "task a: priority low (2), set on the tree (or by its schedule); "
            "fair share of pool default as user ada: weight 3, queue_window 32"
        ),
        (
            "task a: limits: rate_limit 5/s of tool http_get, "
            "max_in_flight_per_user 200 of user ada on pool default"
        ),
        (
            "task b: priority low (2), set on the tree (or by its schedule); "
            "fair share of pool gpu as user ada: weight 3, queue_window 32"
        ),
        "task b: limits: max_concurrency 1 of pool gpu, max_in_flight_per_user 200 of user ada on pool gpu",
        (
            "task c: priority high (8), set on the task; "
            "fair share of pool default as user ada: weight 3, queue_window 32"
        ),
        "task c: limits: max_in_flight_per_user 200 of user ada on pool default",
    ]
    # A user named in no [vancetope.users.NAME] table has weight 1; no cap: no cap line.
    bob = limit_lines(tree, _routes(tree), REGISTRY, {}, fairness=Fairness(queue_window=8), user="bob")
    assert bob[-1] == (
        "task c: priority high (8), set on the task; fair share of pool default as user bob: "
        "weight 1, queue_window 8"
    )


def test_a_task_routed_to_a_client_gets_no_line() -> None:
    tree = _tree()
    routes = [
        (spec, Route(kind=RouteKind.CLIENT, tool=spec.tool, reason="", client_id="laptop"))
        for spec in tree.tasks
    ]
    assert limit_lines(tree, routes, REGISTRY, {}) == []
