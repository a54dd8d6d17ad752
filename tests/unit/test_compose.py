"""compose.yaml names only commands that exist, and only settings the code reads."""

from __future__ import annotations

import importlib.util
import tomllib
from pathlib import Path

import pytest
import yaml

from brain.cli import cli
from brain.config import ENV_PREFIX, Settings
from brain.hot.acl import COMPONENT_RULES
from brain.hot.sentinel_acl import sentinel_rules

ROOT = Path(__file__).resolve().parents[2]


def compose() -> dict:
    return yaml.safe_load((ROOT / "compose.yaml").read_text())


def sentinel_variant() -> dict:
    """compose.sentinel.yaml over compose.yaml, as `docker compose -f compose.yaml -f
    compose.sentinel.yaml` merges them: a service's mappings merged, its command replaced."""
    merged = compose()
    override = yaml.safe_load((ROOT / "compose.sentinel.yaml").read_text())
    for name, service in override["services"].items():
        base = merged["services"].setdefault(name, {})
        for key, value in service.items():
            if isinstance(value, dict) and isinstance(base.get(key), dict):
                base[key] = {**base[key], **value}
            elif isinstance(value, list) and key == "depends_on":
                base[key] = [*base.get(key, []), *value]
            else:
                base[key] = value
    return merged


VARIANTS = pytest.mark.parametrize("variant", [compose, sentinel_variant], ids=["compose", "sentinel"])


