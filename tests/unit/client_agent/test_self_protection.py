"""The agent's own files are out of its tools' reach: the pure path checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from client_agent.config import AgentConfig, load_config
from client_agent.errors import AgentConfigError
from client_agent.self_protection import STATE_DIR, check_sandbox_roots, exposure, protected_paths

URL = "redis://127.0.0.1:1/0"


@pytest.mark.parametrize(
    ("root", "own", "label", "why"),
    [
        ("/a", "/a", "mcp.json", "is the agent's"),
        ("/a", "/a/b/mcp.json", "mcp.json", "contains the agent's"),
        ("/a/state/x", "/a/state", STATE_DIR, "is inside the agent's"),
        ("/a/b", "/a/bc/mcp.json", "mcp.json", None),  # a sibling whose name starts the same
        ("/a/b", "/a/mcp.json", "mcp.json", None),
        ("/a/mcp.json/x", "/a/mcp.json", "mcp.json", None),  # only the state dir is a folder
    ],
)
def test_exposure(root: str, own: str, label: str, why: str | None) -> None:
    found = exposure(Path(root), label, Path(own))
    assert (found is None) if why is None else (found is not None and found.startswith(why))


def write_config(folder: Path, extra: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sandbox").mkdir(exist_ok=True)
    path = folder / "agent.toml"
    path.write_text(f'[agent]\nclient_id = "laptop"\nuser = "ada"\nbroker_url = "{URL}"\n{extra}')
    return path


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ('sandbox_roots = ["."]\n', "config file"),
        ('sandbox_roots = ["sandbox"]\nmcp_json = "sandbox/mcp.json"\n', "mcp.json"),
        ('sandbox_roots = ["sandbox"]\ndata_dir = "sandbox/.state"\n', STATE_DIR),
        ('sandbox_roots = ["sandbox"]\nlog_file = "sandbox/agent.log"\n', "log file"),
    ],
)
def test_a_config_whose_sandbox_holds_the_agents_own_files_is_refused(
    tmp_path: Path, extra: str, named: str
) -> None:
    path = write_config(tmp_path / "home", extra)
    with pytest.raises(AgentConfigError) as info:
        load_config(path, environ={})
    message = str(info.value)
    assert f"{path}: sandbox_roots: sandbox root" in message and f"the agent's {named}" in message


def test_a_link_to_the_agents_folder_counts_as_the_folder(tmp_path: Path) -> None:
    home = tmp_path / "home"
    path = write_config(home, 'sandbox_roots = ["link"]\n')
    (home / "link").symlink_to(home)
    with pytest.raises(AgentConfigError, match="contains the agent's config file"):
        load_config(path, environ={})


def test_separate_folders_are_accepted_and_protected_paths_name_every_own_file(tmp_path: Path) -> None:
    cred = tmp_path / "home" / "laptop.credential"
    path = write_config(tmp_path / "home", 'sandbox_roots = ["sandbox"]\nmcp_json = "mcp.json"\n')
    config = load_config(path, environ={})
    own = protected_paths(config, path)
    assert own["config file"] == path.resolve() and own["mcp.json"] == (path.parent / "mcp.json").resolve()
    assert own[STATE_DIR] == (path.parent / ".vancetope-agent").resolve()
    assert "credential file" not in own and not cred.exists()


def test_a_config_built_in_code_is_checked_too(tmp_path: Path) -> None:
    config = AgentConfig(client_id="laptop", user="ada", broker_url=URL, sandbox_roots=(tmp_path,),
                         data_dir=tmp_path / "state")  # fmt: skip
    with pytest.raises(AgentConfigError, match="contains the agent's state directory"):
        check_sandbox_roots(config, None)
