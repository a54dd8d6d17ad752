"""The workstation's distribution (agent/pyproject.toml): built with pip as a user would, it
ships the agent's code and none of the server's dependencies, and installed alone in a fresh
venv, `vancetope-agent` runs.

Needs pip to reach an index (or its cache) for hatchling and the agent's dependencies, as the
README's own commands do; CI runs it with the rest of the suite.
"""

from __future__ import annotations

import email.message
import email.parser
import json
import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.test_dependencies import AGENT_PYPROJECT, SERVER_ONLY, requirements

ROOT = Path(__file__).resolve().parent.parent
AGENT = ROOT / "agent"
# What the agent's commands import (`run` imports client_agent.agent lazily).
ENTRY_MODULES = ("client_agent.__main__", "client_agent.agent")


def pip(*args: str, python: str = sys.executable, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [python, "-m", "pip", "--disable-pip-version-check", *args],
        check=False, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    proc = pip("wheel", "--no-deps", "--quiet", "--wheel-dir", str(out), str(AGENT))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (built,) = out.glob("vancetope_agent-*.whl")
    return built


def metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        return email.parser.Parser().parsestr(archive.read(name).decode())


def test_the_wheel_requires_none_of_the_servers_dependencies(wheel: Path) -> None:
    meta = metadata(wheel)
    assert (meta["Name"], meta["Version"]) == ("vancetope-agent", "0.1.0")
    required = {canonicalize_name(Requirement(r).name) for r in meta.get_all("Requires-Dist") or []}
    assert not required & SERVER_ONLY
    assert required == set(requirements(AGENT_PYPROJECT))


def test_the_wheel_ships_every_module_the_agent_imports_and_no_server_code(wheel: Path) -> None:
    script = (
        f"import importlib, json, sys; [importlib.import_module(m) for m in {ENTRY_MODULES!r}]; "
        "print(json.dumps(sorted({m.__file__ for n, m in sys.modules.items() "
        "if n.split('.')[0] in ('client_agent', 'workers') and getattr(m, '__file__', None)})))"
    )
    proc = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True, cwd=ROOT,
                          timeout=120)  # fmt: skip
    needed = {str(Path(f).resolve().relative_to(ROOT)) for f in json.loads(proc.stdout)}
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = next(archive.read(n).decode() for n in names if n.endswith("entry_points.txt"))
    assert needed <= names, sorted(needed - names)
    # The agent runs no Redis script (its Redis user may not): nothing to ship but code.
    assert not [n for n in names if n.endswith(".lua")]
    assert not [n for n in names if n.startswith("brain/") or "__pycache__" in n]
    assert "workers/server_worker.py" not in names
    assert "vancetope-agent = client_agent.__main__:main" in entry_points


def test_the_agent_has_the_same_version_as_the_root() -> None:
    def version(path: Path) -> str:
        return str(tomllib.loads(path.read_text())["project"]["version"])

    assert version(AGENT_PYPROJECT) == version(ROOT / "pyproject.toml")


def test_the_agent_installs_alone_in_a_fresh_venv_and_runs(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    proc = pip("install", "--quiet", str(wheel), python=python, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    listed = pip("list", "--format", "json", python=python)
    installed = {canonicalize_name(d["name"]) for d in json.loads(listed.stdout)}
    assert "vancetope-agent" in installed
    assert not installed & (SERVER_ONLY | {"vancetope"}), sorted(installed & SERVER_ONLY)

    # Away from the checkout, with no PYTHONPATH: only what the venv holds can be imported.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",) and not k.startswith("VANCETOPE_")}
    (tmp_path / "sandbox").mkdir()
    config = tmp_path / "agent.toml"
    config.write_text('[agent]\nclient_id = "box"\nuser = "u"\nbroker_url = "redis://127.0.0.1:1/0"\n'
                      'sandbox_roots = ["sandbox"]\n')  # fmt: skip
    agent = str(venv / "bin" / "vancetope-agent")

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv, check=False, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120
        )

    helped = run(agent, "--help")
    assert helped.returncode == 0 and all(c in helped.stdout for c in ("install", "run", "status", "tools"))
    tools = run(agent, "tools", "--config", str(config))
    assert tools.returncode == 0, tools.stderr
    assert "read_local_file" in tools.stdout
    imports = run(python, "-c", "import client_agent.agent, client_agent.status; import brain")
    assert "No module named 'brain'" in imports.stderr
