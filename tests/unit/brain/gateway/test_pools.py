"""Tool pools behind brain_specialized_cmd (brain.gateway.pools; seed 004): tables."""

from __future__ import annotations

from pathlib import Path

import pytest

from brain.core.models import Location
from brain.errors import ConfigError
from brain.gateway.catalog import GatewayTool
from brain.gateway.pools import (
    PoolConfig,
    build_pools,
    listing,
    load_tool_pools,
    pool_summary,
    resolve,
    search,
)
from brain.gateway.primary import LIST_POOLS, PRIMARY, SPECIALIZED_CMD


def tool(
    name: str, pool: str, action: str | None = None, available: bool = True, desc: str = ""
) -> GatewayTool:
    return GatewayTool(
        name=name, pool=pool, action=action or name.split(".")[-1], description=desc,
        location=Location.SERVER if available else Location.CLIENT, available=available,
    )  # fmt: skip


TOOLS = [
    tool("echo", "builtin", desc="Echo the value back"),
    tool("get_current_time", "time", desc="Current time in a timezone"),
    tool("convert_time", "time", desc="Convert a time between timezones"),
    tool("read_local_file", "native", available=False, desc="Reads a local file"),
    tool("git_log", "git", desc="Show the commit log"),
]


@pytest.mark.parametrize(
    ("max_tools", "pooled", "count"),
    [
        (40, False, len(PRIMARY) + 4),
        (len(PRIMARY) + 4, False, len(PRIMARY) + 4),
        (8, True, 7),
        (5, True, 5),
        (2, True, 2),
    ],
)
def test_the_list_is_flat_while_it_fits_else_primary_tools_and_the_router_tools(
    max_tools: int, pooled: bool, count: int
) -> None:
    shown = listing(TOOLS, max_tools)
    assert (shown.pooled, len(shown.tools)) == (pooled, count)
    names = [t.name for t in shown.tools]
    assert "read_local_file" not in names  # offline: not in the flat list
    if pooled:
        assert names[-2:] == [SPECIALIZED_CMD, LIST_POOLS]


def test_default_pools_are_one_per_mcp_server_builtin_native_and_brain() -> None:
    pools = build_pools(TOOLS)
    assert sorted(pools) == ["brain", "builtin", "git", "native", "time"]
    assert sorted(pools["time"].actions) == ["convert_time", "get_current_time"]
    assert "health" in pools["brain"].actions


def test_configured_pools_take_the_tools_their_patterns_match_first() -> None:
    configured = [
        PoolConfig(name="clock", description="time things", tools=["*_time"]),
        PoolConfig(name="empty", tools=["nothing"]),
    ]
    pools = build_pools(TOOLS, configured)
    assert sorted(pools["clock"].actions) == ["convert_time", "get_current_time"]
    assert "time" not in pools and pools["empty"].actions == {}


@pytest.mark.parametrize("pattern", ["time.*", "time/*"])  # the second written before the dot
def test_a_pool_pattern_on_a_server_matches_its_qualified_names_in_either_form(pattern: str) -> None:
    tools = [tool("time.get_current_time", "time", "get_current_time"), tool("other.time", "other", "time")]
    pools = build_pools(tools, [PoolConfig(name="clock", tools=[pattern])])
    assert list(pools["clock"].actions) == ["get_current_time"]


def test_actions_sharing_a_short_name_in_one_pool_are_named_in_full() -> None:
    pools = build_pools([tool("a.log", "mix", "log"), tool("b.log", "mix", "log")], [])
    assert sorted(pools["mix"].actions) == ["a.log", "b.log"]


@pytest.mark.parametrize(
    ("pool", "action", "expected"),
    [
        ("time", "convert_time", "convert_time"),
        ("time", "time.convert_time", None),  # not a name of it
        ("builtin", "echo", "echo"),
        ("nope", "echo", "unknown pool 'nope'; the pools are: brain, builtin, git, native, time"),
        ("time", "nope", "pool 'time' has no action 'nope'; its actions: convert_time, get_current_time"),
    ],
)
def test_resolve_finds_the_tool_or_names_the_known_pools_or_actions(
    pool: str, action: str, expected: str | None
) -> None:
    found = resolve(build_pools(TOOLS), pool, action)
    if expected is None:
        assert isinstance(found, str) and "has no action" in found
    elif isinstance(found, GatewayTool):
        assert found.name == expected
    else:
        assert found.startswith(expected)


def test_a_pool_whose_tools_sit_on_an_offline_client_says_so() -> None:
    pools = build_pools(TOOLS)
    assert (
        "offline" in pool_summary(pools["native"])
        and "its tools run on a workstation" in pool_summary(pools["native"])["offline"]
    )
    assert "offline" not in pool_summary(pools["time"])


@pytest.mark.parametrize(
    ("query", "found"),
    [
        ("time", ["convert_time", "get_current_time"]),
        ("convert TIMEZONES", ["convert_time"]),
        ("local file", ["read_local_file"]),
        ("zzz", []),
    ],
)
def test_search_finds_tools_holding_every_word(query: str, found: list[str]) -> None:
    assert [hit["tool"] for hit in search(build_pools(TOOLS), query)] == found


def test_tool_pools_load_from_the_top_level_array_of_vancetope_toml(tmp_path: Path) -> None:
    path = tmp_path / "vancetope.toml"
    assert load_tool_pools(path) == []
    path.write_text('[vancetope]\nuser = "demo"\n\n[[tool_pools]]\nname = "clock"\ntools = ["*_time"]\n')
    assert load_tool_pools(path) == [PoolConfig(name="clock", tools=["*_time"])]
    path.write_text('[[tool_pools]]\nname = "brain"\ntools = ["x"]\n[[tool_pools]]\nname = "b"\ntools = []\n')
    with pytest.raises(ConfigError) as err:
        load_tool_pools(path)
    assert "tool_pools.0.name" in str(err.value) and "tool_pools.1.tools" in str(err.value)
