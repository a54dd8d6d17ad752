"""Redis Lua scripts, kept as ``.lua`` files in a ``lua/`` folder of their package and
loaded by name (layer: workers). A script is then read, diffed and syntax-checked as
Lua (``tests/unit/workers/test_lua.py`` loads every one into a real redis-server)."""

from __future__ import annotations

from functools import cache
from importlib.resources import files


@cache
def lua(package: str, name: str) -> str:
    """The text of ``<package>/lua/<name>.lua``."""
    return (files(package) / "lua" / f"{name}.lua").read_text(encoding="utf-8")
