"""workers.tools.native: the sandbox (table) and each native tool, run through workers.execute
so every failure is checked as the result the brain receives."""

from __future__ import annotations

import base64
import os
import stat
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from workers.contracts import ToolCall, ToolResult, ToolType
from workers.execute import execute
from workers.tools.native import SHELL_DISABLED, Sandbox, SandboxViolation, native_tools


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """root/ (the sandbox) with a file, a subfolder, links in and out; outside/ beside it."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "sub").mkdir(parents=True)
    outside.mkdir()
    (root / "notes.txt").write_text("hello\n")
    (root / "sub" / "deep.txt").write_text("deep")
    (outside / "secret.txt").write_text("secret")
    (root / "link_in").symlink_to(root / "sub" / "deep.txt")
    (root / "link_out").symlink_to(outside / "secret.txt")
    (root / "dir_out").symlink_to(outside)
    return root


def run(
    root: Path, tool: str, args: dict[str, Any], shell: bool = False, timeout_s: float = 10
) -> ToolResult:
    call = ToolCall(
        run_id="r1", tree_id="t1", task_id="k1", tool=tool, tool_type=ToolType.NATIVE, args=args,
        timeout_s=timeout_s, max_result_bytes=1_000_000, client_id="laptop",
    )  # fmt: skip
    return execute(call, mcp=None, worker="client-agent@laptop", native=native_tools(Sandbox([root]), shell))


def error_of(result: ToolResult) -> tuple[str, str]:
    assert not result.ok and result.error is not None
    return result.error.type, result.error.message


@pytest.mark.parametrize(
    ("path", "inside"),
    [
        ("notes.txt", True),
        ("sub/deep.txt", True),
        ("sub/../notes.txt", True),
        ("link_in", True),
        ("new/file.txt", True),  # does not exist yet: still judged by where it would be
        ("../outside/secret.txt", False),
        ("sub/../../outside/secret.txt", False),
        ("/etc/passwd", False),
        ("link_out", False),
        ("dir_out/secret.txt", False),
    ],
)
def test_sandbox_accepts_paths_inside_a_root_and_refuses_escapes(tree: Path, path: str, inside: bool) -> None:
    sandbox = Sandbox([tree])
    if inside:
        assert sandbox.resolve("read_local_file", path).is_relative_to(tree.resolve())
    else:
        with pytest.raises(SandboxViolation) as info:
            sandbox.resolve("read_local_file", path)
        assert f"read_local_file: path {path!r} is outside the sandbox roots [{tree.resolve()}]" in str(
            info.value
        )


def test_sandbox_violation_says_where_a_symlink_really_points(tree: Path) -> None:
    with pytest.raises(SandboxViolation) as info:
        Sandbox([tree]).resolve("read_local_file", "link_out")
    assert f"(it resolves to '{tree.parent.resolve() / 'outside' / 'secret.txt'}')" in str(info.value)
    assert info.value.data == {"tool": "read_local_file", "path": "link_out", "roots": [str(tree.resolve())]}


def test_absolute_path_in_a_second_root_is_accepted(tree: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    assert (
        Sandbox([tree, outside]).resolve("list_directory", str(outside / "secret.txt"))
        == outside / "secret.txt"
    )


def test_read_local_file_returns_text_with_its_size(tree: Path) -> None:
    result = run(tree, "read_local_file", {"path": "notes.txt"})
    assert result.ok, result.error
    assert result.value == {
        "path": str(tree.resolve() / "notes.txt"), "size": 6, "truncated": False,
        "encoding": "utf-8", "content": "hello\n",
    }  # fmt: skip


def test_read_local_file_truncates_at_max_bytes_and_base64s_binary(tree: Path) -> None:
    (tree / "blob.bin").write_bytes(b"\xff\xfe\x00\x01" * 10)
    result = run(tree, "read_local_file", {"path": "blob.bin", "max_bytes": 4})
    assert result.value["truncated"] is True and result.value["size"] == 40
    assert result.value["encoding"] == "base64"
    assert base64.b64decode(result.value["content"]) == b"\xff\xfe\x00\x01"


def test_read_local_file_outside_the_sandbox_is_a_failed_result(tree: Path) -> None:
    assert error_of(run(tree, "read_local_file", {"path": "/etc/passwd"})) == (
        "SandboxViolation",
        f"read_local_file: path '/etc/passwd' is outside the sandbox roots [{tree.resolve()}]",
    )


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("missing.txt", "read_local_file: 'missing.txt': No such file or directory"),
        ("sub", "read_local_file: 'sub' is a directory; use list_directory"),
    ],
)
def test_read_local_file_failures_name_the_path(tree: Path, path: str, message: str) -> None:
    assert error_of(run(tree, "read_local_file", {"path": path})) == ("ToolFailed", message)


def test_write_local_file_creates_parents_and_reports_bytes(tree: Path) -> None:
    result = run(tree, "write_local_file", {"path": "new/dir/out.txt", "content": "grüße"})
    assert result.value == {"path": str(tree.resolve() / "new" / "dir" / "out.txt"), "bytes": 7}
    assert (tree / "new" / "dir" / "out.txt").read_text(encoding="utf-8") == "grüße"


def test_write_local_file_through_a_symlink_out_of_the_sandbox_is_refused(tree: Path, tmp_path: Path) -> None:
    kind, message = error_of(run(tree, "write_local_file", {"path": "link_out", "content": "pwned"}))
    assert kind == "SandboxViolation" and "write_local_file: path 'link_out' is outside" in message
    assert (tmp_path / "outside" / "secret.txt").read_text() == "secret"


def test_list_directory_lists_sorted_entries_with_their_kind(tree: Path) -> None:
    result = run(tree, "list_directory", {"path": "."})
    entries = {e["name"]: (e["type"], e["size"]) for e in result.value["entries"]}
    assert [e["name"] for e in result.value["entries"]] == sorted(entries)
    assert entries == {
        "notes.txt": ("file", 6), "sub": ("dir", None), "link_in": ("symlink", None),
        "link_out": ("symlink", None), "dir_out": ("symlink", None),
    }  # fmt: skip
    assert result.value["truncated"] is False


def test_list_directory_of_a_file_fails_clearly(tree: Path) -> None:
    assert error_of(run(tree, "list_directory", {"path": "notes.txt"})) == (
        "ToolFailed", "list_directory: 'notes.txt' is not a directory"
    )  # fmt: skip


def git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, timeout=30)


def test_git_status_reports_branch_and_changes(tree: Path) -> None:
    git(tree, "init", "-q", "-b", "main")
    git(tree, "add", "notes.txt")
    git(tree, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "first")
    (tree / "notes.txt").write_text("changed\n")
    result = run(tree, "git_status", {"path": "."})
    assert result.ok, result.error
    assert result.value["branch"] == "main" and result.value["clean"] is False
    assert {"status": " M", "path": "notes.txt"} in result.value["entries"]
    assert {"status": "??", "path": "sub/"} in result.value["entries"]


def test_git_status_outside_a_repository_fails_clearly_and_ignores_repos_above_the_root(
    tmp_path: Path,
) -> None:
    # A repository above the sandbox root must not be reported on: it is outside the sandbox.
    git(tmp_path, "init", "-q")
    root = tmp_path / "root"
    root.mkdir()
    assert error_of(run(root, "git_status", {"path": "."})) == (
        "ToolFailed", "git_status: '.' is not inside a git repository"
    )  # fmt: skip


def test_shell_execute_is_refused_when_disabled(tree: Path) -> None:
    assert error_of(run(tree, "shell_execute", {"command": "echo hi"})) == ("ToolFailed", SHELL_DISABLED)
    assert SHELL_DISABLED == (
        "shell_execute is disabled on this client agent; set shell_enabled = true in its config to allow it"
    )


def test_shell_execute_runs_in_the_first_root_and_returns_the_exit_code(tree: Path) -> None:
    result = run(tree, "shell_execute", {"command": "pwd; echo oops >&2; exit 3"}, shell=True)
    assert result.ok, result.error
    assert result.value == {
        "exit_code": 3, "stdout": f"{tree.resolve()}\n", "stderr": "oops\n", "truncated": False,
        "cwd": str(tree.resolve()),
    }  # fmt: skip


def test_shell_execute_caps_output(tree: Path) -> None:
    result = run(tree, "shell_execute", {"command": "head -c 100000 /dev/zero | tr '\\0' x"}, shell=True)
    assert result.value["truncated"] is True and len(result.value["stdout"]) == 64 * 1024


def test_shell_execute_cwd_outside_the_sandbox_is_refused(tree: Path) -> None:
    kind, message = error_of(run(tree, "shell_execute", {"command": "ls", "cwd": "/"}, shell=True))
    assert (kind, message) == (
        "SandboxViolation",
        f"shell_execute: path '/' is outside the sandbox roots [{tree.resolve()}]",
    )


def test_shell_execute_timeout_kills_the_command_and_its_children(tree: Path) -> None:
    marker = tree / "pid"
    result = run(tree, "shell_execute", {"command": f"sleep 30 & echo $! > {marker}; wait", "timeout_s": 0.5},
                 shell=True)  # fmt: skip
    kind, message = error_of(result)
    assert kind == "ToolTimeout" and "did not finish within 0.5s and was killed" in message
    child = int(marker.read_text())
    assert dead_within(child, 5.0), f"the command's child {child} is still running"


def dead_within(pid: int, seconds: float) -> bool:
    """Gone, or a zombie waiting for a reaper that is not ours (PID 1 in a container may never reap)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state == "Z":
            return True
        time.sleep(0.05)
    return False


