"""The ``mcpServers`` configuration file (layer: workers).

One job: read the de-facto ``{"mcpServers": {name: {...}}}`` JSON format (as used
by Claude Desktop, Cursor, VS Code) into typed, validated server specs, with
error messages that name the file, the server and the problem. A file that is not
such an object fails as a whole; one entry that cannot be used (``"disabled": true``,
a transport we do not speak such as ``sse``, a missing command) is skipped with its
reason in ``MCPConfig.skipped``, so the other servers' tools are still offered. ``${VAR}`` in
``env`` and ``headers`` values is expanded from the process environment at load
time, so secrets stay out of the file; ``${vault:NAME}`` (in ``env`` and ``headers``) is left
as it is and resolved only when the server starts (``workers.secret_refs``). A ``${vault:NAME}``
in ``command`` or ``args`` is refused: a command line is readable by every local user (``ps``,
``/proc/<pid>/cmdline``), so the server is skipped with a reason that says to pass the secret
through ``env`` instead. A ``${vault:NAME}`` in the ``headers`` of a plain ``http://`` server
that is not on loopback is refused too: it would cross the network in clear.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from workers.contracts import MCPServerFailure
from workers.errors import WorkerError
from workers.secret_refs import references
from workers.tools.http_headers import is_loopback_host

_STACK_PREFIX = "VANCETOPE_"
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_STDIO_TYPES = ("stdio",)
_HTTP_TYPES = ("http", "streamable-http", "streamable_http", "streamableHttp")


class MCPConfigError(WorkerError):
    """The MCP configuration file cannot be used; the message names the file and the problem."""


class StdioServerSpec(BaseModel):
    """A server started as a subprocess and spoken to over stdin/stdout."""

    # Other tools' keys (disabled, autoApprove, ...) are ignored, not rejected,
    # so a file copied from another MCP client still loads.
    model_config = ConfigDict(extra="ignore", frozen=True)

    type: Literal["stdio"] = "stdio"
    command: str = Field(min_length=1)
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None

    def describe(self) -> str:
        """The command, for error messages: without its arguments, which may carry tokens or
        paths that errors must not copy into the store, the registry and the logs."""
        return f"command {shlex.quote(self.command)}" + (
            f" with {len(self.args)} argument(s)" if self.args else ""
        )


class HttpServerSpec(BaseModel):
    """A server reached over streamable HTTP."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    type: Literal["http"] = "http"
    url: str = Field(pattern=r"^[hH][tT][tT][pP][sS]?://")
    headers: dict[str, str] = Field(default_factory=dict)

    def describe(self) -> str:
        return self.url


MCPServerSpec = StdioServerSpec | HttpServerSpec


class MCPConfig(BaseModel):
    """All configured MCP servers, by name, and the file they came from."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str = "<memory>"
    servers: dict[str, MCPServerSpec] = Field(default_factory=dict)
    # Entries left out, by name: the message says which file, which server and why.
    skipped: dict[str, str] = Field(default_factory=dict)


def skipped_servers(config: MCPConfig) -> list[MCPServerFailure]:
    """The entries left out of ``config``, as failures to report (a server, and why)."""
    return [MCPServerFailure(server=name, message=why) for name, why in config.skipped.items()]


def load_mcp_config(path: str | os.PathLike[str]) -> MCPConfig:
    """Read and validate an ``mcpServers`` JSON file."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise MCPConfigError(f"{source}: cannot read the MCP config: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise MCPConfigError(f"{source}: the MCP config is not UTF-8 text ({exc.reason})") from exc
    return parse_mcp_config(text, source)


