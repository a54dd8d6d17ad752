"""The registry snapshot the brain publishes: every server-side tool, engine and pool (layer:
brain/core; a model). Built by ``brain.runtime.registry.build_registry``; read by validation, routing,
the CLI and the gateway."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from brain.core.models import ToolSpec
from brain.core.routing import Engine
from brain.core.toolnames import clash_lines
from workers.contracts import MCPServerFailure
from workers.rates import Limits


class RegistrySnapshot(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tools: dict[str, ToolSpec] = Field(default_factory=dict)
    engines: dict[str, Engine] = Field(default_factory=dict)
    mcp_failures: list[MCPServerFailure] = Field(default_factory=list)
    # bare tool name -> who offers it, when several do (brain.core.toolnames)
    clashes: dict[str, list[str]] = Field(default_factory=dict)
    # The named server pools the brain routes to (the default pool is always there).
    pools: list[str] = Field(default_factory=list)
    # When this snapshot was built, and what changed from the one before (brain.runtime.reload).
    loaded_at: float = 0.0
    changes: list[str] = Field(default_factory=list)
    # Registry-file tools whose MCP server the brain lacks (or that failed, or lacks the tool):
    # tool -> why a server run of it fails (brain.runtime.registry.unserved_mcp_tools).
    unserved: dict[str, str] = Field(default_factory=dict)
    # Limits written on an MCP server (its mcpServers entry) and on a pool ([[pools]]), by name:
    # what every server run of that server / on that pool shares (brain.core.fairshare).
    server_limits: dict[str, Limits] = Field(default_factory=dict)
    pool_limits: dict[str, Limits] = Field(default_factory=dict)
    _limited: bool | None = PrivateAttr(default=None)

    @property
    def limited(self) -> bool:
        """Whether any tool has a limit (computed once: the dispatch fast path asks per call)."""
        if self._limited is None:
            self._limited = any(
                t.rate_limit is not None or t.max_concurrency is not None for t in self.tools.values()
            )
        return self._limited

    def failure_hint(self, tool: str | None = None) -> str:
        """Words to add to a 'Tool unknown' error: the tool's name clash, MCP servers that failed."""
        hint = ""
        if tool is not None and tool in self.clashes:
            hint += f"; {clash_lines({tool: self.clashes[tool]})[0]}"
        if self.mcp_failures:
            names = ", ".join(f"{f.server!r} ({f.message})" for f in self.mcp_failures)
            hint += f"; note: MCP server(s) failed to start: {names}"
        return hint
