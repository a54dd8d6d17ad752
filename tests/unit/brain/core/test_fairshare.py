"""Limits and priorities as data (brain.core.fairshare, workers.rates): what is read, what is
refused at load or submit, and which limits apply to a server run."""

from __future__ import annotations

from pathlib import Path
from textwrap import dedent

import pytest

from brain.config import Settings, load_settings
from brain.core.fairshare import (
    AppliedLimit,
    applied_limits,
    call_origin,
    call_priority,
    lane_id,
    pause_asked_by,
    priority_named,
    priority_source,
    queue_priority,
    user_limit,
    window_why,
)
from brain.core.models import Location, SessionKind, ToolSpec
from brain.core.treefile import load_registry, load_tree
from brain.errors import ConfigError, InvalidRegistry, InvalidTaskTree
from brain.runtime.registry import pool_limits
from workers.contracts import ErrorInfo, ToolType
from workers.mcp_config import parse_mcp_config
from workers.rates import Limits, rate_per_s


@pytest.mark.parametrize(
    ("text", "per_s"),
    [("10/s", 10.0), ("120/m", 2.0), ("3600/h", 1.0), (" 5 / s ", 5.0), ("0.5/s", 0.5)],
)
def test_rate_limits_read_as_calls_per_second(text: str, per_s: float) -> None:
    assert rate_per_s(text) == pytest.approx(per_s)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("ten per second", "is not a rate limit"),
        ("10", "is not a rate limit"),
        ("10/d", "is not a rate limit"),
        ("-1/s", "is not a rate limit"),
        ("0/s", "must allow at least some calls"),
        ("20000/s", "is over 10000/s"),
        ("1/h", None),
        (10, "write it as a string"),
    ],
)
def test_a_bad_rate_limit_on_a_tool_names_the_tool_and_the_field(
    tmp_path: Path, value: object, says: str | None
) -> None:
    path = tmp_path / "registry.yaml"
    shown = f'"{value}"' if isinstance(value, str) else value
    path.write_text(f"tools:\n  - name: fetch\n    location: server\n    rate_limit: {shown}\n")
    if says is None:
        assert load_registry(path)["fetch"].rate_limit == value
        return
    with pytest.raises(InvalidRegistry) as caught:
        load_registry(path)
    (line,) = caught.value.problems
    assert line.startswith("tool 'fetch': rate_limit: ") and says in line, line


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (0, "would let no call run"),
        (-3, "would let no call run"),
        ("2", "is not a number"),
        (True, "is not a number"),
    ],
)
def test_a_bad_cap_on_a_tool_names_the_tool_and_the_field(tmp_path: Path, value: object, says: str) -> None:
    path = tmp_path / "registry.yaml"
    shown = f'"{value}"' if isinstance(value, str) else str(value).lower()
    path.write_text(f"tools:\n  - name: fetch\n    location: server\n    max_concurrency: {shown}\n")
    with pytest.raises(InvalidRegistry) as caught:
        load_registry(path)
    (line,) = caught.value.problems
    assert line.startswith("tool 'fetch': max_concurrency: ") and says in line, line


def test_a_limit_on_a_client_only_tool_is_refused() -> None:
    with pytest.raises(ValueError, match="rate_limit applies to server runs"):
        ToolSpec(name="local", location=Location.CLIENT, rate_limit="1/s")


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ('"rate_limit": "ten per second"', "server 'jira': rate_limit: 'ten per second' is not a rate limit"),
        ('"max_concurrency": -1', "server 'jira': max_concurrency: -1 would let no call run"),
        ('"max_concurrency": 0', "server 'jira': max_concurrency: 0 would let no call run"),
        ('"rate_limit": "10/q"', "server 'jira': rate_limit: '10/q' is not a rate limit"),
        ('"rate_limits": "10/s"', "unknown key 'rate_limits' (did you mean 'rate_limit'?)"),
    ],
)
def test_a_bad_limit_on_an_mcp_server_skips_it_naming_the_server_and_the_field(entry: str, says: str) -> None:
    config = parse_mcp_config(f'{{"mcpServers": {{"jira": {{"command": "jira-mcp", {entry}}}}}}}', "mcp.json")
    assert "jira" not in config.servers
    assert says in config.skipped["jira"], config.skipped["jira"]


