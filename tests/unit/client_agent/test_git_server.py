"""client_agent.git_server: an mcp-server-git starts only on a repository it cannot see past."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from client_agent.git_server import confine_git_servers, is_git_server, problem, repository_arg
from workers.mcp_config import MCPConfig, StdioServerSpec


def git_init(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    return path


@pytest.mark.parametrize(
    ("args", "value"),
    [
        (["--repository", "a"], "a"), (["-r", "a"], "a"), (["--repository=a"], "a"), (["-ra"], "a"),
        (["-v", "--repository", "a", "--repository", "b"], "b"), ([], None), (["--repository"], None),
    ],
)  # fmt: skip
def test_repository_arg(args: list[str], value: str | None) -> None:
    assert repository_arg(args) == value


@pytest.mark.parametrize(
    ("command", "args", "expected"),
    [
        ("/venv/bin/mcp-server-git", [], True), (sys.executable, ["-m", "mcp_server_git"], True),
        ("uvx", ["mcp-server-git", "-r", "x"], True), ("mcp-server-time", [], False),
    ],
)  # fmt: skip
def test_is_git_server(command: str, args: list[str], expected: bool) -> None:
    assert is_git_server(StdioServerSpec(command=command, args=args)) is expected


def spec(cwd: Path, *args: str, **env: str) -> StdioServerSpec:
    return StdioServerSpec(command="mcp-server-git", args=list(args), cwd=str(cwd), env=env)


def test_a_folder_inside_another_repository_is_refused_naming_it(tmp_path: Path) -> None:
    outer = git_init(tmp_path / "outer")
    (outer / "sandbox").mkdir()
    why = problem(spec(outer, "--repository", "sandbox"))
    assert why is not None and f"enclosing repository {outer.resolve()}" in why and "git init" in why


def test_the_top_of_a_repository_is_accepted_even_inside_another(tmp_path: Path) -> None:
    outer = git_init(tmp_path / "outer")
    git_init(outer / "sandbox")
    assert problem(spec(outer, "--repository", "sandbox")) is None
    assert problem(spec(tmp_path, "-r", str(outer))) is None


def test_layouts_that_read_another_repositorys_data_are_refused(tmp_path: Path) -> None:
    elsewhere = git_init(tmp_path / "elsewhere")
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / ".git").write_text(f"gitdir: {elsewhere / '.git'}\n")
    assert "gitdir file" in (problem(spec(tmp_path, "-r", "linked")) or "")
    alternates = git_init(tmp_path / "alternates")
    (alternates / ".git" / "objects" / "info" / "alternates").write_text(str(elsewhere / ".git" / "objects"))
    assert "alternates" in (problem(spec(tmp_path, "-r", "alternates")) or "")
    bare = tmp_path / "bare"
    subprocess.run(["git", "init", "-q", "--bare", str(bare)], check=True)
    assert "bare repository" in (problem(spec(tmp_path, "-r", "bare")) or "")
    assert "GIT_DIR" in (problem(spec(tmp_path, "-r", "elsewhere", GIT_DIR=str(elsewhere / ".git"))) or "")
    assert "no --repository" in (problem(spec(tmp_path)) or "")


def test_confine_keeps_the_others_and_reports_the_refused(tmp_path: Path) -> None:
    outer = git_init(tmp_path / "outer")
    (outer / "sandbox").mkdir()
    time = StdioServerSpec(command="mcp-server-time")
    config = MCPConfig(source="mcp.json", servers={"git": spec(outer, "-r", "sandbox"), "time": time})
    kept, failures = confine_git_servers(config)
    assert list(kept.servers) == ["time"]
    assert [f.server for f in failures] == ["git"] and "not started (mcp-server-git)" in failures[0].message
