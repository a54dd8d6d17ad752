"""The registry and the server MCP config are reloaded while running (issue 10 item 5).

Real brain and pool processes, real MCP servers: a second server is added to the
mcpServers file while the stack runs; the brain rebuilds its registry, the pool starts the
new server for its next call, and what changed is published for `clients` / `reload`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from brain.core.models import Location, ToolSpec, TreeStatus
from brain.core.snapshot import RegistrySnapshot
from brain.runtime.reload import RELOAD_REQUEST_KEY, registry_changes
from tests.conftest import demo_server, tree, wait_for_tree, wait_until, write_mcp_config
from tests.integration.test_cli import vancetope


def snapshot(brain) -> RegistrySnapshot:
    raw = brain.hot.get_registry()
    assert raw is not None
    return RegistrySnapshot.model_validate(raw)


def test_a_server_added_to_the_mcp_config_is_used_without_a_restart(
    tmp_path: Path, stack_factory, brain_factory
) -> None:
    config = write_mcp_config(tmp_path / "server-mcp.json", {"a": demo_server()})
    stack = stack_factory(services=("brain", "server-pool"), mcp_config=config)
    before = snapshot(brain_factory(stack))
    assert "a.add" in before.tools and "b.add" not in before.tools

    write_mcp_config(config, {"a": demo_server(), "b": demo_server()})  # the brain watches the file
    after = wait_until(
        lambda: (s := snapshot(brain_factory(stack))).loaded_at != before.loaded_at and s, 120, "a reload"
    )
    assert "b.add" in after.tools
    assert "added: " in after.changes[0] and "b.add" in after.changes[0]
    assert any(line.startswith("clash: tool name 'add' is offered by a.add, b.add") for line in after.changes)
    # `vancetope reload` after the brain's own reload: what was applied, not "no tool changed" alone.
    said = vancetope("reload", data=stack.settings.data_dir)
    assert said.returncode == 0, said.stdout + said.stderr
    text = " ".join(said.stdout.split())
    assert "no tool changed since the last reload at" in text and "b.add" in text, text

    brain = brain_factory(stack)  # a new connection routes with the new registry
    rec = brain.scheduler.submit(
        tree({"id": "after-reload", "tasks": [{"id": "sum", "tool": "b.add", "args": {"a": 2, "b": 5}}]})
    )
    assert wait_for_tree(brain, rec.tree_id, timeout=120).status is TreeStatus.DONE
    assert brain.store.get_task(rec.tree_id, "sum").result == 7


def test_a_reload_request_reloads_and_a_broken_file_keeps_the_registry_in_use(
    tmp_path: Path, stack_factory, brain_factory
) -> None:
    config = write_mcp_config(tmp_path / "server-mcp.json", {"a": demo_server()})
    stack = stack_factory(services=("brain", "server-pool"), mcp_config=config)
    brain = brain_factory(stack)
    first = snapshot(brain)
    brain.hot.r.set(RELOAD_REQUEST_KEY, b"1")  # what `vancetope reload` does
    second = wait_until(lambda: (s := snapshot(brain)).loaded_at != first.loaded_at and s, 120, "a reload")
    assert second.changes == ["no tool changed"] and set(second.tools) == set(first.tools)

    config.write_text("{ not json")
    third = wait_until(
        lambda: (s := snapshot(brain)).loaded_at != second.loaded_at and s, 120, "a failed reload"
    )
    assert third.changes[0].startswith("reload failed: ") and set(third.tools) == set(first.tools)
    said = vancetope("reload", data=stack.settings.data_dir)  # it said "reloaded" and exited 0
    assert said.returncode == 2 and "registry reloaded" not in said.stdout, said.stdout + said.stderr
    assert "reload failed: " in said.stderr and "the registry in use is unchanged" in said.stderr
    failed = snapshot(brain)  # the reload `vancetope reload` asked for
    write_mcp_config(config, {"a": demo_server()})  # fixed: back to what it was
    fourth = wait_until(lambda: (s := snapshot(brain)).loaded_at != failed.loaded_at and s, 120, "a reload")
    assert fourth.changes == ["no tool changed"]
    rec = brain_factory(stack).scheduler.submit(
        tree({"id": "still-there", "tasks": [{"id": "sum", "tool": "add", "args": {"a": 1, "b": 1}}]})
    )
    assert wait_for_tree(brain, rec.tree_id, timeout=120).status is TreeStatus.DONE


def test_what_a_reload_changed_in_words() -> None:
    def spec(name: str, timeout: float | None = None) -> ToolSpec:
        return ToolSpec(name=name, location=Location.SERVER, timeout_s=timeout)

    old = RegistrySnapshot(tools={"a": spec("a"), "b": spec("b"), "c": spec("c")})
    new = RegistrySnapshot(tools={"a": spec("a"), "c": spec("c", 5), "d": spec("d")})
    assert registry_changes(old, new) == ["added: d", "removed: b", "changed: c"]
    assert registry_changes(old, old) == ["no tool changed"]


def test_brain_log_holds_a_failed_servers_stderr_at_start_and_after_a_reload(
    tmp_path: Path, stack_factory, brain_factory
) -> None:
    """Issue 22: `explain` showed why a server failed (its stderr); brain.log did not."""
    gone = tmp_path / "gone" / "weather_server.py"
    broken = {"command": sys.executable, "args": [str(gone)]}
    config = write_mcp_config(tmp_path / "server-mcp.json", {"weather": broken})
    stack = stack_factory(services=("brain",), mcp_config=config)
    log = stack.settings.data_dir / "logs" / "brain.log"

    def failures() -> list[str]:
        text = log.read_text()
        return [
            part
            for part in text.split("MCP server 'weather' failed to start")[1:]
            if "its stderr ended with" in part
        ]

    started = wait_until(lambda: failures(), 120, "the failure in brain.log")
    assert str(gone) in started[0] and "No such file or directory" in started[0], log.read_text()
    before = snapshot(brain_factory(stack))
    write_mcp_config(config, {"weather": broken, "a": demo_server()})
    wait_until(lambda: snapshot(brain_factory(stack)).loaded_at != before.loaded_at, 120, "a reload")
    assert len(wait_until(lambda: len(failures()) >= 2 and failures(), 120, "the reload's failure")) >= 2
