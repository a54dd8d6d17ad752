"""The client agent's settings (layer: client_agent).

One job: read the ``[agent]`` table of a TOML file, then ``VANCETOPE_AGENT_<NAME>``
environment overrides, into a frozen ``AgentConfig``. Paths in the file are relative to
the file (not to wherever the agent is started); paths in the environment are relative
to the current directory. Every error names the file (or variable) and the field.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from client_agent.errors import AgentConfigError, NoCredential
from client_agent.self_protection import check_sandbox_roots
from workers.contracts import MAX_ASK_TIMEOUT_S, ClientType, client_queue
from workers.urls import check_redis_url, url_password

ENV_PREFIX = "VANCETOPE_AGENT_"
TABLE = "agent"
_PATH_FIELDS = ("data_dir", "mcp_json", "credential_file", "log_file")
URL_VARIABLE = ENV_PREFIX + "BROKER_URL"
_LIST_FIELDS = ("sandbox_roots", "allowed_tools", "ask", "trust_mcp_servers", "redact", "redact_builtin")


class AskScope(StrEnum):
    CALL = "call"  # every call of an `ask` tool waits for its own approval
    TREE = "tree"  # approving one call covers that tree's later calls of the same tool


class WorkerPool(StrEnum):
    THREADS = "threads"
    SOLO = "solo"


class AgentConfig(BaseModel):
    """Everything one client agent needs; read once and passed down."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    client_id: str
    user: str = Field(min_length=1)
    client_type: ClientType = ClientType.DESKTOP
    # This client's own URL from `vancetope clients enroll`: here, in VANCETOPE_AGENT_BROKER_URL,
    # or (best) in credential_file, a 0600 file holding the line that command printed. None (or
    # a URL without a password) is enough for `tools`; `run` and `install` refuse it
    # (own_broker_url).
    broker_url: str | None = None
    credential_file: Path | None = None
    # The Redis master's name when broker_url is a sentinel:// URL (None: the environment's
    # VANCETOPE_REDIS_SENTINEL_MASTER, else mymaster; workers.redis_connect.master_name).
    redis_sentinel_master: str | None = None
    # The agent's own state: agent.json (pid, last heartbeat), read by `vancetope-agent status`.
    data_dir: Path = Path(".vancetope-agent")
    # Where `run` logs (rotated at 10 MB, 3 kept); None: stderr. The installed service always logs
    # to a file: this one, or the platform's default (client_agent/service.py, default_log_file).
    log_file: Path | None = None
    sandbox_roots: tuple[Path, ...] = ()
    mcp_json: Path | None = None
    shell_enabled: bool = False
    # None: every tool; else glob patterns matched against "name", "mcp_server.name" (or "mcp_server/name").
    allowed_tools: tuple[str, ...] | None = None
    concurrency: int = Field(default=2, ge=1, le=64)
    pool: WorkerPool = WorkerPool.THREADS
    heartbeat_interval_s: float = Field(default=2.0, gt=0)
    heartbeat_ttl_s: float = Field(default=6.0, gt=0)
    # Bounds local steps that have no bound of their own: MCP server start and listing,
    # git_status, shell_execute without timeout_s.
    default_timeout_s: float = Field(default=30.0, gt=0)
    ack_timeout_s: float = Field(default=10.0, gt=0)
    # How long an agent the brain has accepted goes on trying when the broker refuses its
    # credentials before it stops as revoked (exit 3). A Redis restarted without its users
    # refuses every agent until the brain restores them from the store (within its
    # reconcile_interval_s); a revocation looks the same from here. 0: stop at once.
    refused_grace_s: float = Field(default=60.0, ge=0)
    log_level: str = "INFO"
    # --- consent (README "Consent on the workstation"); the state lives in data_dir/consent ---
    # Tools whose every call waits for `vancetope-agent approve ID`: names or "<server>.*" globs ("<server>/*" too).
    ask: tuple[str, ...] = ()
    ask_scope: AskScope = AskScope.CALL
    # A call nobody approved within this is denied (it fails; nothing ran).
    ask_timeout_s: float = Field(default=600.0, gt=0, le=MAX_ASK_TIMEOUT_S)
    # mcp.json servers started without asking for their command: what a user writes after
    # reviewing them. Any other server waits for `vancetope-agent approve`, again whenever
    # its command, arguments, env names or cwd change.
    trust_mcp_servers: tuple[str, ...] = ()
    # A result bigger than this (compact JSON, after redaction) fails and is not sent.
    max_result_bytes: int | None = Field(default=None, gt=0)
    # Regular expressions whose matches in a result are replaced before it is sent, and
    # built-in sets of them (client_agent.redact.BUILTIN_PATTERNS).
    redact: tuple[str, ...] = ()
    redact_builtin: tuple[str, ...] = ()

    @field_validator("client_id")
    @classmethod
    def _valid_client_id(cls, value: str) -> str:
        client_queue(value)  # raises ValueError with the rule
        return value

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        if value.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
            raise ValueError(f"must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL, got {value!r}")
        return value.upper()

    @field_validator("redact")
    @classmethod
    def _valid_patterns(cls, patterns: tuple[str, ...]) -> tuple[str, ...]:
        for pattern in patterns:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"{pattern!r} is not a regular expression: {exc}") from None
        return patterns

    @field_validator("redact_builtin")
    @classmethod
    def _known_builtin_sets(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        from client_agent.redact import BUILTIN_PATTERNS

        unknown = sorted(set(names) - set(BUILTIN_PATTERNS))
        if unknown:
            raise ValueError(f"unknown {', '.join(unknown)} (known: {', '.join(BUILTIN_PATTERNS)})")
        return names

    @field_validator("broker_url")
    @classmethod
    def _valid_broker_url(cls, value: str | None) -> str | None:
        return None if value is None else check_redis_url(value)

    @field_validator("sandbox_roots")
    @classmethod
    def _roots_are_directories(cls, roots: tuple[Path, ...]) -> tuple[Path, ...]:
        for root in roots:
            if not root.is_dir():
                raise ValueError(f"{str(root)!r} is not an existing directory")
        return roots

    @field_validator("heartbeat_ttl_s")
    @classmethod
    def _ttl_outlives_interval(cls, ttl: float, info: ValidationInfo) -> float:
        # A TTL at or below the interval lets the key expire between two beats: the brain
        # would see this agent flap offline while it is fine.
        interval = info.data.get("heartbeat_interval_s")
        if interval is not None and ttl <= interval:
            raise ValueError(f"must be greater than heartbeat_interval_s ({interval:g}), got {ttl:g}")
        return ttl

    @field_validator("data_dir", "mcp_json", "credential_file", "log_file", "sandbox_roots", mode="before")
    @classmethod
    def _absolute(cls, value: Any) -> Any:
        # Paths from the environment are relative to the current directory; fix them now,
        # not at first use after some chdir.
        if isinstance(value, str):
            return Path(value).expanduser().absolute()
        if isinstance(value, list | tuple):
            return [Path(v).expanduser().absolute() if isinstance(v, str) else v for v in value]
        return value

    def own_broker_url(self) -> str:
        """The broker URL with this client's own credential; NoCredential when there is none
        (no URL, or one without a password: the example's placeholder), so the agent does not
        retry a broker that will never let it in."""
        if self.broker_url is None or url_password(self.broker_url) is None:
            raise NoCredential(self.client_id, self.user)
        return self.broker_url


def load_config(path: str | os.PathLike[str], environ: Mapping[str, str] | None = None) -> AgentConfig:
    """The ``[agent]`` table of ``path``, then ``VANCETOPE_AGENT_*`` from ``environ`` (default os.environ)."""
    env = os.environ if environ is None else environ
    file = Path(path)
    values, sources = _file_values(file)
    for name, (raw, var) in _env_values(env).items():
        values[name] = raw
        sources[name] = f"{var} (environment)"
    values.setdefault("data_dir", str(file.resolve().parent / ".vancetope-agent"))
    if values.get("credential_file") and "broker_url" not in _env_values(env):
        values["broker_url"] = read_credential_file(
            Path(values["credential_file"]), sources["credential_file"]
        )
        sources["broker_url"] = f"{values['credential_file']} (credential_file)"
    try:
        config = AgentConfig.model_validate(values)
    except ValidationError as exc:
        raise _config_error(exc, sources, str(file)) from exc
    # The agent's own files must be out of its tools' reach (client_agent.self_protection).
    check_sandbox_roots(config, file.absolute())
    return config


def read_credential_file(path: Path, source: str) -> str:
    """The broker URL in a credential file written by `vancetope clients enroll --output`.

    Refused when others may read it: it holds this workstation's password to the broker.
    """
    try:
        mode = path.stat().st_mode
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise AgentConfigError(
            source, "credential_file", f"cannot read {path}: {exc.strerror or exc}"
        ) from exc
    if mode & 0o077:
        raise AgentConfigError(
            source,
            "credential_file",
            f"{path} is readable by others (mode {mode & 0o777:o}); run chmod 600 {path}",
        )
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key.strip() == URL_VARIABLE:
            return value.strip()
    raise AgentConfigError(source, "credential_file", f"{path} has no {URL_VARIABLE}=<url> line")


def _file_values(file: Path) -> tuple[dict[str, Any], dict[str, str]]:
    source = str(file)
    try:
        doc = tomllib.loads(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise AgentConfigError(source, "", f"cannot read the agent config: {exc.strerror or exc}") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise AgentConfigError(source, "", f"not valid TOML: {exc}") from exc
    table = doc.get(TABLE)
    if not isinstance(table, dict):
        raise AgentConfigError(source, "", f"missing the [{TABLE}] table")
    base = file.resolve().parent
    values = {name: _relative_to(base, name, value) for name, value in table.items()}
    return values, {name: f"{source}: [{TABLE}]" for name in table}


def _relative_to(base: Path, name: str, value: Any) -> Any:
    if name in _PATH_FIELDS and isinstance(value, str):
        return str(base / Path(value).expanduser())
    if name == "sandbox_roots" and isinstance(value, list):
        return [str(base / Path(v).expanduser()) if isinstance(v, str) else v for v in value]
    return value


def _env_values(env: Mapping[str, str]) -> dict[str, tuple[Any, str]]:
    found: dict[str, tuple[Any, str]] = {}
    for name in AgentConfig.model_fields:
        var = ENV_PREFIX + name.upper()
        raw = env.get(var)
        if raw in (None, ""):
            continue
        found[name] = (_parse_list(var, raw) if name in _LIST_FIELDS else raw, var)
    return found


def _parse_list(var: str, raw: str) -> list[Any]:
    """A JSON list, or comma-separated values."""
    if raw.lstrip().startswith("["):
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise AgentConfigError(f"{var} (environment)", "", f"not a JSON list: {exc.msg}") from exc
        if not isinstance(value, list):
            raise AgentConfigError(f"{var} (environment)", "", "must be a JSON list")
        return value
    return [part.strip() for part in raw.split(",") if part.strip()]


def _config_error(exc: ValidationError, sources: Mapping[str, str], default_source: str) -> AgentConfigError:
    err = exc.errors()[0]
    loc = [str(part) for part in err["loc"]]
    field = loc[0] if loc else ""
    message = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        known = ", ".join(AgentConfig.model_fields)
        message = f"unknown field (known fields: {known})"
    elif err["type"] == "missing":
        message = "is required"
    source = sources.get(field, f"{default_source}: [{TABLE}]")
    return AgentConfigError(source, ".".join(loc) or "(config)", message)
