"""Named server pools: [[pools]] config, queue names, pool names in trees and registries
(brain.core.pools, brain.config), and the stack's process per pool (brain.stack.embedded)."""

from __future__ import annotations

from pathlib import Path

import pytest

from brain.config import load_settings
from brain.core.models import TaskRecord, TaskTree, ToolSpec
from brain.core.validation import check_tree
from brain.errors import ConfigError, InvalidRegistry, InvalidTaskTree
from brain.runtime.registry import build_registry
from brain.runtime.sweeps import server_queues
from brain.stack.embedded import pool_service, service_argvs
from tests.conftest import make_settings
from workers.contracts import pool_of_queue, pool_queue, queue_keys

POOLS_TOML = """
[vancetope]
server_concurrency = 3

[[pools]]
name = "gpu"
concurrency = 1

[[pools]]
name = "io"
"""


# --- configuration -----------------------------------------------------------------------


def test_pools_tables_beside_the_vancetope_table_are_read(tmp_path: Path) -> None:
    (tmp_path / "vancetope.toml").write_text(POOLS_TOML)
    settings = load_settings(env={}, cwd=tmp_path)
    assert [(p.name, p.concurrency, p.queue) for p in settings.pools] == [
        ("gpu", 1, "server.gpu"),
        ("io", 2, "server.io"),
    ]
    assert settings.server_concurrency == 3


def test_pools_travel_to_child_processes_as_json_and_come_back_the_same(tmp_path: Path) -> None:
    (tmp_path / "vancetope.toml").write_text(POOLS_TOML)
    settings = load_settings(env={}, cwd=tmp_path)
    env = settings.to_env()
    assert (
        load_settings(env={"VANCETOPE_POOLS": env["VANCETOPE_POOLS"]}, cwd=tmp_path / "x").pools
        == settings.pools
    )


def test_no_pools_table_means_only_the_default_pool(tmp_path: Path) -> None:
    assert load_settings(env={}, cwd=tmp_path).pools == ()


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ('[[pools]]\nname = "gpu"\n[[pools]]\nname = "gpu"\n', "pool 'gpu' is defined twice"),
        ('[[pools]]\nname = "default"\n', "'default' is the default pool (queue 'server'); set its size"),
        ('[[pools]]\nname = "g.pu"\n', "invalid pool name 'g.pu'"),
        ('[[pools]]\nname = "gpu"\nconcurrency = 0\n', "pools.0.concurrency"),
        ('[[pools]]\nname = "gpu"\nsize = 2\n', "pools.0.size: Extra inputs are not permitted"),
        ('pools = "gpu"\n', "pools must be [[pools]] tables"),
    ],
)
def test_a_bad_pools_table_is_a_config_error_naming_it(tmp_path: Path, toml: str, message: str) -> None:
    (tmp_path / "vancetope.toml").write_text(toml)
    with pytest.raises(ConfigError) as caught:
        load_settings(env={}, cwd=tmp_path)
    assert message in str(caught.value)


def test_a_bad_pools_env_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a JSON list of pools"):
        load_settings(env={"VANCETOPE_POOLS": "gpu"}, cwd=tmp_path)


# --- queues ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("pool", "queue"), [(None, "server"), ("default", "server"), ("gpu", "server.gpu")])
def test_pool_queues_and_back(pool: str | None, queue: str) -> None:
    assert pool_queue(pool) == queue
    assert pool_of_queue(queue) == (pool or "default")


@pytest.mark.parametrize("queue", ["brain", "client.laptop", "server.", "serverx", "server.a.b"])
def test_other_queues_belong_to_no_pool(queue: str) -> None:
    assert pool_of_queue(queue) is None


# --- pool names in trees and registries ---------------------------------------------------------

REGISTRY = {
    "train": ToolSpec(name="train", location="server", pool="gpu"),  # type: ignore[arg-type]
    "lost": ToolSpec(name="lost", location="server", pool="tpu"),  # type: ignore[arg-type]
    "echo": ToolSpec(name="echo", location="server"),  # type: ignore[arg-type]
}


