"""The ``mcpServers`` configuration file (layer: workers).

One job: read the de-facto ``{"mcpServers": {name: {...}}}`` format (as used by Claude
Desktop, Cursor, VS Code) into typed, validated server specs, with error messages that name
the file, the server and the key. The text may be JSONC, as VS Code writes it: ``//`` and
``/* */`` comments and trailing commas load (``workers.jsonc``). A file that is not such an
object fails as a whole; one entry that cannot be used (``"disabled": true``, a transport we do
not speak such as ``sse``, a missing command, an unknown key) is skipped with its reason in
``MCPConfig.skipped``, so the other servers' tools are still offered. Given the config in use
(``previous``), an entry whose edit cannot be used keeps its last good definition instead
(``MCPConfig.kept``, with the reason): a bad edit loses nothing.

The keys of an entry: ``command``, ``args``, ``env``, ``envFile``, ``cwd`` (stdio); ``url``,
``headers`` (http); ``type`` and ``disabled``; ``autoApprove`` (another client's list) is
ignored. Any other key is refused, with a did-you-mean, so that a misspelled ``arg`` is not
silently dropped. ``envFile`` (relative to the file's folder; ``KEY=VALUE`` lines) adds to
``env``, and ``env`` wins.

``${VAR}``, ``${env:VAR}`` and ``${VAR:-default}`` in ``command``, ``args``, ``env``,
``envFile`` (its path and values), ``cwd``, ``url`` and ``headers`` are expanded from the
process environment at load time, so secrets stay out of the file; an unset VAR without a
default is an error naming it, and ``${VANCETOPE_*}`` (the stack's own settings) is refused.
``${input:…}`` (which VS Code prompts its user for) is refused: nobody is there to answer.
``${vault:NAME}`` (in ``env`` and ``headers``) is left as it is and resolved only when the
server starts (``workers.secret_refs``). A ``${vault:NAME}`` in ``command`` or ``args`` is
refused: a command line is readable by every local user (``ps``, ``/proc/<pid>/cmdline``), so
the server is skipped with a reason that says to pass the secret through ``env`` instead. A
``${vault:NAME}`` in the ``headers`` of a plain ``http://`` server that is not on loopback is
refused too: it would cross the network in clear; and in ``url``, ``cwd`` or ``envFile``'s path,
where nothing resolves it.
"""

from __future__ import annotations

import difflib
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
from workers.jsonc import jsonc_to_json
from workers.rates import Concurrency, Limits, RateLimitText
from workers.secret_refs import VAULT_REF, references
from workers.tools.http_headers import is_loopback_host

_STACK_PREFIX = "VANCETOPE_"
_REF = re.compile(r"\$\{([^{}]*)\}")
_ENV_REF = re.compile(r"(?:env:)?([A-Za-z_][A-Za-z0-9_]*)(?::-(.*))?", re.DOTALL)
_ENV_LINE = re.compile(r"(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*)", re.DOTALL)
_STDIO_TYPES = ("stdio",)
_HTTP_TYPES = ("http", "streamable-http", "streamable_http", "streamableHttp")

# The keys of a server entry, by the kind of server they apply to. autoApprove is another
# client's (Cline's) list of tools it runs without asking: accepted and ignored, the agent's
# own consent decides here.
_STDIO_KEYS = ("command", "args", "env", "envFile", "cwd")
_HTTP_KEYS = ("url", "headers")
# rate_limit and max_concurrency bound every call of the server's tools together
# (docs/fair-share.md); they are read here and enforced by the brain's gate.
_ANY_KEYS = ("type", "disabled", "autoApprove", "rate_limit", "max_concurrency")
_KEYS = _STDIO_KEYS + _HTTP_KEYS + _ANY_KEYS
# Names other clients use, or that mean a key while not being spelled like it (difflib would
# offer "cwd" for "cmd").
_MEANT = {
    "cmd": "command",
    "environment": "env",
    "serverUrl": "url",
    "httpUrl": "url",
    "transport": "type",
    "transportType": "type",
    "workingDirectory": "cwd",
    "working_directory": "cwd",
}
# Variables VS Code fills in itself, which no environment holds.
_VSCODE_VARIABLES = ("workspaceFolder", "workspaceFolderBasename", "userHome", "pathSeparator", "cwd")


class MCPConfigError(WorkerError):
    """The MCP configuration file cannot be used; the message names the file and the problem."""


