"""The brain's server-side registry (layer: brain/runtime; glue around pure merging).

Built-ins + tools discovered from the brain's ``mcpServers`` (location ``server``)
+ the registry file, merged by ``brain.core.treefile.merge_registry``. The snapshot is
published in Redis so the CLI validates trees against what the brain really has.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from brain.config import Settings
from brain.core.models import Location, ToolSpec
from brain.core.pools import registry_pool_problems
from brain.core.snapshot import RegistrySnapshot
from brain.core.toolnames import keep_declared, place
from brain.core.treefile import load_engines, load_registry, merge_registry, spec_from_descriptor
from brain.errors import ConfigError, InvalidRegistry
from workers.contracts import DEFAULT_POOL, MCPServerFailure, surface_op
from workers.mcp_config import MCPConfig, load_mcp_config, skipped_servers
from workers.rates import Limits
from workers.toolnames import is_qualified, name_on_server, qualified
from workers.tools.builtin import builtin_descriptors

DISCOVERY_TIMEOUT_S = 30.0


def build_registry(settings: Settings, *, discover: bool = True) -> RegistrySnapshot:
    """Discover and merge every server-side source of tools. Spawns the MCP servers once.

    ``discover=False`` skips the MCP servers: built-ins and the registry file only, cheap
    enough to check a tree before anything is started (its MCP tools are then unknown).
    Raises InvalidRegistry when a ``fallback_tool`` names no tool, once every source answered.
    """
    builtins = {d.name: spec_from_descriptor(d, Location.SERVER) for d in builtin_descriptors()}
    discovered: list[ToolSpec] = []
    failures: list[MCPServerFailure] = []
    servers: list[str] = []
    server_limits: dict[str, Limits] = {}
    if settings.mcp_config:
        # Read without discovery too: a bad limit is refused at load (explain, reload, start).
        server_limits = mcp_server_limits(load_mcp_config(str(settings.mcp_config)))
    if settings.mcp_config and discover:
        config = load_mcp_config(str(settings.mcp_config))
        servers = sorted(config.servers) + [f.server for f in skipped_servers(config)]
        from workers.mcp_clients import MCPClientManager  # the MCP SDK: only when there are servers

        manager = MCPClientManager(config)
        try:
            descriptors, failures = manager.discover(timeout=DISCOVERY_TIMEOUT_S)
        finally:
            manager.close()
        failures = [*skipped_servers(config), *failures]
        for d in descriptors:
            try:
                discovered.append(spec_from_descriptor(d, Location.SERVER))
            except ConfigError as exc:
                # One badly named tool must not take the rest of its server down with it.
                failures.append(
                    MCPServerFailure(server=d.mcp_server or "?", message=f"tool {d.name!r} skipped: {exc}")
                )
    declared: dict[str, ToolSpec] = load_registry(settings.registry) if settings.registry else {}
    engines = load_engines(settings.registry) if settings.registry else {}
    surfaces = [t for t in discovered if surface_op(t.name) is not None]
    discovered = [t for t in discovered if surface_op(t.name) is None]
    placed = keep_declared(declared, place(builtins, discovered))
    failures += [MCPServerFailure(server=server, message=why) for server, why in placed.refused]
    tools = merge_registry(placed.tools, bind_to_servers(declared, placed.tools))
    tools.update(surface_specs(surfaces, tools))
    # Only a complete picture may call a fallback_tool unknown: an MCP server not asked (or
    # not answering) could still offer it, and the router then says so at run time.
    complete = not failures and (discover or not settings.mcp_config)
    problems = unknown_fallbacks(tools) if complete else []
    pools = [p.name for p in settings.pools]
    problems += registry_pool_problems(tools, pools)
    if problems:
        raise InvalidRegistry(str(settings.registry or "the registry"), problems)
    asked = discover or not settings.mcp_config
    return RegistrySnapshot(
        tools=tools,
        engines=engines,
        mcp_failures=failures,
        clashes=placed.clashes,
        pools=pools,
        loaded_at=time.time(),
        unserved=unserved_mcp_tools(declared, placed.tools, servers, failures) if asked else {},
        server_limits=server_limits,
        pool_limits=pool_limits(settings),
    )


def pool_limits(settings: Settings) -> dict[str, Limits]:
    """The limits of each pool that has any: the default pool's settings, the [[pools]] tables."""
    found = {DEFAULT_POOL: settings.default_pool_limits} if settings.default_pool_limits.any else {}
    return found | {p.name: p.limits for p in settings.pools if p.limits.any}