def _tree(**fields: object) -> TaskTree:
    return TaskTree.model_validate({"id": "t", "tasks": [{"id": "a", "tool": "echo"}], **fields})


def test_a_tree_naming_configured_pools_is_valid() -> None:
    tree = _tree(
        pool="io", tasks=[{"id": "a", "tool": "train", "pool": "default"}, {"id": "b", "tool": "echo"}]
    )
    check_tree(tree, REGISTRY, source="t.yaml", pools={"gpu", "io"})


def test_unknown_pools_of_tree_task_and_tool_are_each_a_problem_naming_the_known_pools() -> None:
    tree = _tree(
        pool="batch", tasks=[{"id": "a", "tool": "echo", "pool": "tpu"}, {"id": "b", "tool": "lost"}]
    )
    with pytest.raises(InvalidTaskTree) as caught:
        check_tree(tree, REGISTRY, source="t.yaml", pools={"gpu"})
    tail = "is not configured (pools: default, gpu); add a [[pools]] table with name = "
    assert caught.value.problems == [
        f"pool: pool 'batch' {tail}\"batch\" to vancetope.toml, or name a configured pool",
        f"task 'a': pool 'tpu' {tail}\"tpu\" to vancetope.toml, or name a configured pool",
        f"task 'b': tool 'lost' names pool 'tpu', which {tail}\"tpu\" to vancetope.toml, or name a configured pool",
    ]


def test_pools_are_not_checked_when_the_caller_does_not_know_them() -> None:
    check_tree(_tree(pool="batch"), REGISTRY, source="t.yaml")


def test_a_client_tool_cannot_name_a_pool() -> None:
    with pytest.raises(ValueError, match="location 'client' never runs there"):
        ToolSpec.model_validate({"name": "x", "location": "client", "pool": "gpu"})


def test_a_registry_naming_an_unconfigured_pool_is_refused_and_a_known_one_is_published(
    tmp_path: Path,
) -> None:
    path = tmp_path / "registry.yaml"
    path.write_text("tools:\n  - name: echo\n    location: server\n    pool: gpu\n")
    with pytest.raises(InvalidRegistry, match="tool 'echo' names pool 'gpu', which is not configured"):
        build_registry(make_settings(tmp_path, registry=path), discover=False)
    registry = build_registry(make_settings(tmp_path, registry=path, pools=[{"name": "gpu"}]), discover=False)
    assert (registry.pools, registry.tools["echo"].pool) == (["gpu"], "gpu")


# --- the stack's processes ----------------------------------------------------------------------


def test_the_stack_runs_one_worker_per_pool_on_its_queue_with_its_concurrency(tmp_path: Path) -> None:
    (tmp_path / "vancetope.toml").write_text(POOLS_TOML)
    argvs = dict(service_argvs(load_settings(env={}, cwd=tmp_path)))
    assert [n for n in argvs if n.startswith("server-pool")] == [
        "server-pool",
        "server-pool-gpu",
        "server-pool-io",
    ]

    def opts(argv: list[str]) -> tuple[str, str, str]:
        return argv[argv.index("-Q") + 1], argv[argv.index("-n") + 1], argv[argv.index("-c") + 1]

    assert opts(argvs["server-pool"]) == ("server", "server@%h", "3")
    assert opts(argvs["server-pool-gpu"]) == ("server.gpu", "server-gpu@%h", "1")
    assert opts(argvs["server-pool-io"]) == ("server.io", "server-io@%h", "2")
    assert (pool_service(None), pool_service("default"), pool_service("gpu")) == (
        "server-pool",
        "server-pool",
        "server-pool-gpu",
    )


def test_the_reconciler_looks_on_every_pools_queue_and_on_pools_records_still_name() -> None:
    records = [
        TaskRecord(tree_id="t", task_id="a", tool="x", pool="old"),  # a pool since removed from the config
        TaskRecord(tree_id="t", task_id="b", tool="x"),
        TaskRecord(tree_id="t", task_id="c", tool="x", client_id="laptop", pool="ignored"),
    ]
    queues = ["server", "server.gpu", "server.old"]
    assert server_queues(records, ["gpu"]) == ["brain", *(key for q in queues for key in queue_keys(q))]