def test_native_tools_declare_strict_schemas_of_type_native(tree: Path) -> None:
    tools = native_tools(Sandbox([tree]), shell_enabled=False)
    assert sorted(tools) == [
        "git_status",
        "list_directory",
        "read_local_file",
        "shell_execute",
        "write_local_file",
    ]
    for tool in tools.values():
        assert tool.descriptor.type is ToolType.NATIVE
        assert tool.descriptor.input_schema["additionalProperties"] is False
    assert error_of(run(tree, "read_local_file", {"path": "x", "mode": "r"}))[0] == "InvalidArguments"


# --- repository control files ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "part"),
    [
        (".git/config", ".git"),
        (".git/hooks/pre-commit", ".git"),
        (".git", ".git"),  # a .git file (gitdir: ...) is control data too
        ("sub/.git/config", ".git"),
        (".GIT/config", ".GIT"),  # the same file on a case-insensitive disk
        (".gitattributes", ".gitattributes"),
        ("sub/.gitmodules", ".gitmodules"),
        (".gitconfig", ".gitconfig"),
        (".hg/hgrc", ".hg"),
    ],
)
def test_write_local_file_refuses_repository_control_files_naming_the_path(
    tree: Path, path: str, part: str
) -> None:
    kind, message = error_of(run(tree, "write_local_file", {"path": path, "content": "[core]\n"}))
    assert kind == "ControlFileRefused"
    assert message.startswith(f"write_local_file: refusing to write {path!r}: {part!r} is repository control")
    assert not (tree / path).exists()


