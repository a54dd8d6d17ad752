"""A local ``mcp-server-git`` sees the repository it was given, no other (layer: client_agent).

One job: before an ``mcp.json`` server that runs ``mcp-server-git`` starts, check that
its ``--repository`` folder is itself the top of a git working tree whose data lies in
it. ``mcp-server-git --repository sandbox`` walks up to the enclosing repository when
``sandbox`` is not one (GitPython's ``search_parent_directories``, which ignores
``GIT_CEILING_DIRECTORIES``), and then serves every file of that repository - the
project the sandbox sits in, with its config - to whoever calls ``git_show``. So the
agent refuses to start such a server, with the reason, instead of relying on the
server's environment. A folder a tree could have shaped into a repository reading
another one's objects (a bare layout, ``objects/info/alternates``, a ``.git`` file or
link) is refused the same way, as is a server without ``--repository`` (it would open
any path it is asked for) or one given ``GIT_DIR``-like variables.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from workers.contracts import MCPServerFailure
from workers.mcp_config import MCPConfig, StdioServerSpec

_NAMES = frozenset({"mcp-server-git", "mcp-server-git.exe", "mcp_server_git"})
# Variables that point git at a repository other than the folder it runs in.
_REDIRECTING = frozenset(
    {"GIT_DIR", "GIT_WORK_TREE", "GIT_COMMON_DIR", "GIT_OBJECT_DIRECTORY", "GIT_ALTERNATE_OBJECT_DIRECTORIES",
     "GIT_INDEX_FILE", "GIT_NAMESPACE", "GIT_DISCOVERY_ACROSS_FILESYSTEM"}
)  # fmt: skip


def is_git_server(spec: StdioServerSpec) -> bool:
    """``mcp-server-git``, ``python -m mcp_server_git`` or ``uvx mcp-server-git``."""
    return Path(spec.command).name in _NAMES or any(arg in _NAMES for arg in spec.args)


def repository_arg(args: Sequence[str]) -> str | None:
    """The value of ``--repository``/``-r`` (the last one wins, as with click), or None."""
    found: str | None = None
    for i, arg in enumerate(args):
        if arg in ("--repository", "-r") and i + 1 < len(args):
            found = args[i + 1]
        elif arg.startswith("--repository="):
            found = arg.partition("=")[2]
        elif arg.startswith("-r") and len(arg) > 2 and not arg.startswith("--"):
            found = arg[2:]
    return found


def enclosing_top(path: Path) -> Path | None:
    """The folder git would take as the working tree for ``path``: the nearest one holding ``.git``."""
    for folder in (path, *path.parents):
        if os.path.lexists(folder / ".git"):
            return folder
    return None


def problem(spec: StdioServerSpec) -> str | None:
    """Why this ``mcp-server-git`` could read a repository other than its ``--repository``, or None."""
    if not is_git_server(spec):
        return None
    redirecting = sorted(name for name in spec.env if name.upper() in _REDIRECTING)
    if redirecting:
        return f"its environment sets {', '.join(redirecting)}, which point git at another repository"
    given = repository_arg(spec.args)
    if given is None:
        return "it has no --repository, so it would open any repository path a call names"
    path = Path(os.path.realpath(Path(spec.cwd or ".") / Path(given).expanduser()))
    if (path / "HEAD").is_file() and (path / "objects").is_dir():
        return f"--repository {given!r} ({path}) is laid out as a bare repository; give a working tree"
    top = enclosing_top(path)
    if top is not None and top != path:
        return (
            f"--repository {given!r} ({path}) is not the top of a git repository: git would serve the "
            f"enclosing repository {top}, outside that folder; run `git init {path}` or name the top folder"
        )
    dotgit = path / ".git"
    if top is not None and (dotgit.is_symlink() or not dotgit.is_dir()):
        return f"{dotgit} is a link or a gitdir file: the repository's data lies outside {path}"
    if (dotgit / "objects" / "info" / "alternates").exists():
        return f"{dotgit}/objects/info/alternates lets git read the objects of another repository"
    return None


def confine_git_servers(config: MCPConfig) -> tuple[MCPConfig, list[MCPServerFailure]]:
    """``config`` without the ``mcp-server-git`` servers that could see past their repository,
    and one failure for each saying why it was not started."""
    kept, failures = {}, []
    for name, spec in config.servers.items():
        why = problem(spec) if isinstance(spec, StdioServerSpec) else None
        if why is None:
            kept[name] = spec
        else:
            failures.append(MCPServerFailure(server=name, message=f"not started (mcp-server-git): {why}"))
    return MCPConfig(source=config.source, servers=kept, skipped=config.skipped), failures
