"""Which sandbox a server-side MCP server starts in, and its command line (pure decisions)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from workers.sandbox import Sandbox, SandboxUnavailable, bwrap_options, choose


def test_the_sandbox_reads_the_filesystem_hides_folders_and_files_and_has_its_own_processes() -> None:
    assert bwrap_options(["/srv/data", "/srv/other"], ["/etc/vt/vault.key"]) == [
        "--ro-bind", "/", "/", "--dev", "/dev", "--bind", "/tmp", "/tmp",
        "--tmpfs", "/srv/data", "--tmpfs", "/srv/other",
        "--ro-bind", "/dev/null", "/etc/vt/vault.key",
        "--unshare-pid", "--proc", "/proc", "--die-with-parent", "--new-session",
    ]  # fmt: skip


def test_a_server_is_wrapped_with_its_own_arguments_after_the_separator() -> None:
    command, args = Sandbox("/usr/bin/bwrap", ("/srv/data",)).wrap(
        "mcp-server-time", ["--local-timezone", "UTC"]
    )
    assert command == "/usr/bin/bwrap"
    assert args[-4:] == ["--", "mcp-server-time", "--local-timezone", "UTC"]
    assert args[:-4] == bwrap_options(["/srv/data"])


def found(name: str) -> str | None:
    return f"/usr/bin/{name}"


def missing(name: str) -> str | None:
    return None


def runs(bwrap: str, hidden: Sequence[str], masked: Sequence[str]) -> str | None:
    return None


def fails(bwrap: str, hidden: Sequence[str], masked: Sequence[str]) -> str | None:
    return "bwrap exited 1: No permissions to creating new namespace"


# (mode, bwrap on PATH, its probe, sandboxed?, what the decision says)
CASES = [
    ("auto", found, runs, True, "run in bubblewrap, the filesystem read-only but /tmp, without"),
    ("auto", missing, runs, False, "without a sandbox: bubblewrap (bwrap) is not installed"),
    ("auto", found, fails, False, "without a sandbox: bwrap exited 1"),
    ("bwrap", found, runs, True, "run in bubblewrap"),
    ("none", found, runs, False, "without a sandbox (mcp_sandbox = none)"),
]


@pytest.mark.parametrize(("mode", "which", "probe", "sandboxed", "said"), CASES)
def test_the_sandbox_is_chosen_by_mode_and_by_what_runs_here(
    tmp_path: Path, mode: str, which: object, probe: object, sandboxed: bool, said: str
) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "vault.key").write_text("k")
    (tmp_path / "data" / "store.db").write_text("")
    hidden = [tmp_path / "data", tmp_path / "vault.key", tmp_path / "data" / "store.db", tmp_path / "absent"]
    sandbox, line = choose(mode, hidden, which=which, try_it=probe)  # type: ignore[arg-type]
    assert (sandbox is not None) is sandboxed and said in line
    if sandbox is not None:  # what does not exist is not mounted over
        assert sandbox.hidden == (str((tmp_path / "data").resolve()),)
        assert sandbox.masked == (str((tmp_path / "vault.key").resolve()),)


@pytest.mark.parametrize(("which", "probe"), [(missing, runs), (found, fails)])
def test_bwrap_mode_refuses_to_run_servers_unconfined(tmp_path: Path, which: object, probe: object) -> None:
    with pytest.raises(SandboxUnavailable, match="mcp_sandbox = bwrap, but .*install bubblewrap"):
        choose("bwrap", [tmp_path], which=which, try_it=probe)  # type: ignore[arg-type]


def test_the_settings_hide_the_data_dir_and_every_secret_file_kept_elsewhere(tmp_path: Path) -> None:
    from brain.config import Settings, sandbox_hidden

    settings = Settings(
        data_dir=tmp_path / "data", vault_key_file=tmp_path / "keys" / "vault.key",
        store_url=f"sqlite:///{tmp_path / 'db' / 'store.db'}",
        mcp_config=tmp_path / "server-mcp.json", registry=tmp_path / "registry.yaml",
    )  # fmt: skip
    hidden = sandbox_hidden(settings, cwd=tmp_path / "project")
    assert hidden == [
        tmp_path / "data", tmp_path / "keys" / "vault.key",
        tmp_path / "server-mcp.json", tmp_path / "registry.yaml",
        tmp_path / "db" / "store.db", tmp_path / "db" / "store.db-wal", tmp_path / "db" / "store.db-shm",
        tmp_path / "project" / "vancetope.toml",
    ]  # fmt: skip