def test_write_local_file_refuses_a_control_file_reached_through_a_symlink(tree: Path) -> None:
    (tree / ".git").mkdir()
    (tree / "alias").symlink_to(tree / ".git")
    kind, _ = error_of(run(tree, "write_local_file", {"path": "alias/config", "content": "x"}))
    assert kind == "ControlFileRefused" and not (tree / ".git" / "config").exists()


@pytest.mark.parametrize("path", [".gitignore", "git/config", "my.git/notes", "sub/.github/workflow.yml"])
def test_write_local_file_allows_names_that_only_look_like_control_files(tree: Path, path: str) -> None:
    assert run(tree, "write_local_file", {"path": path, "content": "x"}).ok


# --- regular files only --------------------------------------------------------------------------------


@pytest.mark.parametrize("tool", ["read_local_file", "write_local_file"])
def test_file_tools_refuse_a_fifo_without_hanging(tree: Path, tool: str) -> None:
    os.mkfifo(tree / "pipe")
    args = {"path": "pipe"} if tool == "read_local_file" else {"path": "pipe", "content": "x"}
    assert error_of(run(tree, tool, args, timeout_s=5)) == (
        "NotARegularFile",
        f"{tool}: 'pipe' is a FIFO (named pipe); file tools read and write regular files only",
    )


@pytest.mark.parametrize("tool", ["read_local_file", "write_local_file"])
def test_file_tools_refuse_a_socket(tree: Path, tool: str) -> None:
    try:
        os.mknod(tree / "sock", stat.S_IFSOCK | 0o600)
    except PermissionError:
        pytest.skip("this system does not let an unprivileged user create a socket node")
    args = {"path": "sock"} if tool == "read_local_file" else {"path": "sock", "content": "x"}
    assert error_of(run(tree, tool, args))[1] == (
        f"{tool}: 'sock' is a socket; file tools read and write regular files only"
    )


@pytest.mark.parametrize(
    ("tool", "path"), [("read_local_file", "/dev/zero"), ("write_local_file", "/dev/null")]
)
def test_file_tools_refuse_devices_even_inside_a_sandbox_root(tool: str, path: str) -> None:
    args = {"path": path} if tool == "read_local_file" else {"path": path, "content": "x"}
    assert error_of(run(Path("/dev"), tool, args)) == (
        "NotARegularFile",
        f"{tool}: {path!r} is a character device; file tools read and write regular files only",
    )


# --- the environment of commands ----------------------------------------------------------------------


def test_shell_execute_does_not_show_the_agents_own_variables(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VANCETOPE_AGENT_BROKER_URL", "redis://laptop:s3cret@broker:6379/0")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "planted")
    result = run(tree, "shell_execute", {"command": "env"}, shell=True)
    assert result.ok, result.error
    assert "VANCETOPE_" not in result.value["stdout"] and "s3cret" not in result.value["stdout"]
    assert "AWS_SECRET_ACCESS_KEY" not in result.value["stdout"]
    assert "PATH=" in result.value["stdout"]
