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


def imported_top_levels() -> dict[str, str]:
    """Top-level module -> first file importing it, over the three packages (absolute imports only)."""
    found: dict[str, str] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names: list[str] = []
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                for name in names:
                    found.setdefault(name.split(".")[0], str(path.relative_to(ROOT)))
    return found


def declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {canonicalize_name(Requirement(r).name) for r in project["dependencies"]}


def test_every_third_party_import_is_a_declared_dependency() -> None:
    dists = packages_distributions()
    ours = set(PACKAGES)
    missing = []
    for module, where in sorted(imported_top_levels().items()):
        if module in ours or module in sys.stdlib_module_names:
            continue
        providers = {canonicalize_name(d) for d in dists.get(module, [])}
        assert providers, f"{module} (imported in {where}) is not installed at all"
        if not providers & declared():
            missing.append(f"{module} (imported in {where}; from {', '.join(sorted(providers))})")
    assert not missing, "declare in pyproject.toml [project].dependencies: " + "; ".join(missing)


def test_kombus_undeclared_packaging_is_declared() -> None:
    # kombu.transport.redis imports packaging; pip check cannot see that (issue 6).
    assert "packaging" in declared()
