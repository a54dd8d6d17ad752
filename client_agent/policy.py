"""Local policy of a client agent (layer: client_agent).

One job: decide, from the user's config alone, what this workstation lets the brain do:
which folders native tools may touch (the sandbox roots), whether ``shell_execute`` runs,
and which tools are offered at all (``allowed_tools``). A tool the policy does not allow
is neither announced nor run: a call that arrives for it anyway fails with
``PolicyViolation``. Pure decisions; no Redis, no processes.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from client_agent.config import AgentConfig
from client_agent.errors import PolicyViolation
from client_agent.self_protection import protected_paths
from client_agent.toolnames import pattern_names
from workers.contracts import ToolDescriptor
from workers.tools.builtin import BuiltinContext, BuiltinTool
from workers.tools.native import Sandbox, native_tools


@dataclass(frozen=True)
class Policy:
    sandbox: Sandbox
    shell_enabled: bool = False
    # None: every tool; else glob patterns matched against "name", "mcp_server.name" and
    # "mcp_server/name" (the form written before the dot: client_agent.toolnames).
    allowed_tools: tuple[str, ...] | None = None
    default_timeout_s: float = 30.0

    @classmethod
    def from_config(cls, config: AgentConfig, config_file: Path | None = None) -> Policy:
        """The native tools are confined to the sandbox roots and refuse the agent's own files."""
        return cls(
            sandbox=Sandbox(config.sandbox_roots, protected_paths(config, config_file)),
            shell_enabled=config.shell_enabled,
            allowed_tools=config.allowed_tools,
            default_timeout_s=config.default_timeout_s,
        )

    def allows(self, tool: ToolDescriptor) -> bool:
        if self.allowed_tools is None:
            return True
        names = pattern_names(tool.name, tool.mcp_server)
        return any(fnmatchcase(name, pattern) for pattern in self.allowed_tools for name in names)

    def announces(self, tool: ToolDescriptor) -> bool:
        """Offered to the brain: allowed, and (for shell_execute) enabled."""
        if tool.name == "shell_execute" and tool.mcp_server is None and not self.shell_enabled:
            return False
        return self.allows(tool)

    def native(self) -> dict[str, BuiltinTool]:
        """What the worker may execute by name: the allowed tools, and a refusing stub for the rest
        (so a stray call gets a message naming the policy, not 'no such tool')."""
        tools = native_tools(self.sandbox, self.shell_enabled, self.default_timeout_s)
        return {
            name: tool if self.allows(tool.descriptor) else self._refusing(tool)
            for name, tool in tools.items()
        }

    def announced_native(self) -> list[ToolDescriptor]:
        return [tool.descriptor for tool in self.native().values() if self.announces(tool.descriptor)]

    def refusal(self, tool: str, mcp_server: str | None = None) -> PolicyViolation:
        where = "" if mcp_server is None else f" of MCP server {mcp_server!r}"
        return PolicyViolation(
            tool, None, f"tool{where} is not allowed on this client agent (allowed_tools: {self._patterns()})"
        )

    def _refusing(self, tool: BuiltinTool) -> BuiltinTool:
        name = tool.descriptor.name

        def refuse(args: dict[str, Any], ctx: BuiltinContext) -> Any:
            raise self.refusal(name)

        return BuiltinTool(tool.descriptor, refuse)

    def _patterns(self) -> str:
        return "[" + ", ".join(self.allowed_tools or ()) + "]"