def test_limits_on_an_mcp_server_are_read() -> None:
    text = '{"mcpServers": {"jira": {"url": "https://jira.example/mcp", "rate_limit": "10/s", "max_concurrency": 4}}}'
    assert parse_mcp_config(text, "mcp.json").servers["jira"].limits == Limits(
        rate_limit="10/s", max_concurrency=4
    )


@pytest.mark.parametrize(
    ("pool", "says"),
    [
        ('{"name": "gpu", "rate_limit": "ten per second"}', "rate_limit"),
        ('{"name": "gpu", "max_concurrency": -2}', "max_concurrency"),
    ],
)
def test_a_bad_limit_on_a_pool_is_a_config_error_naming_the_field(
    tmp_path: Path, pool: str, says: str
) -> None:
    with pytest.raises(ConfigError, match=rf"pools\.0\.{says}: Value error, pool 'gpu': "):
        load_settings(env={"VANCETOPE_POOLS": f"[{pool}]"}, cwd=tmp_path)


@pytest.mark.parametrize(
    ("line", "says"),
    [
        (
            'server_rate_limit = "ten per second"',
            "server_rate_limit (the default pool): Value error, 'ten per",
        ),
        (
            "server_max_concurrency = -1",
            "server_max_concurrency (the default pool): Value error, -1 would let",
        ),
    ],
)
def test_a_bad_limit_on_the_default_pool_is_a_config_error_naming_it(
    tmp_path: Path, line: str, says: str
) -> None:
    (tmp_path / "vancetope.toml").write_text(f"[vancetope]\n{line}\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(env={}, cwd=tmp_path)
    assert says in str(caught.value)


def test_limits_on_the_default_pool_bound_its_runs(tmp_path: Path) -> None:
    settings = load_settings(
        env={"VANCETOPE_SERVER_RATE_LIMIT": "3/s", "VANCETOPE_SERVER_MAX_CONCURRENCY": "2"}, cwd=tmp_path
    )
    assert pool_limits(settings) == {"default": Limits(rate_limit="3/s", max_concurrency=2)}
    echo = ToolSpec.model_validate({"name": "echo", "location": "server"})
    (on_pool,) = applied_limits(echo, None, {}, pool_limits(settings))
    assert on_pool.described() == ["rate_limit 3/s of pool default", "max_concurrency 2 of pool default"]
    assert pool_limits(load_settings(env={}, cwd=tmp_path)) == {}


def test_limits_on_a_pool_are_read(tmp_path: Path) -> None:
    settings = load_settings(
        env={"VANCETOPE_POOLS": '[{"name": "gpu", "rate_limit": "2/s", "max_concurrency": 1}]'}, cwd=tmp_path
    )
    assert settings.pools[0].limits == Limits(rate_limit="2/s", max_concurrency=1)


@pytest.mark.parametrize(
    ("tree_priority", "task_priority", "expect"),
    [("high", "low", (8, 2)), ("normal", 9, (5, 9)), (0, None, (0, None)), (None, "HIGH", (None, 8))],
)
def test_priorities_read_as_numbers(
    tmp_path: Path, tree_priority: object, task_priority: object, expect: tuple[int | None, int | None]
) -> None:
    lines = ["id: t"] + ([f"priority: {tree_priority}"] if tree_priority is not None else [])
    lines += ["tasks:", "  - id: a", "    tool: echo"]
    lines += [f"    priority: {task_priority}"] if task_priority is not None else []
    path = tmp_path / "tree.yaml"
    path.write_text("\n".join(lines) + "\n")
    tree = load_tree(path)
    assert (tree.priority, tree.tasks[0].priority) == expect


@pytest.mark.parametrize(
    ("where", "value", "says"),
    [
        ("task", "urgent", "task 'a': priority: 'urgent' is not a priority"),
        ("task", 10, "task 'a': priority: 10 is not a priority"),
        ("task", -1, "task 'a': priority: -1 is not a priority"),
        ("tree", "asap", "priority: 'asap' is not a priority"),
    ],
)
def test_an_unknown_priority_is_refused_at_submit_naming_the_task(
    tmp_path: Path, where: str, value: object, says: str
) -> None:
    tree_line = f"priority: {value}\n" if where == "tree" else ""
    task_line = f"    priority: {value}\n" if where == "task" else ""
    path = tmp_path / "tree.yaml"
    path.write_text(dedent(f"id: t\n{tree_line}tasks:\n  - id: a\n    tool: echo\n{task_line}"))
    with pytest.raises(InvalidTaskTree) as caught:
        load_tree(path)
    assert any(says in p for p in caught.value.problems), caught.value.problems


def _tool(**kw: object) -> ToolSpec:
    return ToolSpec.model_validate({"name": "jira.search", "location": "server", **kw})


@pytest.mark.parametrize(
    ("tool", "pool", "servers", "pools", "keys"),
    [
        (_tool(), None, {}, {}, []),
        (_tool(rate_limit="5/s"), None, {}, {}, ["tool:jira.search"]),
        (
            _tool(type="mcp", mcp_server="jira", max_concurrency=2),
            "gpu",
            {"jira": Limits(rate_limit="10/s")},
            {"gpu": Limits(max_concurrency=1)},
            ["tool:jira.search", "server:jira", "pool:gpu"],
        ),
        # a built-in named like a server's tool is not that server's
        (_tool(), None, {"jira": Limits(rate_limit="10/s")}, {}, []),
        (_tool(), None, {}, {"default": Limits(rate_limit="1/s")}, ["pool:default"]),
    ],
)
def test_which_limits_apply_to_a_server_run(
    tool: ToolSpec, pool: str | None, servers: dict[str, Limits], pools: dict[str, Limits], keys: list[str]
) -> None:
    assert [limit.key for limit in applied_limits(tool, pool, servers, pools)] == keys


def test_a_paused_server_bounds_its_runs_even_with_no_limit_written() -> None:
    jira = _tool(type="mcp", mcp_server="jira")
    assert applied_limits(jira, None, {}, {}, paused={"server:other"}) == ()
    (pause,) = applied_limits(jira, None, {}, {}, paused={"server:jira"})
    assert (pause.key, pause.rate_limit, pause.max_concurrency) == ("server:jira", None, None)
    assert pause.described() == []
    # a server with limits of its own: its limit's key carries the pause, no second entry
    limited = applied_limits(jira, None, {"jira": Limits(rate_limit="10/s")}, {}, paused={"server:jira"})
    assert [limit.key for limit in limited] == ["server:jira"]
    http_get = ToolSpec.model_validate({"name": "http_get", "location": "server"})
    (on_tool,) = applied_limits(http_get, None, {}, {}, paused={"tool:http_get"})
    assert on_tool.key == "tool:http_get"


def test_a_paused_origin_bounds_the_calls_to_that_origin_only() -> None:
    http_get = ToolSpec.model_validate({"name": "http_get", "location": "server"})
    paused = {"origin:https://api.example.com:443"}
    busy = call_origin({"url": "HTTPS://API.example.com/v1/items?q=1"})
    assert busy == "https://api.example.com:443"
    (pause,) = applied_limits(http_get, None, {}, {}, paused, busy)
    assert (pause.scope, pause.name) == ("origin", "https://api.example.com:443")
    other = call_origin({"url": "https://api.example.com:8443/"})  # another port: another origin
    assert applied_limits(http_get, None, {}, {}, paused, other) == ()
    assert applied_limits(http_get, None, {}, {}, paused, None) == ()
    # an MCP server's tool is paused by its server, whatever URL its arguments name
    jira = _tool(type="mcp", mcp_server="jira")
    assert applied_limits(jira, None, {}, {}, paused, busy) == ()


@pytest.mark.parametrize(
    ("args", "origin"),
    [
        ({"url": "http://127.0.0.1:8080/x"}, "http://127.0.0.1:8080"),
        ({"url": "http://example.com"}, "http://example.com:80"),
        ({"url": "https://example.com./"}, "https://example.com:443"),
        ({"url": "https://[::1]:9/"}, "https://[::1]:9"),
        ({"url": "ftp://example.com/"}, None),
        ({"url": "https://example.com:99999/"}, None),  # not a port
        ({"url": "${tasks.a.result}"}, None),  # known at run time only
        ({"url": 5}, None),
        ({}, None),
    ],
)
def test_the_origin_a_calls_url_names(args: dict[str, object], origin: str | None) -> None:
    assert call_origin(args) == origin


def test_which_budget_a_429_pauses() -> None:
    def failed(**data: object) -> ErrorInfo:
        return ErrorInfo(type="ToolFailed", message="m", data=data)

    jira = failed(status=429, retry_after_s=2, server="jira")
    assert pause_asked_by("search", jira) == ("server:jira", 2.0)
    assert pause_asked_by("http_get", failed(status=429, retry_after_s=5)) == ("tool:http_get", 5.0)
    # http_get names the origin that answered: that site's calls are paused, not every http_get
    site = failed(status=429, retry_after_s=5, origin="https://api.example.com:443")
    assert pause_asked_by("http_get", site) == ("origin:https://api.example.com:443", 5.0)
    garbled = failed(status=429, retry_after_s=5, origin="not a url")
    assert pause_asked_by("http_get", garbled) == ("tool:http_get", 5.0)
    assert pause_asked_by("http_get", failed(status=429)) is None  # no Retry-After: the retry policy alone
    assert pause_asked_by("http_get", failed(status=429, retry_after_s=0)) is None
    assert pause_asked_by("http_get", failed(status=500, retry_after_s=5)) is None
    assert pause_asked_by("http_get", None) is None


def test_a_limit_is_described_by_its_name_and_where_it_is_written() -> None:
    limit = AppliedLimit("tool", "http_get", "5/s", 2)
    assert limit.described() == ["rate_limit 5/s of tool http_get", "max_concurrency 2 of tool http_get"]
    assert limit.per_s == 5.0
    assert ToolType.MCP  # the enum the server lookup keys on


def test_lanes_differ_by_pool_user_and_limits() -> None:
    a, b = AppliedLimit("tool", "x", "1/s", None), AppliedLimit("server", "s", None, 1)
    lanes = {
        lane_id(None, "ada", (a,)),
        lane_id("gpu", "ada", (a,)),
        lane_id(None, "bob", (a,)),
        lane_id(None, "ada", (a, b)),
    }
    assert len(lanes) == 4
    assert lane_id(None, "ada", (a,)) == lane_id("default", "ada", (a,))


@pytest.mark.parametrize(
    ("task", "tree", "session", "gateway_call", "expected"),
    [
        (None, None, SessionKind.AUTONOMOUS, False, 5),  # an autonomous run: normal
        (None, None, SessionKind.INTERACTIVE, False, 8),  # a person waits: high
        (None, None, SessionKind.AUTONOMOUS, True, 8),  # a gateway call: high
        (None, 2, SessionKind.INTERACTIVE, False, 2),  # the tree's word wins over the default
        (9, 2, SessionKind.AUTONOMOUS, False, 9),  # the task's over the tree's
    ],
)
def test_a_runs_priority(
    task: int | None, tree: int | None, session: SessionKind, gateway_call: bool, expected: int
) -> None:
    assert call_priority(task, tree, session, gateway_call) == expected


@pytest.mark.parametrize(
    ("task", "tree", "session", "gateway_call", "expected"),
    [
        (None, None, SessionKind.AUTONOMOUS, False, 5),  # a batch: normal
        (None, None, SessionKind.INTERACTIVE, False, 8),  # a person waits: ahead of batches
        (None, None, SessionKind.AUTONOMOUS, True, 8),  # a gateway call too
        (None, 8, SessionKind.AUTONOMOUS, False, 5),  # a batch that calls itself high: normal
        (9, None, SessionKind.INTERACTIVE, False, 8),  # up to the run's default: a person's high
        (None, 5, SessionKind.AUTONOMOUS, True, 5),  # a gateway call may ask for less
        (None, 2, SessionKind.AUTONOMOUS, False, 2),  # low delays only its writer: kept
        (2, 9, SessionKind.AUTONOMOUS, False, 2),  # the task's over the tree's
    ],
)
def test_a_calls_place_in_the_pools_queue_with_fair_share_off(
    task: int | None, tree: int | None, session: SessionKind, gateway_call: bool, expected: int
) -> None:
    assert queue_priority(task, tree, session, gateway_call) == expected


def test_a_runs_priority_says_where_it_comes_from_and_its_word() -> None:
    assert priority_source(None, None, SessionKind.AUTONOMOUS, True) == (8, "the default of a gateway call")
    assert priority_source(None, 2, SessionKind.INTERACTIVE, False) == (
        2,
        "set on the tree (or by its schedule)",
    )
    assert priority_source(7, 2, SessionKind.AUTONOMOUS, False) == (7, "set on the task")
    assert [priority_named(p) for p in (2, 5, 8, 7)] == ["low (2)", "normal (5)", "high (8)", "7"]


def test_fair_share_settings_are_read_and_bad_ones_name_the_field(tmp_path: Path) -> None:
    (tmp_path / "vancetope.toml").write_text(
        dedent(
            """
            [vancetope]
            queue_window = 64
            max_in_flight_per_user = 100

            [vancetope.users.ada]
            weight = 3
            """
        )
    )
    fair = load_settings(env={}, cwd=tmp_path).fairness
    assert (fair.on, fair.queue_window, fair.max_in_flight_per_user) == (True, 64, 100)
    assert (fair.weight("ada"), fair.weight("bob"), fair.weight(None)) == (3, 1, 1)
    assert not Settings().fairness.on  # off unless asked: the plain path stays as fast as it was
    with pytest.raises(ConfigError, match=r"users\.ada\.weight"):
        load_settings(env={"VANCETOPE_USERS": '{"ada": {"weight": 0}}'}, cwd=tmp_path)
    with pytest.raises(ConfigError, match="max_in_flight_per_user"):
        load_settings(env={"VANCETOPE_MAX_IN_FLIGHT_PER_USER": "0"}, cwd=tmp_path)
    with pytest.raises(ConfigError, match="queue_window"):
        load_settings(env={"VANCETOPE_QUEUE_WINDOW": "-1"}, cwd=tmp_path)


def test_with_fair_share_a_lane_is_one_tree_at_one_priority() -> None:
    assert lane_id(None, "ada", (), tree="t1", priority=5) != lane_id(None, "ada", (), tree="t2", priority=5)
    assert lane_id(None, "ada", (), tree="t1", priority=5) != lane_id(None, "ada", (), tree="t1", priority=8)
    cap = user_limit("crawl", "ada", 4)
    assert cap.key == "user:ada@crawl"
    assert cap.described() == ["max_in_flight_per_user 4 of user ada on pool crawl"]
    assert window_why(32, None) == "queue_window 32 of pool default" and window_why(0, None) == ""


def test_a_schedule_may_say_priority_low(tmp_path: Path) -> None:
    (tmp_path / "tree.yaml").write_text("id: nightly\ntasks:\n  - id: a\n    tool: echo\n")
    (tmp_path / "vancetope.toml").write_text(
        '[[schedules]]\nname = "nightly"\ntree = "tree.yaml"\nevery_s = 60\npriority = "low"\n'
    )
    (schedule,) = load_settings(env={}, cwd=tmp_path).schedules
    assert schedule.priority == 2
    (tmp_path / "vancetope.toml").write_text(
        '[[schedules]]\nname = "nightly"\ntree = "tree.yaml"\nevery_s = 60\npriority = "urgent"\n'
    )
    with pytest.raises(ConfigError, match="'urgent' is not a priority"):
        load_settings(env={}, cwd=tmp_path)