class StdioServerSpec(BaseModel):
    """A server started as a subprocess and spoken to over stdin/stdout."""

    # The parser has refused unknown keys already; what remains (disabled, autoApprove) is
    # not the spec's business.
    model_config = ConfigDict(extra="ignore", frozen=True)

    type: Literal["stdio"] = "stdio"
    command: str = Field(min_length=1)
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    rate_limit: RateLimitText = None
    max_concurrency: Concurrency = None

    @property
    def limits(self) -> Limits:
        return Limits(rate_limit=self.rate_limit, max_concurrency=self.max_concurrency)

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
    rate_limit: RateLimitText = None
    max_concurrency: Concurrency = None

    @property
    def limits(self) -> Limits:
        return Limits(rate_limit=self.rate_limit, max_concurrency=self.max_concurrency)

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
    # Entries whose new text could not be used, so their definition in the config given as
    # ``previous`` is in ``servers``, by name: the message says why (only with ``previous``).
    kept: dict[str, str] = Field(default_factory=dict)


def skipped_servers(config: MCPConfig) -> list[MCPServerFailure]:
    """The entries left out of ``config``, as failures to report (a server, and why)."""
    return [MCPServerFailure(server=name, message=why) for name, why in config.skipped.items()]


def load_mcp_config(path: str | os.PathLike[str], previous: MCPConfig | None = None) -> MCPConfig:
    """Read and validate an ``mcpServers`` JSON (or JSONC) file; ``previous``: see ``parse_mcp_config``."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise MCPConfigError(f"{source}: cannot read the MCP config: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise MCPConfigError(f"{source}: the MCP config is not UTF-8 text ({exc.reason})") from exc
    return parse_mcp_config(text, source, base_dir=Path(path).parent, previous=previous)


def parse_mcp_config(
    text: str,
    source: str,
    environ: Mapping[str, str] | None = None,
    *,
    base_dir: Path | None = None,
    previous: MCPConfig | None = None,
) -> MCPConfig:
    """Validate ``mcpServers`` JSON or JSONC text; ``source`` names it in error messages and its
    folder (or ``base_dir``) is where a relative ``envFile`` is. With ``previous`` (the config in
    use), an entry that cannot be used keeps its definition there, if it has one."""
    env = os.environ if environ is None else environ
    try:
        doc = json.loads(jsonc_to_json(text))
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
    base = Path(source).parent if base_dir is None else base_dir
    servers: dict[str, MCPServerSpec] = {}
    skipped: dict[str, str] = {}
    kept: dict[str, str] = {}
    for name, entry in entries.items():
        if isinstance(entry, dict) and entry.get("disabled") is True:
            skipped[name] = f"{source}: server {name!r} is disabled in the file; skipped"
            continue
        try:
            servers[name] = _parse_server(source, name, entry, env, base)
        except MCPConfigError as exc:
            last_good = None if previous is None else previous.servers.get(name)
            if last_good is None:
                skipped[name] = exc.message
            else:
                servers[name] = last_good
                kept[name] = f"{exc.message}; its last good definition stays in use"
    return MCPConfig(source=source, servers=servers, skipped=skipped, kept=kept)


def _parse_server(source: str, name: str, entry: Any, env: Mapping[str, str], base: Path) -> MCPServerSpec:
    where = f"{source}: server {name!r}"
    if not name.strip():
        raise MCPConfigError(f"{source}: a server name must not be empty")
    if not isinstance(entry, dict):
        raise MCPConfigError(f"{where}: settings must be an object")
    _refuse_unknown_keys(where, entry)
    kind = _server_kind(where, entry)
    _refuse_keys_of_the_other_kind(where, entry, kind)
    if "disabled" in entry and not isinstance(entry["disabled"], bool):
        raise MCPConfigError(f"{where}: disabled must be true or false, not {entry['disabled']!r}")
    fields = _expanded(where, entry, env)
    fields["type"] = kind
    if "envFile" in fields:
        fields["env"] = _with_env_file(where, fields, env, base)
    if kind == "stdio":
        _refuse_vault_on_command_line(where, fields)
    else:
        _refuse_vault_over_plain_http(where, fields)
    _refuse_vault_where_nothing_resolves_it(where, fields)
    model: type[StdioServerSpec | HttpServerSpec] = StdioServerSpec if kind == "stdio" else HttpServerSpec
    try:
        return model.model_validate(fields)
    except ValidationError as exc:
        raise MCPConfigError(f"{where}: {_first_problem(exc)}") from exc


def _refuse_unknown_keys(where: str, entry: dict[str, Any]) -> None:
    for key in entry:
        if key in _KEYS:
            continue
        meant = _MEANT.get(key) or _close_key(key)
        hint = f" (did you mean {meant!r}?)" if meant else ""
        raise MCPConfigError(
            f"{where}: unknown key {key!r}{hint}; a server takes command, args, env, envFile and cwd "
            "(stdio), or url and headers (http), and type, disabled, rate_limit and max_concurrency"
        )


def _close_key(key: str) -> str | None:
    """The known key ``key`` is most likely a misspelling of (``arg``, ``Command``, ``env_file``)."""
    lowered = {known.lower(): known for known in _KEYS}
    close = difflib.get_close_matches(key.lower(), list(lowered), n=1, cutoff=0.6)
    return lowered[close[0]] if close else None


def _refuse_keys_of_the_other_kind(where: str, entry: dict[str, Any], kind: str) -> None:
    """An http server's ``args`` (or a stdio server's ``headers``) would be ignored: say so
    (an empty one says nothing, and is let be)."""
    other, has = (_HTTP_KEYS, '"command" (stdio)') if kind == "stdio" else (_STDIO_KEYS, '"url" (http)')
    for key, value in entry.items():
        if key in other and value not in (None, "", [], {}):
            raise MCPConfigError(
                f"{where}: {key!r} does not apply to this server, which has {has}; remove it"
            )


def _expanded(where: str, entry: dict[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    """``entry`` with ``${…}`` expanded in every string value that may hold one; values of the
    wrong type are left for the model to reject with its own message."""
    fields = dict(entry)
    for key in ("command", "cwd", "url", "envFile"):
        if isinstance(fields.get(key), str):
            fields[key] = _expand(where, key, fields[key], env)
    if isinstance(fields.get("args"), list):
        fields["args"] = [
            _expand(where, f"args[{index}]", arg, env) if isinstance(arg, str) else arg
            for index, arg in enumerate(fields["args"])
        ]
    for key in ("env", "headers"):
        if isinstance(fields.get(key), dict):
            fields[key] = _expand_values(where, key, fields[key], env)
    return fields


def _expand(where: str, place: str, text: str, env: Mapping[str, str]) -> str:
    """``text`` with each ``${VAR}``, ``${env:VAR}`` and ``${VAR:-default}`` replaced; a
    ``${vault:NAME}`` is left for the server's start; anything else is refused."""

    def replace(match: re.Match[str]) -> str:
        ref, inner = match.group(0), match.group(1)
        if inner.startswith("vault:") and VAULT_REF.fullmatch(ref):
            return ref
        if inner.startswith("input:"):
            raise MCPConfigError(
                f"{where}: {place} holds {ref}, a value VS Code asks its user for as it starts the "
                "server; nobody is there to answer here (the agent and the brain run in the "
                "background). Set an environment variable and write ${env:NAME} instead, or, for a "
                "secret of the brain's file, store it with `vancetope secrets set NAME` and write "
                "${vault:NAME}"
            )
        found = _ENV_REF.fullmatch(inner)
        if found is None:
            raise MCPConfigError(
                f"{where}: {place} holds {ref}, which is not expanded here: write ${{VAR}}, ${{env:VAR}} "
                "or ${VAR:-default} for an environment variable, or ${vault:NAME} (in env and headers) "
                "for a secret of the vault"
            )
        var, default = found.group(1), found.group(2)
        if var.upper().startswith(_STACK_PREFIX):
            raise MCPConfigError(
                f"{where}: {place} refers to {ref}; the stack's own settings (Redis and "
                "store URLs, the vault key) are never given to an MCP server"
            )
        value = env.get(var)
        if value is None or (value == "" and default is not None):
            if default is not None:
                return default
            hint = " (a variable VS Code fills in itself)" if var in _VSCODE_VARIABLES else ""
            raise MCPConfigError(
                f"{where}: {place} refers to {ref}, but {var} is not set in the environment{hint}"
            )
        return value

    return _REF.sub(replace, text)