def mcp_server_limits(config: MCPConfig) -> dict[str, Limits]:
    """The limits each ``mcpServers`` entry sets (pure): all of a server's tools share them."""
    return {name: spec.limits for name, spec in config.servers.items() if spec.limits.any}


def surface_specs(surfaces: list[ToolSpec], tools: Mapping[str, ToolSpec]) -> dict[str, ToolSpec]:
    """Each server's resources, prompts and completion, routed where its tools run (pure): on
    the one pool the registry file puts all of that server's tools in, else the default pool.
    Never under a bare name (``S#op`` names the server already)."""
    found = {}
    for spec in surfaces:
        pools = {t.pool for t in tools.values() if t.mcp_server == spec.mcp_server and t.type is spec.type}
        pool = pools.pop() if len(pools) == 1 else None
        found[spec.name] = spec.model_copy(update={"pool": pool}) if pool else spec
    return found


def unserved_mcp_tools(
    declared: Mapping[str, ToolSpec],
    placed: Mapping[str, ToolSpec],
    servers: list[str],
    failures: list[MCPServerFailure],
) -> dict[str, str]:
    """Registry-file tools the server side cannot run (pure): an entry naming an ``mcp_server``
    that the brain's ``mcpServers`` lacks, that failed to start, or that offers no such tool.
    A server run of one fails; ``vancetope explain`` says so before. Client-only entries name
    a client's server and are left out."""
    failed = {f.server: f.message for f in failures}
    found = {}
    for name, spec in declared.items():
        server = spec.mcp_server
        if server is None or spec.location is Location.CLIENT:
            continue
        if _bound_name(name, server) in placed:
            continue
        head = f"tool {name!r} names MCP server {server!r}, "
        if server in failed:
            found[name] = head + f"which failed to start: {failed[server]}"
        elif server not in servers:
            known = ", ".join(repr(n) for n in servers) or "none"
            found[name] = head + f"which is not in the brain's mcpServers (they are: {known})"
        else:
            found[name] = head + f"which offers no tool {name_on_server(name, server)!r}"
    return found


def bind_to_servers(declared: Mapping[str, ToolSpec], placed: Mapping[str, ToolSpec]) -> dict[str, ToolSpec]:
    """Registry-file entries keyed by the tool they describe (pure): an entry naming an
    ``mcp_server`` binds to that server's tool (``<server>.<tool>``, and its bare name
    when the bare name is that very tool), never to a same-named tool of another source."""
    bound: dict[str, ToolSpec] = {}
    for name, spec in declared.items():
        target = _bound_name(name, spec.mcp_server) if spec.mcp_server else name
        if target not in placed:
            bound[name] = spec
            continue
        bound[target] = spec.model_copy(update={"name": target})
        bare = placed.get(name)
        if target != name and bare is not None and bare.mcp_server == spec.mcp_server:
            bound[name] = spec
    return bound


def _bound_name(name: str, server: str) -> str:
    """The registered name of the entry ``name`` of ``server``'s: ``<server>.<tool>`` (a
    dotted name is qualified only when it starts with its own server's name)."""
    return name if is_qualified(name, server) else qualified(server, name)


def unknown_fallbacks(tools: Mapping[str, ToolSpec]) -> list[str]:
    """One line per tool whose ``fallback_tool`` names no tool of ``tools`` (pure)."""
    return [
        f"tool {name!r}: fallback_tool {spec.fallback_tool!r} is not a tool of the registry (built-ins, "
        "the brain's MCP servers and this file); name one of those or remove the fallback_tool"
        for name, spec in sorted(tools.items())
        if spec.fallback_tool is not None and spec.fallback_tool not in tools
    ]
