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

Once started, every call's ``repo_path`` must be that repository itself
(``repo_path_problem``): mcp-server-git accepts any folder below it, and a tree can write
``HEAD``, ``objects/``, ``refs/`` and a ``config`` naming ``core.fsmonitor`` into a sandbox
folder (none of them a control file), which GitPython opens as a bare repository and git then
runs the program it names. The server also starts with ``safe.bareRepository=explicit``
(``workers.tools.safe_git.ALWAYS``' rule for the native git_status).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

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


def repository(spec: StdioServerSpec) -> Path | None:
    """The real path of an ``mcp-server-git``'s ``--repository``; None for another server."""
    given = repository_arg(spec.args) if is_git_server(spec) else None
    return None if given is None else _real(spec, given)


def _real(spec: StdioServerSpec, path: str) -> Path:
    # mcp-server-git resolves a relative path against its own folder, which is spec.cwd.
    return Path(os.path.realpath(Path(spec.cwd or ".") / Path(path).expanduser()))


def repo_path_problem(spec: StdioServerSpec, args: Mapping[str, Any]) -> str | None:
    """Why a call of this server may not run: its ``repo_path`` is not the server's repository."""
    own = repository(spec)
    if own is None:
        return None
    given = args.get("repo_path")
    if not isinstance(given, str) or _real(spec, given) != own:
        return (
            f"repo_path {given!r} is not this MCP server's repository {own}: mcp-server-git is held to "
            "its --repository itself (a folder below it could be shaped into another repository)"
        )
    return None


# Git's command-line scope (GIT_CONFIG_COUNT) wins over a repository's own config.
_GIT_OVERRIDES = (("safe.bareRepository", "explicit"),)


def with_safe_git_env(spec: StdioServerSpec) -> StdioServerSpec:
    """``spec`` whose git opens no bare repository it finds by itself, after the user's own
    ``GIT_CONFIG_*`` entries (if any)."""
    env = dict(spec.env)
    given = env.get("GIT_CONFIG_COUNT", "0")
    count = int(given) if given.isdigit() else 0
    for n, (key, value) in enumerate(_GIT_OVERRIDES, start=count):
        env[f"GIT_CONFIG_KEY_{n}"], env[f"GIT_CONFIG_VALUE_{n}"] = key, value
    env["GIT_CONFIG_COUNT"] = str(count + len(_GIT_OVERRIDES))
    return spec.model_copy(update={"env": env})


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
    path = _real(spec, given)
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
            kept[name] = (
                with_safe_git_env(spec) if isinstance(spec, StdioServerSpec) and is_git_server(spec) else spec
            )
        else:
            failures.append(MCPServerFailure(server=name, message=f"not started (mcp-server-git): {why}"))
    return config.model_copy(update={"servers": kept}), failures
