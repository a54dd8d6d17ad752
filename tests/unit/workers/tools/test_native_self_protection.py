"""Native tools: .git under every spelling, hard links and the agent's own files (pure and local files)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from workers.errors import ToolFailed
from workers.tools.builtin import BuiltinContext
from workers.tools.native import (
    AgentFileRefused,
    ControlFileRefused,
    HardLinkRefused,
    Sandbox,
    canonical_name,
    native_tools,
)


@pytest.mark.parametrize(
    ("name", "folded"),
    [
        (".git", ".git"), (".GIT", ".git"), (".git.", ".git"), (".git ", ".git"), (".Git. . ", ".git"),
        (".git::$INDEX_ALLOCATION", ".git"), ("GIT~1", ".git"), (".gitattributes.", ".gitattributes"),
        ("git", "git"), ("notes.txt", "notes.txt"), ("a~b", "a~b"),
    ],
)  # fmt: skip
def test_canonical_name(name: str, folded: str) -> None:
    assert canonical_name(name) == folded


def run(tool: str, sandbox: Sandbox, **args: object) -> object:
    return native_tools(sandbox, shell_enabled=False)[tool].run(dict(args), BuiltinContext())


@pytest.mark.parametrize("alias", [".git./config", ".git /config", ".GIT /hooks/pre-commit", "sub/.Git./x"])
def test_git_aliases_are_control_data(tmp_path: Path, alias: str) -> None:
    with pytest.raises(ControlFileRefused):
        run("write_local_file", Sandbox([tmp_path]), path=alias, content="[core]\n\tfsmonitor = touch x\n")
    assert not any(p.is_file() for p in tmp_path.rglob("*"))


def test_a_hard_linked_file_is_neither_read_nor_written(tmp_path: Path) -> None:
    outside, sandbox = tmp_path / "outside.txt", tmp_path / "sandbox"
    sandbox.mkdir()
    outside.write_text("secret outside\n")
    os.link(outside, sandbox / "alias.txt")
    for tool, args in (("read_local_file", {}), ("write_local_file", {"content": "overwritten"})):
        with pytest.raises(HardLinkRefused, match="2 hard links"):
            run(tool, Sandbox([sandbox]), path="alias.txt", **args)
    assert outside.read_text() == "secret outside\n"
    (sandbox / "plain.txt").write_text("ok")
    assert run("read_local_file", Sandbox([sandbox]), path="plain.txt")["content"] == "ok"  # type: ignore[index]


def test_the_agents_own_files_are_refused_even_inside_a_root(tmp_path: Path) -> None:
    (tmp_path / "state" / "consent").mkdir(parents=True)
    (tmp_path / "mcp.json").write_text("{}")
    sandbox = Sandbox([tmp_path], {"mcp.json": tmp_path / "mcp.json", "state directory": tmp_path / "state"})
    for path in ("mcp.json", str(tmp_path / "state" / "consent" / "approved_servers.json"), "state"):
        with pytest.raises(AgentFileRefused, match="the client agent's own"):
            sandbox.resolve("write_local_file", path)
    with pytest.raises(ToolFailed):
        run("list_directory", sandbox, path="state")
    assert run("write_local_file", sandbox, path="mcp.json.bak", content="x") is not None
    assert (tmp_path / "mcp.json").read_text() == "{}"
