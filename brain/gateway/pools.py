"""Tool pools behind one router tool (layer: brain/gateway, pure; seed 004).

MCP clients take a limited number of tools (Cursor ~40, VS Code 128). When a user's catalog
is longer than ``gateway_max_tools``, ``tools/list`` holds the primary tools that fit and two
router tools instead: ``brain_specialized_cmd(pool, action, params)`` and ``brain_list_pools``.
Pools by default: one per MCP server (named after it), ``builtin`` and ``native``, and
``brain`` for the primary tools; ``[[tool_pools]]`` in vancetope.toml defines others (a tool
goes to the first configured pool one of whose patterns matches its name).
"""

from __future__ import annotations

import fnmatch
import tomllib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from brain.core.models import ID_BODY
from brain.errors import ConfigError
from brain.gateway.catalog import GatewayTool
from brain.gateway.primary import BRAIN_POOL, PRIMARY, ROUTER
from workers.toolnames import LEGACY_SEPARATOR, qualified

_POOL_NAME = rf"^{ID_BODY}$"


class PoolConfig(BaseModel):
    """One ``[[tool_pools]]`` entry of vancetope.toml."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=_POOL_NAME, max_length=64)
    description: str = ""
    # Tool names or fnmatch patterns ("time.*", "git_*") of the tools this pool holds; a
    # pattern written before the dot ("time/*") still matches (``_matches``).
    tools: list[str] = Field(min_length=1)

    @field_validator("name")
    @classmethod
    def _not_brain(cls, value: str) -> str:
        if value == BRAIN_POOL:
            raise ValueError(f"{BRAIN_POOL!r} is the pool of the gateway's own tools; pick another name")
        return value


class Pool(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str = ""
    actions: dict[str, GatewayTool] = Field(default_factory=dict)

    @property
    def offline(self) -> list[str]:
        """Its actions whose tool runs only on a workstation none of the user's clients offers now."""
        return [action for action, tool in self.actions.items() if not tool.available]


class Listing(BaseModel):
    """What tools/list shows: the catalog itself, or the pooled form."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tools: list[GatewayTool]
    pooled: bool


def load_tool_pools(path: Path) -> list[PoolConfig]:
    """The top-level ``[[tool_pools]]`` array of a vancetope.toml (none when the file is absent)."""
    if not path.is_file():
        return []
    try:
        raw = tomllib.loads(path.read_text()).get("tool_pools", [])
        return TypeAdapter(list[PoolConfig]).validate_python(raw)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    except ValidationError as exc:
        lines = [f"tool_pools.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()]
        raise ConfigError(f"{path}: invalid [[tool_pools]]:\n  " + "\n  ".join(lines)) from exc


def listing(tools: Sequence[GatewayTool], max_tools: int) -> Listing:
    """The flat list (primary tools + every available tool) when it fits in ``max_tools``; else
    the primary tools that fit beside the two router tools (the rest are in pool ``brain``)."""
    flat = [*PRIMARY, *(t for t in tools if t.available)]
    if len(flat) <= max_tools:
        return Listing(tools=flat, pooled=False)
    room = max(max_tools - len(ROUTER), 0)
    return Listing(tools=[*PRIMARY[:room], *ROUTER][:max_tools], pooled=True)


def build_pools(tools: Iterable[GatewayTool], configured: Sequence[PoolConfig] = ()) -> dict[str, Pool]:
    """Pools by name: ``brain``, the configured ones (even empty), then the default ones."""
    members: dict[str, list[GatewayTool]] = {BRAIN_POOL: list(PRIMARY)}
    for config in configured:
        members.setdefault(config.name, [])
    for tool in tools:
        home = next((c.name for c in configured if _matches(tool, c.tools)), tool.pool)
        members.setdefault(home, []).append(tool)
    descriptions = {c.name: c.description for c in configured}
    descriptions.setdefault(BRAIN_POOL, "the gateway's own tools: health, trees, clients")
    return {
        name: Pool(name=name, description=descriptions.get(name, ""), actions=_actions(found))
        for name, found in members.items()
    }


def _matches(tool: GatewayTool, patterns: Sequence[str]) -> bool:
    names = [tool.name]
    if tool.name == qualified(tool.pool, tool.action):  # also as written before the dot
        names.append(f"{tool.pool}{LEGACY_SEPARATOR}{tool.action}")
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns for name in names)


def _actions(tools: Sequence[GatewayTool]) -> dict[str, GatewayTool]:
    """Action name -> tool; a short name two tools of the pool share gives way to their full names."""
    counts: dict[str, int] = {}
    for tool in tools:
        counts[tool.action] = counts.get(tool.action, 0) + 1
    return {(tool.action if counts[tool.action] == 1 else tool.name): tool for tool in tools}


def resolve(pools: dict[str, Pool], pool: str, action: str) -> GatewayTool | str:
    """The tool ``pool``/``action`` names, or an error text naming the known pools or actions."""
    found = pools.get(pool)
    if found is None:
        return (
            f"unknown pool {pool!r}; the pools are: {', '.join(sorted(pools))} (brain_list_pools lists them)"
        )
    tool = found.actions.get(action) or next((t for t in found.actions.values() if t.name == action), None)
    if tool is None:
        known = ", ".join(sorted(found.actions)) or "none (it is empty)"
        return f"pool {pool!r} has no action {action!r}; its actions: {known}"
    return tool


def pool_summary(pool: Pool) -> dict[str, Any]:
    """One pool as brain_list_pools shows it, offline actions named."""
    summary: dict[str, Any] = {"pool": pool.name, "description": pool.description, "tools": len(pool.actions)}
    summary["actions"] = sorted(pool.actions)
    offline = pool.offline
    if offline:
        whole = len(offline) == len(pool.actions)
        summary["offline"] = (
            f"{'its tools run' if whole else ', '.join(offline) + ' run'} on a workstation and none of "
            "your clients offering them is connected; a call waits or queues as the tool's "
            "offline_strategy says"
        )
    return summary


def pool_detail(pool: Pool) -> dict[str, Any]:
    """One pool with each action's description and argument schema."""
    return {
        **pool_summary(pool),
        "actions": [
            {
                "action": action,
                "tool": tool.name,
                "description": tool.description,
                "input_schema": tool.input_schema,
                "available": tool.available,
                # What the MCP server said of it (destructiveHint, …), for a host that sees only
                # brain_specialized_cmd in tools/list.
                **({"title": tool.title} if tool.title else {}),
                **({"annotations": tool.annotations} if tool.annotations else {}),
            }
            for action, tool in sorted(pool.actions.items())
        ],
    }


def search(pools: dict[str, Pool], query: str) -> list[dict[str, Any]]:
    """Actions whose tool name, action or description holds every word of ``query`` (any case)."""
    words = query.lower().split()
    hits = []
    for pool in pools.values():
        for action, tool in sorted(pool.actions.items()):
            text = f"{tool.name} {action} {tool.description}".lower()
            if all(word in text for word in words):
                hits.append(
                    {"pool": pool.name, "action": action, "tool": tool.name, "description": tool.description,
                     "available": tool.available}
                )  # fmt: skip
    return hits


__all__ = [
    "Listing", "Pool", "PoolConfig", "build_pools", "listing", "load_tool_pools", "pool_detail",
    "pool_summary", "resolve", "search",
]  # fmt: skip