def scripts() -> dict[str, str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


@VARIANTS
def test_every_compose_command_is_an_entry_point_subcommand_or_celery_app_module(variant) -> None:
    for name, service in variant()["services"].items():
        command = service.get("command")
        if command is None or "image" in service:
            continue
        program = command[0]
        if program == "vancetope":
            assert "vancetope" in scripts()
            assert command[1] in cli.commands, f"{name}: `vancetope {command[1]}` is not a subcommand"
        elif program == "celery":
            module = command[command.index("-A") + 1]
            assert importlib.util.find_spec(module) is not None, f"{name}: no module {module}"
        else:
            raise AssertionError(f"{name}: unexpected program {program!r}")


@VARIANTS
def test_compose_environment_uses_the_settings_names(variant) -> None:
    from brain.stack.flowerauth import WEB_URL_VARIABLE as FLOWER_WEB_URL
    from brain.stack.webauth import BASIC_AUTH_VARIABLE as WEB_BASIC_AUTH

    # And the web view's password, which brain.web reads from its environment, not a setting,
    # and the web view's URL Flower links, which brain.flowerapp reads from its environment.
    known = {ENV_PREFIX + field.upper() for field in Settings.model_fields} | {WEB_BASIC_AUTH, FLOWER_WEB_URL}
    for name, service in variant()["services"].items():
        for var in service.get("environment") or {}:
            if var.startswith(ENV_PREFIX):
                assert var in known, f"{name}: {var} is not a setting"


def test_compose_redis_users_are_the_stacks_component_rules_and_default_is_off() -> None:
    from brain.hot.acl import COMPONENT_RULES

    command = compose()["services"]["redis"]["command"]
    users: dict[str, list[str]] = {}
    for i, arg in enumerate(command):
        if arg == "--user":
            end = next((j for j in range(i + 1, len(command)) if command[j].startswith("--")), len(command))
            name, *rules = command[i + 1 : end]
            users[name] = rules
    assert users.pop("default") == ["off"]
    for name, rules in users.items():
        assert rules[0] == "on" and rules[1].startswith(">${"), f"{name}: password from .env"
        assert tuple(rules[2:]) == COMPONENT_RULES[name], f"{name}: differs from brain/hot/acl.py"
    assert set(users) == set(COMPONENT_RULES)
    from brain.stack.embedded import SERVICE_USERS

    for service in ("brain", "server-pool", "flower", "beat", "gateway"):
        url = compose()["services"][service]["environment"]["VANCETOPE_REDIS_URL"]
        # each as its own user, the one the embedded stack gives it (beat: vt-beat, not the pool's)
        assert url.startswith(f"redis://{SERVICE_USERS[service]}:"), f"{service} connects as its own user"


def test_compose_mongodb_asks_for_a_password_from_env_and_every_store_url_carries_it() -> None:
    """Issue 20 M6: compose's MongoDB had no authentication."""
    services = compose()["services"]
    mongo = services["mongo"]["environment"]
    for var in ("MONGO_INITDB_ROOT_USERNAME", "MONGO_INITDB_ROOT_PASSWORD"):
        assert mongo[var].startswith("${") and ":?set it in .env}" in mongo[var], var
    user, password = (
        mongo[v][2:].split(":?")[0] for v in ("MONGO_INITDB_ROOT_USERNAME", "MONGO_INITDB_ROOT_PASSWORD")
    )
    for name, service in services.items():
        url = (service.get("environment") or {}).get("VANCETOPE_MONGO_URL")
        if url is None or name == "gateway":  # a read-only user: tested below
            continue
        assert url.startswith(
            f"mongodb://${{{user}:?set it in .env}}:${{{password}:?set it in .env}}@mongo:"
        ), name
        assert url.endswith("?authSource=admin"), name
    assert "ports" not in services["mongo"], "MongoDB is reached inside the compose network only"


def test_compose_gives_the_gateway_a_mongodb_user_that_may_only_read() -> None:
    """The gateway opens the store read-only (brain.store.open_store); its credential must not
    be able to write either: a user with MongoDB's read role, made by deploy/mongo-init."""
    services = compose()["services"]
    url = services["gateway"]["environment"]["VANCETOPE_MONGO_URL"]
    assert url.startswith(
        "mongodb://${VANCETOPE_MONGO_GATEWAY_USER:?set it in .env}:${VANCETOPE_MONGO_GATEWAY_PASSWORD:?set it in .env}@mongo:"
    )
    mongo = services["mongo"]
    for var in ("USER", "PASSWORD"):
        assert (
            mongo["environment"][f"MONGO_GATEWAY_{var}"]
            == "${VANCETOPE_MONGO_GATEWAY_" + var + ":?set it in .env}"
        )
    assert "./deploy/mongo-init:/docker-entrypoint-initdb.d:ro" in mongo["volumes"]
    script = (ROOT / "deploy" / "mongo-init" / "10-gateway-reader.js").read_text()
    assert "process.env.MONGO_GATEWAY_USER" in script and "process.env.MONGO_GATEWAY_PASSWORD" in script
    assert 'roles: [{ role: "read", db: "vancetope" }]' in script


def test_compose_redis_runs_with_the_embedded_stacks_limits() -> None:
    """Issue 20 M1: maxmemory with noeviction, and values no larger than a message."""
    from brain.stack.redis_server import DEFAULT_MAXMEMORY, redis_limits

    command = compose()["services"]["redis"]["command"]
    options = dict(zip(command[1::2], command[2::2], strict=False))
    assert options["--maxmemory-policy"] == "noeviction"
    assert options["--maxmemory"] == "${VANCETOPE_REDIS_MAXMEMORY:-" + DEFAULT_MAXMEMORY + "}"
    assert DEFAULT_MAXMEMORY == Settings().redis_maxmemory
    limits = redis_limits(DEFAULT_MAXMEMORY, Settings().max_result_bytes).args()
    for option in ("--proto-max-bulk-len", "--client-query-buffer-limit"):
        assert options[option] == limits[limits.index(option) + 1], option
    at, ours = command.index("--client-output-buffer-limit"), limits.index("--client-output-buffer-limit")
    assert command[at + 1 : at + 5] == limits[ours + 1 : ours + 5]


def test_compose_flower_asks_for_a_password_from_env_on_the_dashboard_and_the_api() -> None:
    from brain.stack.embedded import flower_argv
    from brain.stack.flowerauth import BASIC_AUTH_VARIABLE, UNAUTHENTICATED_API_VARIABLE, users_of

    flower = compose()["services"]["flower"]
    env = flower["environment"]
    assert UNAUTHENTICATED_API_VARIABLE not in env, "the API must ask for the password too"
    user, _, password = env[BASIC_AUTH_VARIABLE].partition(":")
    assert users_of(env[BASIC_AUTH_VARIABLE]) == (user,)
    assert password.startswith("${") and ":?" in password, "the password comes from .env, never this file"
    ours = flower_argv(5555)
    module = ours[ours.index("-A") + 1]  # brain.flowerapp: /api/workers lists client agents too
    assert flower["command"][:3] == ["celery", "-A", module], "Flower as `vancetope up` runs it"
    assert ours[-1] in flower["command"], "the tasks page shows each task's tool and argument names"


def test_compose_runs_the_production_shape_two_named_pools_beat_and_the_vault_key() -> None:
    """Issue 11 item 8: Redis (AOF, ACL users), MongoDB, the brain, pools, beat, Flower."""
    from brain.config import load_settings

    services = compose()["services"]
    redis_command = services["redis"]["command"]
    assert redis_command[redis_command.index("--appendonly") + 1] == "yes"
    assert {"redis", "mongo", "brain", "server-pool", "beat", "flower"} <= set(services)
    pool_commands = [
        s["command"]
        for s in services.values()
        if s.get("command", [])[:3] == ["vancetope", "worker", "--pool"]
    ]
    named = sorted(command[3] for command in pool_commands)
    assert len(named) == 2, pool_commands
    # the pools those services serve are configured for every component, and the settings parse
    env = {k: str(v) for k, v in services["brain"]["environment"].items() if k.startswith("VANCETOPE_")}
    env["VANCETOPE_SCHEDULES"] = (
        env["VANCETOPE_SCHEDULES"].removeprefix("${VANCETOPE_SCHEDULES:-").removesuffix("}")
    )
    env["VANCETOPE_VAULT_KEY"] = "x"
    env.pop("VANCETOPE_REDIS_URL")
    settings = load_settings(env=env, cwd=ROOT / "tests")
    assert sorted(p.name for p in settings.pools) == named
    assert [s.name for s in settings.schedules] == ["nightly"]
    assert services["beat"]["command"] == ["vancetope", "beat"]
    # the vault key reaches what resolves ${vault:NAME}, and nothing else
    for name, service in services.items():
        has_key = "VANCETOPE_VAULT_KEY" in (service.get("environment") or {})
        resolves = name == "brain" or service.get("command", [])[:2] == ["vancetope", "worker"]
        assert has_key == resolves, name


def test_compose_web_view_asks_for_a_password_and_acts_as_the_brain_without_the_vault_key() -> None:
    """Its actions (cancel, approve tools) are the CLI's: the brain's Redis user and the store's
    writing user (docs/web.md says so), never the vault key."""
    services = compose()["services"]
    web = services["web"]
    env = web["environment"]
    assert env["VANCETOPE_WEB_BASIC_AUTH"] == "vancetope:${VANCETOPE_WEB_PASSWORD:?set it in .env}"
    assert env["VANCETOPE_MONGO_URL"] == services["brain"]["environment"]["VANCETOPE_MONGO_URL"]
    assert env["VANCETOPE_REDIS_URL"] == services["brain"]["environment"]["VANCETOPE_REDIS_URL"]
    assert "VANCETOPE_VAULT_KEY" not in env
    assert web["ports"] == ["127.0.0.1:8766:8766"]


def _sentinel_extras() -> list[str]:
    """What compose.sentinel.yaml adds to compose.yaml's redis command on both nodes."""
    primary = sentinel_variant()["services"]["redis"]["command"]
    ours = compose()["services"]["redis"]["command"]
    assert primary[: len(ours)] == ours, "both nodes run compose.yaml's redis command, its users and limits"
    return primary[len(ours) :]


def test_compose_sentinel_variant_has_a_primary_a_replica_and_three_sentinels_watching_it() -> None:
    """Issue 28: one primary, one replica, three sentinels, each node with compose.yaml's users."""
    services = sentinel_variant()["services"]
    extras = _sentinel_extras()
    replica = services["redis-replica"]["command"]
    follow = ["--replicaof", "redis", "6379", "--replica-announce-ip", "redis-replica"]
    assert replica == [*compose()["services"]["redis"]["command"], *extras, *follow]
    # Either node may follow the other after a failover, as vt-replica; sentinels log in as vt-sentinel.
    assert extras[extras.index("--masteruser") + 1] == "vt-replica"
    users = [extras[i + 1] for i, arg in enumerate(extras) if arg == "--user"]
    assert users == ["vt-replica", "vt-sentinel"]
    for user in users:
        secret = extras[extras.index(user) + 2]
        assert secret.startswith(">${") and ":?set it in .env}" in secret, f"{user}: password from .env"
    sentinels = [name for name in services if name.startswith("redis-sentinel-")]
    assert len(sentinels) == 3
    for name in sentinels:
        script = services[name]["command"][2]
        assert "sentinel monitor mymaster redis 6379 2" in script, name
        assert "sentinel auth-user mymaster vt-sentinel" in script, name
        # Its config (the master it last learnt, the clients' users the brain gave it) outlives a
        # restart: on a volume, written from these lines only when missing.
        assert services[name]["volumes"] == [f"{name}-data:/data"], name
        assert script.startswith("[ -f /data/sentinel.conf ] || cat > /data/sentinel.conf <<EOF"), name
        # No default user: each component logs in as itself, with brain/hot/sentinel_acl.py's rules.
        lines = script.splitlines()
        assert "user default off resetchannels -@all" in lines, name
        assert "sentinel sentinel-user vt-sentinel" in lines, name
        for user in COMPONENT_RULES:
            rules = " ".join(sentinel_rules(manages_users=user == "vt-brain"))
            assert any(line.startswith(f"user {user} on >$") and line.endswith(f" {rules}") for line in lines), (
                name, user,
            )  # fmt: skip


def test_compose_sentinel_variant_points_every_component_at_the_sentinels_as_its_own_user() -> None:
    """Each component keeps compose.yaml's Redis user and password, on kombu's sentinel:// URL
    naming all three sentinels, with the master's name the sentinels monitor."""
    plain, variant = compose()["services"], sentinel_variant()["services"]
    with_redis = [
        name for name, service in plain.items() if "VANCETOPE_REDIS_URL" in (service.get("environment") or {})
    ]
    assert with_redis, "compose.yaml's components connect to Redis"
    for name in with_redis:
        env = variant[name]["environment"]
        before = plain[name]["environment"]["VANCETOPE_REDIS_URL"]
        credentials = before.removeprefix("redis://").split("@")[0]
        parts = env["VANCETOPE_REDIS_URL"].split(";")
        assert parts[0] == f"sentinel://{credentials}@redis-sentinel-1:26379", name
        assert parts[1:] == ["sentinel://redis-sentinel-2:26379", "sentinel://redis-sentinel-3:26379"], name
        assert env["VANCETOPE_REDIS_SENTINEL_MASTER"] == "mymaster", name
        assert {"redis-sentinel-1", "redis-sentinel-2", "redis-sentinel-3"} <= set(
            variant[name]["depends_on"]
        )
    if "redis_sentinel_master" in Settings.model_fields:  # the setting's default, once it exists
        assert Settings.model_fields["redis_sentinel_master"].default == "mymaster"
