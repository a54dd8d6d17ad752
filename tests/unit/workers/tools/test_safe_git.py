"""workers.tools.safe_git: which config keys name programs (table), the environment git gets, and
git_status in real hostile repositories: a marker file the hostile config would create never appears."""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from workers.contracts import ToolCall, ToolResult, ToolType
from workers.execute import execute
from workers.tools.native import Sandbox, native_tools
from workers.tools.safe_git import ALWAYS, git_env, honours_overrides, overrides, parse_names, runs_a_program


@pytest.mark.parametrize(
    ("name", "runs"),
    [
        ("filter.x.clean", True),
        ("filter.My.Driver.smudge", True),
        ("filter.x.process", True),
        ("filter.a=b.clean", True),
        ("filter.x.required", False),
        ("core.fsmonitor", True),
        ("core.hookspath", True),
        ("core.pager", True),
        ("pager.status", True),
        ("core.sshcommand", True),
        ("core.editor", True),
        ("diff.external", True),
        ("diff.pdf.textconv", True),
        ("diff.pdf.command", True),
        ("merge.ours.driver", True),
        ("credential.helper", True),
        ("credential.https://example.com.helper", True),
        ("gpg.program", True),
        ("gpg.ssh.program", True),
        ("remote.origin.uploadpack", True),
        ("submodule.lib.update", True),
        ("difftool.vim.path", True),
        ("include.path", False),
        ("includeif.gitdir:~/work/.path", False),
        ("user.name", False),
        ("core.bare", False),
        ("remote.origin.url", False),
    ],
)
def test_runs_a_program_knows_the_keys_that_name_programs(name: str, runs: bool) -> None:
    assert runs_a_program(name) is runs


def test_overrides_always_turn_off_hooks_and_fsmonitor_and_blank_each_program_key_once() -> None:
    names = ["user.name", "core.fsmonitor", "filter.a=b.clean", "filter.a=b.clean", "core.hooksPath"]
    assert overrides([]) == list(ALWAYS)
    assert overrides(names) == [*ALWAYS, ("filter.a=b.clean", "")]


def test_git_env_reads_no_user_or_system_config_and_passes_overrides_as_separate_key_and_value() -> None:
    env = git_env({"PATH": "/bin"}, Path("/home/u"), [("core.fsmonitor", "false"), ("filter.a=b.clean", "")])
    assert env["GIT_CONFIG_NOSYSTEM"] == "1" and env["GIT_CONFIG_GLOBAL"] == "/dev/null"
    assert env["GIT_CEILING_DIRECTORIES"] == "/home/u" and env["PATH"] == "/bin"
    assert (env["GIT_CONFIG_COUNT"], env["GIT_CONFIG_KEY_1"], env["GIT_CONFIG_VALUE_1"]) == (
        "2", "filter.a=b.clean", ""
    )  # fmt: skip


def test_a_git_that_did_not_list_the_always_overrides_is_not_trusted() -> None:
    assert honours_overrides(["core.bare", "core.fsmonitor", "core.hooksPath"])
    assert not honours_overrides(["core.bare", "filter.x.clean"])


def test_parse_names_splits_nul_terminated_keys_even_with_newlines_in_them() -> None:
    assert parse_names(b"core.bare\x00filter.a\nb.clean\x00") == ["core.bare", "filter.a\nb.clean"]


# --- hostile repositories ------------------------------------------------------------------------


def git(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, timeout=30, check=False)


def touch(marker: Path) -> str:
    return f"touch {shlex.quote(str(marker))}"


def clean_filter(repo: Path, marker: Path) -> None:
    git(repo, "config", "filter.x.clean", f"{touch(marker)}; cat")


def included_process_filter(repo: Path, marker: Path) -> None:
    (repo / ".git" / "evil.config").write_text(f'[filter "x"]\n\tprocess = {touch(marker)}\n')
    git(repo, "config", "include.path", "evil.config")


def filter_with_equals_in_its_name(repo: Path, marker: Path) -> None:
    (repo / ".git" / "info").mkdir(exist_ok=True)
    (repo / ".git" / "info" / "attributes").write_text("* filter=a=b\n")
    git(repo, "config", "filter.a=b.clean", f"{touch(marker)}; cat")


def fsmonitor(repo: Path, marker: Path) -> None:
    git(repo, "config", "core.fsmonitor", touch(marker))


def hooks_path(repo: Path, marker: Path) -> None:
    hooks = repo / ".git" / "evil-hooks"
    hooks.mkdir()
    for hook in ("post-index-change", "post-checkout", "pre-commit"):
        (hooks / hook).write_text(f"#!/bin/sh\n{touch(marker)}\n")
        (hooks / hook).chmod(0o755)
    git(repo, "config", "core.hooksPath", str(hooks))


def user_global_config(repo: Path, marker: Path) -> None:
    home = Path(os.environ["HOME"])
    (home / ".gitconfig").write_text(f'[filter "x"]\n\tclean = {touch(marker)}; cat\n')


HOSTILE: dict[str, Callable[[Path, Path], None]] = {
    "a clean filter in the repository config": clean_filter,
    "a process filter in a config file the repository includes": included_process_filter,
    "a filter whose name holds '='": filter_with_equals_in_its_name,
    "an fsmonitor program": fsmonitor,
    "a hooks path with post-index-change": hooks_path,
    "a clean filter in the user's global config": user_global_config,
}


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


def make_repo(root: Path) -> Path:
    """A committed repository whose file looks modified to git (so status hashes it: filters run)."""
    repo = root / "repo"
    repo.mkdir(parents=True)
    (repo / ".gitattributes").write_text("* filter=x\n")
    (repo / "a.txt").write_text("hello\n")
    ident = ["-c", "user.name=t", "-c", "user.email=t@example.com"]
    for args in (["init", "-q", "-b", "main"], ["add", "."], [*ident, "commit", "-qm", "first"]):
        assert git(repo, *args).returncode == 0
    later = time.time() + 60
    os.utime(repo / "a.txt", (later, later))
    return repo


def git_status(root: Path) -> ToolResult:
    call = ToolCall(
        run_id="r1", tree_id="t1", task_id="k1", tool="git_status", tool_type=ToolType.NATIVE,
        args={"path": "repo"}, timeout_s=20, max_result_bytes=1_000_000, client_id="laptop",
    )  # fmt: skip
    return execute(call, mcp=None, worker="client-agent@laptop", native=native_tools(Sandbox([root]), False))


@pytest.mark.parametrize("plant", HOSTILE.values(), ids=list(HOSTILE))
def test_git_status_never_runs_a_program_a_hostile_config_names(
    tmp_path: Path, home: Path, plant: Callable[[Path, Path], None]
) -> None:
    root, marker = tmp_path / "root", tmp_path / "ran"
    repo = make_repo(root)
    plant(repo, marker)

    result = git_status(root)
    assert result.ok, result.error
    assert result.value["branch"] == "main"
    assert not marker.exists(), "git_status ran a program named by the hostile config"

    # The same repository does run the program under a plain `git status`: the config really is hostile.
    git(repo, "status", "--porcelain", env={"PATH": os.environ["PATH"], "HOME": str(home)})
    assert marker.exists()