def parse_mcp_config(text: str, source: str, environ: Mapping[str, str] | None = None) -> MCPConfig:
    """Validate ``mcpServers`` JSON text; ``source`` names it in error messages."""
    env = os.environ if environ is None else environ
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise MCPConfigError(
            f"{source}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from exc
    if not isinstance(doc, dict):
        raise MCPConfigError(f'{source}: the top level must be a JSON object with an "mcpServers" key')
    if "mcpServers" not in doc:
        raise MCPConfigError(f'{source}: missing the "mcpServers" object')
    entries = doc["mcpServers"]
    if not isinstance(entries, dict):
        raise MCPConfigError(f'{source}: "mcpServers" must be an object mapping server names to settings')
    servers: dict[str, MCPServerSpec] = {}
    skipped: dict[str, str] = {}
    for name, entry in entries.items():
        if isinstance(entry, dict) and entry.get("disabled") is True:
            skipped[name] = f"{source}: server {name!r} is disabled in the file; skipped"
            continue
        try:
            servers[name] = _parse_server(source, name, entry, env)
        except MCPConfigError as exc:
            skipped[name] = exc.message
    return MCPConfig(source=source, servers=servers, skipped=skipped)


def _parse_server(source: str, name: str, entry: Any, env: Mapping[str, str]) -> MCPServerSpec:
    where = f"{source}: server {name!r}"
    if not name.strip():
        raise MCPConfigError(f"{source}: a server name must not be empty")
    if not isinstance(entry, dict):
        raise MCPConfigError(f"{where}: settings must be an object")
    kind = _server_kind(where, entry)
    fields = dict(entry)
    fields["type"] = kind
    for key in ("env", "headers"):
        if isinstance(fields.get(key), dict):
            fields[key] = _expand_values(where, key, fields[key], env)
    if kind == "stdio":
        _refuse_vault_on_command_line(where, fields)
    else:
        _refuse_vault_over_plain_http(where, fields)
    model: type[StdioServerSpec | HttpServerSpec] = StdioServerSpec if kind == "stdio" else HttpServerSpec
    try:
        return model.model_validate(fields)
    except ValidationError as exc:
        raise MCPConfigError(f"{where}: {_first_problem(exc)}") from exc


def _refuse_vault_on_command_line(where: str, fields: dict[str, Any]) -> None:
    """A secret resolved into argv would be in clear in ``ps`` for every local user: refuse it
    here, as the file is loaded, so explain, reload and the brain's start all report it."""
    args = fields.get("args")
    words = [("command", fields.get("command"))]
    if isinstance(args, list):
        words += [(f"args[{index}]", arg) for index, arg in enumerate(args)]
    for place, word in words:
        names = references(word) if isinstance(word, str) else []
        if names:
            name = names[0]
            raise MCPConfigError(
                f"{where}: {place} holds ${{vault:{name}}}; a secret on a command line is readable by "
                "every local user (ps, /proc/<pid>/cmdline), so this server is not started. Pass it "
                f'through "env" instead, e.g. "env": {{"{_env_name(name)}": "${{vault:{name}}}"}}, and '
                "have the server read that variable (most servers take their token from one)"
            )


def _refuse_vault_over_plain_http(where: str, fields: dict[str, Any]) -> None:
    """A vault secret in a header goes over https only (loopback excepted), as http_headers do."""
    url, headers = fields.get("url"), fields.get("headers")
    if not isinstance(url, str) or not isinstance(headers, dict):
        return
    try:
        parts = urlsplit(url)
    except ValueError:
        return  # the model rejects it with its own message
    if parts.scheme.lower() != "http" or is_loopback_host((parts.hostname or "").rstrip(".")):
        return
    for name, value in headers.items():
        if isinstance(value, str) and references(value):
            raise MCPConfigError(
                f"{where}: header {name!r} holds ${{vault:{references(value)[0]}}} but the url is plain "
                "http://, which anyone on the network can read; use https:// (plain http is accepted "
                "for a loopback server only)"
            )


def _env_name(secret: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", secret).upper()


def _server_kind(where: str, entry: dict[str, Any]) -> Literal["stdio", "http"]:
    has_command, has_url = "command" in entry, "url" in entry
    if has_command and has_url:
        raise MCPConfigError(f'{where}: has both "command" and "url"; give "command" (stdio) or "url" (http)')
    declared = entry.get("type")
    if declared is not None and declared not in _STDIO_TYPES + _HTTP_TYPES:
        raise MCPConfigError(
            f'{where}: unsupported type {declared!r} (use "stdio", "http" or "streamable-http"); '
            "this server is skipped"
        )
    if not has_command and not has_url:
        raise MCPConfigError(f'{where}: has neither "command" (stdio) nor "url" (http)')
    kind: Literal["stdio", "http"] = "stdio" if has_command else "http"
    if declared is not None and (declared in _STDIO_TYPES) != (kind == "stdio"):
        needed = "command" if declared in _STDIO_TYPES else "url"
        raise MCPConfigError(f'{where}: type {declared!r} needs "{needed}"')
    return kind


def _expand_values(where: str, key: str, values: dict[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    """Replace every ``${VAR}`` in string values; a missing VAR is an error naming it."""

    def expand(name: str, value: Any) -> Any:
        if not isinstance(value, str):
            return value  # left for the model to reject with its own message

        def lookup(match: re.Match[str]) -> str:
            var = match.group(1)
            if var.startswith(_STACK_PREFIX):
                raise MCPConfigError(
                    f"{where}: {key} {name!r} refers to ${{{var}}}; the stack's own settings (Redis and "
                    "store URLs, the vault key) are never given to an MCP server"
                )
            if var not in env:
                raise MCPConfigError(
                    f"{where}: {key} {name!r} refers to ${{{var}}}, but {var} is not set in the environment"
                )
            return env[var]

        return _VAR.sub(lookup, value)

    for name in values:
        if key == "env" and isinstance(name, str) and name.upper().startswith(_STACK_PREFIX):
            raise MCPConfigError(
                f"{where}: env {name!r}: VANCETOPE_* variables are the stack's own and are never "
                "given to an MCP server; name it otherwise"
            )
    return {name: expand(name, value) for name, value in values.items()}


def _first_problem(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(part) for part in err["loc"])
    if err["type"] == "string_pattern_mismatch" and loc == "url":
        return f"url {err['input']!r} must start with http:// or https://"
    return f"{loc}: {err['msg']}" if loc else str(err["msg"])