def _expand_values(where: str, key: str, values: dict[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    """Expand every string value of ``env`` or ``headers``; a name VANCETOPE_* is refused in ``env``."""
    for name in values:
        if key == "env" and isinstance(name, str):
            _refuse_stack_variable(where, f"env {name!r}", name)
    return {
        name: _expand(where, f"{key} {name!r}", value, env) if isinstance(value, str) else value
        for name, value in values.items()
    }


def _refuse_stack_variable(where: str, place: str, name: str) -> None:
    if name.upper().startswith(_STACK_PREFIX):
        raise MCPConfigError(
            f"{where}: {place}: VANCETOPE_* variables are the stack's own and are never "
            "given to an MCP server; name it otherwise"
        )


def _with_env_file(where: str, fields: dict[str, Any], env: Mapping[str, str], base: Path) -> Any:
    """``env`` with the variables of ``envFile`` under it (``env`` wins a name both set)."""
    written = fields.pop("envFile")
    if not isinstance(written, str) or not written:
        raise MCPConfigError(f"{where}: envFile must be the path of a file of KEY=VALUE lines")
    path = base / Path(written).expanduser()
    shown = repr(written) if str(path) == written else f"{written!r} ({path})"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise MCPConfigError(f"{where}: envFile {shown} cannot be read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise MCPConfigError(f"{where}: envFile {shown} is not UTF-8 text ({exc.reason})") from exc
    from_file: dict[str, str] = {}
    for number, name, value, literal in parse_env_file(text, f"{where}: envFile {shown}"):
        place = f"envFile {shown} line {number}, {name}"
        _refuse_stack_variable(where, place, name)
        from_file[name] = value if literal else _expand(where, place, value, env)
    configured = fields.get("env", {})
    if not isinstance(configured, dict):
        return configured  # the model rejects it with its own message
    return {**from_file, **configured}


def parse_env_file(text: str, where: str) -> list[tuple[int, str, str, bool]]:
    """The ``(line number, name, value, literal)`` of each ``KEY=VALUE`` line of a dotenv file:
    ``#`` comments and blank lines are skipped, ``export`` before a name is allowed, and a value
    may be in single quotes (``literal``: taken as it is, no ``${…}`` expanded) or double quotes
    (``\\n``, ``\\"``, ``\\\\`` escapes); an unquoted value ends at `` #``. Errors name ``where``
    and the line, never a value."""
    out: list[tuple[int, str, str, bool]] = []
    for number, line in enumerate(text.removeprefix("\ufeff").splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        found = _ENV_LINE.fullmatch(stripped)
        if found is None:
            raise MCPConfigError(f"{where}: line {number} is not NAME=VALUE")
        value = _env_value(found.group(2))
        if value is None:
            raise MCPConfigError(
                f"{where}: line {number} ({found.group(1)}): a quoted value must end with its quote "
                "on the same line, followed by nothing but a # comment"
            )
        out.append((number, found.group(1), value, found.group(2).startswith("'")))
    return out


_DOUBLE_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"\s*(?:#.*)?', re.DOTALL)
_SINGLE_QUOTED = re.compile(r"'([^']*)'\s*(?:#.*)?", re.DOTALL)
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\", "$": "$"}


def _env_value(raw: str) -> str | None:
    """The value of one dotenv line (None: a quote that does not end right)."""
    if raw.startswith('"'):
        quoted = _DOUBLE_QUOTED.fullmatch(raw)
        if quoted is None:
            return None
        return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(0)), quoted.group(1))
    if raw.startswith("'"):
        quoted = _SINGLE_QUOTED.fullmatch(raw)
        return None if quoted is None else quoted.group(1)
    return re.split(r"\s#", raw, maxsplit=1)[0].strip()


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


def _refuse_vault_where_nothing_resolves_it(where: str, fields: dict[str, Any]) -> None:
    """A ``${vault:NAME}`` is resolved in ``env`` and ``headers`` only: elsewhere it would reach
    the server as it is written."""
    for key in ("url", "cwd"):
        value = fields.get(key)
        if isinstance(value, str) and (names := references(value)):
            raise MCPConfigError(
                f"{where}: {key} holds ${{vault:{names[0]}}}, which is resolved in env and headers only"
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
            f'{where}: unsupported type {declared!r} (use "stdio", "http" or "streamable-http")'
        )
    if not has_command and not has_url:
        raise MCPConfigError(f'{where}: has neither "command" (stdio) nor "url" (http)')
    kind: Literal["stdio", "http"] = "stdio" if has_command else "http"
    if declared is not None and (declared in _STDIO_TYPES) != (kind == "stdio"):
        needed = "command" if declared in _STDIO_TYPES else "url"
        raise MCPConfigError(f'{where}: type {declared!r} needs "{needed}"')
    return kind


def _first_problem(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(part) for part in err["loc"])
    if err["type"] == "string_pattern_mismatch" and loc == "url":
        return f"url {err['input']!r} must start with http:// or https://"
    msg = str(err["msg"]).removeprefix("Value error, ")
    return f"{loc}: {msg}" if loc else msg
