"""client_agent.git_server: an mcp-server-git starts only on a repository it cannot see past."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from client_agent.git_server import (
    confine_git_servers,
    is_git_server,
    problem,
    repo_path_problem,
    repository_arg,
    with_safe_git_env,
)
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


@pytest.mark.parametrize(
    ("repo_path", "refused"),
    [
        ("sandbox", False),
        ("sandbox/", False),
        ("sandbox/../sandbox", False),
        ("sandbox/evil", True),  # a folder below it, which a tree can shape into a bare repository
        ("sandbox/evil/..", False),
        (".", True),
        (None, True),
        (42, True),
    ],
)
def test_a_call_is_held_to_the_servers_own_repository(
    tmp_path: Path, repo_path: object, refused: bool
) -> None:
    (tmp_path / "sandbox" / "evil").mkdir(parents=True)
    git = spec(tmp_path, "--repository", "sandbox")
    why = repo_path_problem(git, {} if repo_path is None else {"repo_path": repo_path})
    assert (why is not None) is refused, why
    if refused:
        assert f"is not this MCP server's repository {(tmp_path / 'sandbox').resolve()}" in (why or "")


def test_another_server_is_not_held_to_a_repository(tmp_path: Path) -> None:
    other = StdioServerSpec(command="mcp-server-time", cwd=str(tmp_path))
    assert repo_path_problem(other, {"repo_path": "/anywhere"}) is None


def test_a_git_server_opens_no_bare_repository_after_the_users_own_git_config(tmp_path: Path) -> None:
    mine = spec(
        tmp_path,
        "--repository",
        "r",
        GIT_CONFIG_COUNT="1",
        GIT_CONFIG_KEY_0="user.name",
        GIT_CONFIG_VALUE_0="me",
    )
    env = with_safe_git_env(mine).env
    assert env["GIT_CONFIG_COUNT"] == "2" and env["GIT_CONFIG_KEY_0"] == "user.name"
    assert (env["GIT_CONFIG_KEY_1"], env["GIT_CONFIG_VALUE_1"]) == ("safe.bareRepository", "explicit")
    assert with_safe_git_env(spec(tmp_path, "--repository", "r")).env["GIT_CONFIG_COUNT"] == "1"
