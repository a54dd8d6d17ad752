"""Build hook of the ``vancetope-agent`` distribution: which files it ships, from where.

The packages live once, at the repository root (``../client_agent``, ``../workers``). In a
checkout they are taken from there; in an unpacked sdist (which carries its own copies) from
beside this file. ``workers/server_worker.py`` (the server pool's entry point) stays out.
Every ``.py`` file (and any ``.lua`` script beside one) goes in; caches and anything else do not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

PACKAGES = ("client_agent", "workers")
LEFT_OUT = {"workers/server_worker.py"}
SUFFIXES = {".py", ".lua", ".typed"}


def shipped_files(root: Path) -> dict[str, str]:
    """Source file -> its path in the distribution."""
    files: dict[str, str] = {}
    for package in PACKAGES:
        here = root / package
        base = here if here.is_dir() else root.parent / package
        if not base.is_dir():
            raise FileNotFoundError(f"vancetope-agent: cannot find the {package} package at {here} or {base}")
        for source in sorted(base.rglob("*")):
            relative = f"{package}/{source.relative_to(base).as_posix()}"
            shipped = (
                source.suffix in SUFFIXES and "__pycache__" not in source.parts and relative not in LEFT_OUT
            )
            if shipped and source.is_file():
                files[str(source)] = relative
    return files


class AgentSourcesHook(BuildHookInterface):  # type: ignore[type-arg]  # generic in hatchling
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        root = Path(self.root)
        for source, target in shipped_files(root).items():
            inside = Path(source).is_relative_to(root)
            if self.target_name == "sdist" and inside:
                continue  # an sdist rebuilt from an sdist: already selected by `include`
            build_data["force_include"][source] = target
