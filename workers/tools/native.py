"""Native tools of a client agent (layer: workers).

One job: the tools a client agent runs without any MCP server (seed 000 §2: file
read/write, directory listing, git status, shell execution), each a ``BuiltinTool`` of
type ``native`` with a JSON input schema, confined to a ``Sandbox`` of root folders.

Every path is resolved with realpath (symlinks followed) and must land inside one root,
so ``..`` and symlinks pointing out of a root are refused. Failures raise ``ToolFailed``
subclasses, which ``workers.execute`` turns into failed results with these messages.
``shell_execute`` only confines its working directory: the command itself runs with
the user's rights, which is why it is off unless the agent's config turns it on.

A tree may be hostile. So file tools read and write regular files only (a FIFO must
not hang a call, a device must not be touched), ``write_local_file`` refuses
repository control files (``.git/``, ``.gitattributes``, ... : writing them is how a
tree makes git run its programs) under every spelling a filesystem may take for the
same name (``.GIT``, ``.git.``, ``.git `` and ``GIT~1`` are ``.git`` on Windows or macOS),
commands see a minimal environment (never the agent's ``VANCETOPE_*`` variables) and git
runs through ``safe_git``. A file with more than one hard link is neither read nor
written: its other name may be outside every root (realpath cannot see a hard link).
The agent's own files (its config, ``mcp.json``, credential, state directory), passed
as ``protected``, are refused even inside a root: a tool that could rewrite them could
approve its own MCP servers.
"""

from __future__ import annotations

import base64
import os
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from workers.contracts import ToolDescriptor, ToolType
from workers.errors import ToolFailed
from workers.tools import safe_git
from workers.tools.builtin import BuiltinContext, BuiltinTool
from workers.tools.process import minimal_env, run_bounded

DEFAULT_MAX_READ_BYTES = 1_000_000
MAX_LIST_ENTRIES = 10_000
SHELL_OUTPUT_CAP = 64 * 1024
SHELL_DISABLED = (
    "shell_execute is disabled on this client agent; set shell_enabled = true in its config to allow it"
)


# Path components a tree may not write under: version-control metadata, and files that
# configure what git runs (filter drivers, submodules) or how it reads the repository.
CONTROL_DIRS = frozenset({".git", ".hg", ".svn", ".bzr", "_darcs"})
CONTROL_FILES = frozenset({".gitattributes", ".gitmodules", ".gitconfig", ".lfsconfig", ".hgrc"})


class SandboxViolation(ToolFailed):
    """A path outside every sandbox root (after resolving ``..`` and symlinks)."""


class ControlFileRefused(ToolFailed):
    """A write to a repository control file (``.git/...``, ``.gitattributes``, ...)."""


class NotARegularFile(ToolFailed):
    """A FIFO, socket or device where a file tool needs a regular file."""


class HardLinkRefused(ToolFailed):
    """A file with more than one hard link: its other name may lie outside every root."""


class AgentFileRefused(ToolFailed):
    """A path that is (or is inside) one of the client agent's own files."""


def canonical_name(part: str) -> str:
    """The name a case-insensitive filesystem that drops trailing dots and spaces (Windows),
    or ignores case (macOS), opens for ``part``; an NTFS stream suffix (``name::$DATA``) and
    the 8.3 short name of a dot-name (``GIT~1``) are folded as well."""
    folded = part.casefold().split(":", 1)[0].rstrip(". ")
    if len(folded) > 2 and folded[-2] == "~" and folded[-1].isdigit():  # GIT~1 is .git's short name
        folded = "." + folded[:-2]
    return folded


def control_part(real: Path, root: Path) -> str | None:
    """The first component of ``real`` below ``root`` that is repository control data, if any.
    Compared as the filesystem may: ``.GIT``, ``.git.`` and ``.git `` are ``.git``."""
    for part in real.relative_to(root).parts:
        folded = canonical_name(part)
        if folded in CONTROL_DIRS or folded in CONTROL_FILES:
            return part
    return None


class Sandbox:
    """Root folders a native tool may touch; relative paths are taken from the first root.
    ``protected`` (label -> path): files and folders refused even inside a root."""

    def __init__(
        self,
        roots: Sequence[str | os.PathLike[str]],
        protected: Mapping[str, str | os.PathLike[str]] | None = None,
    ) -> None:
        self.roots: tuple[Path, ...] = tuple(Path(os.path.realpath(root)) for root in roots)
        self.protected: dict[Path, str] = {
            Path(os.path.realpath(path)): label for label, path in (protected or {}).items()
        }

    def root_of(self, real: Path) -> Path:
        """The root ``real`` (a path from ``resolve``) lies in."""
        return next(root for root in self.roots if real == root or real.is_relative_to(root))

    def describe(self) -> str:
        return "[" + ", ".join(str(root) for root in self.roots) + "]"

    def resolve(self, tool: str, path: str) -> Path:
        """The real path of ``path``, or SandboxViolation naming the tool, the path and the roots."""
        given = Path(path).expanduser()
        if not given.is_absolute():
            if not self.roots:
                raise self._violation(tool, path, None)
            given = self.roots[0] / given
        real = Path(os.path.realpath(given))
        if not any(real == root or real.is_relative_to(root) for root in self.roots):
            raise self._violation(tool, path, real)
        for own, label in self.protected.items():
            if real == own or real.is_relative_to(own):
                raise AgentFileRefused(
                    f"{tool}: path {path!r} is the client agent's own {label} ({own}); tools may not "
                    "touch it (it decides what this agent runs)",
                    tool=tool,
                    path=path,
                )
        return real

    def _violation(self, tool: str, path: str, real: Path | None) -> SandboxViolation:
        message = f"{tool}: path {path!r} is outside the sandbox roots {self.describe()}"
        if real is not None and str(real) != os.path.normpath(path):
            message += f" (it resolves to {str(real)!r})"
        return SandboxViolation(message, tool=tool, path=path, roots=[str(r) for r in self.roots])


def _descriptor(
    name: str, description: str, properties: dict[str, Any], required: list[str]
) -> ToolDescriptor:
    schema = {"type": "object", "properties": properties, "required": required, "additionalProperties": False}
    return ToolDescriptor(name=name, type=ToolType.NATIVE, description=description, input_schema=schema)


def _fail(tool: str, path: str, exc: OSError) -> ToolFailed:
    reason = exc.strerror or str(exc)
    return ToolFailed(f"{tool}: {path!r}: {reason}", tool=tool, path=path)


# --- read_local_file / write_local_file / list_directory ------------------------------------


def _read_local_file(sandbox: Sandbox, args: dict[str, Any]) -> dict[str, Any]:
    tool, path = "read_local_file", args["path"]
    real = sandbox.resolve(tool, path)
    max_bytes = int(args.get("max_bytes", DEFAULT_MAX_READ_BYTES))
    if real.is_dir():
        raise ToolFailed(f"{tool}: {path!r} is a directory; use list_directory", tool=tool, path=path)
    _require_regular(tool, path, real)
    try:
        # O_NOFOLLOW: a symlink swapped in after the check must not be followed out of the sandbox.
        # O_NONBLOCK: a FIFO swapped in after the check must not hang the call (fstat refuses it).
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with open(fd, "rb") as handle:
            size = _regular_size(tool, path, fd)
            data = handle.read(max_bytes + 1)
    except OSError as exc:
        raise _fail(tool, path, exc) from exc
    body = data[:max_bytes]
    value: dict[str, Any] = {"path": str(real), "size": size, "truncated": len(data) > max_bytes}
    try:
        value.update(encoding="utf-8", content=body.decode("utf-8"))
    except UnicodeDecodeError:
        value.update(encoding="base64", content=base64.b64encode(body).decode("ascii"))
    return value


def _require_regular(tool: str, path: str, real: Path) -> None:
    """Refuse an existing non-regular or hard-linked file before opening it (opening a device can act)."""
    try:
        info = os.lstat(real)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise _fail(tool, path, exc) from exc
    _require_single(tool, path, info)


def _regular_size(tool: str, path: str, fd: int) -> int:
    """The size of the open file, or NotARegularFile / HardLinkRefused if something else was swapped in."""
    info = os.fstat(fd)
    _require_single(tool, path, info)
    return info.st_size


def _require_single(tool: str, path: str, info: os.stat_result) -> None:
    if not stat.S_ISREG(info.st_mode):
        raise _not_regular(tool, path, info.st_mode)
    if info.st_nlink > 1:
        raise HardLinkRefused(
            f"{tool}: {path!r} has {info.st_nlink} hard links; file tools refuse it, since another "
            "name of the same file may be outside the sandbox roots",
            tool=tool,
            path=path,
        )


def _not_regular(tool: str, path: str, mode: int) -> NotARegularFile:
    kind = _KINDS.get(stat.S_IFMT(mode), "not a regular file")
    return NotARegularFile(
        f"{tool}: {path!r} is {kind}; file tools read and write regular files only", tool=tool, path=path
    )


_KINDS = {
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFDIR: "a directory",
    stat.S_IFLNK: "a symlink",
}


def _write_local_file(sandbox: Sandbox, args: dict[str, Any]) -> dict[str, Any]:
    tool, path = "write_local_file", args["path"]
    real = sandbox.resolve(tool, path)
    _refuse_control_file(sandbox, tool, path, real)
    _require_regular(tool, path, real)
    data = args["content"].encode("utf-8")
    try:
        real.parent.mkdir(parents=True, exist_ok=True)
        # No O_TRUNC before fstat has shown a regular file; O_NONBLOCK so a FIFO cannot hang the open.
        fd = os.open(real, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
        with os.fdopen(fd, "wb") as handle:
            _regular_size(tool, path, fd)
            os.ftruncate(fd, 0)
            handle.write(data)
    except OSError as exc:
        raise _fail(tool, path, exc) from exc
    return {"path": str(real), "bytes": len(data)}


def _refuse_control_file(sandbox: Sandbox, tool: str, path: str, real: Path) -> None:
    part = control_part(real, sandbox.root_of(real))
    if part is not None:
        raise ControlFileRefused(
            f"{tool}: refusing to write {path!r}: {part!r} is repository control data (git/hg config, "
            "hooks, attributes), and writing it could make the next git command run a program; "
            "change it yourself outside Vancetope if you mean to",
            tool=tool,
            path=path,
        )


def _list_directory(sandbox: Sandbox, args: dict[str, Any]) -> dict[str, Any]:
    tool, path = "list_directory", args["path"]
    real = sandbox.resolve(tool, path)
    try:
        with os.scandir(real) as scan:
            entries = sorted(scan, key=lambda entry: entry.name)
    except NotADirectoryError:
        raise ToolFailed(f"{tool}: {path!r} is not a directory", tool=tool, path=path) from None
    except OSError as exc:
        raise _fail(tool, path, exc) from exc
    listed = [_entry(entry) for entry in entries[:MAX_LIST_ENTRIES]]
    return {"path": str(real), "entries": listed, "truncated": len(entries) > MAX_LIST_ENTRIES}


def _entry(entry: os.DirEntry[str]) -> dict[str, Any]:
    if entry.is_symlink():
        kind = "symlink"
    elif entry.is_dir():
        kind = "dir"
    elif entry.is_file():
        kind = "file"
    else:
        kind = "other"
    try:
        size = entry.stat(follow_symlinks=False).st_size if kind == "file" else None
    except OSError:
        size = None
    return {"name": entry.name, "type": kind, "size": size}


# --- git_status ----------------------------------------------------------------------------------


def _git_status(
    sandbox: Sandbox, timeout_s: float, args: dict[str, Any], ctx: BuiltinContext
) -> dict[str, Any]:
    tool, path = "git_status", args["path"]
    real = sandbox.resolve(tool, path)
    if not real.is_dir():
        raise ToolFailed(f"{tool}: {path!r} is not a directory", tool=tool, path=path)
    base, ceiling = minimal_env(os.environ), sandbox.root_of(real).parent

    def git(argv: tuple[str, ...], pairs: list[tuple[str, str]]) -> tuple[int, str, bytes]:
        env = safe_git.git_env(base, ceiling, pairs)
        proc = run_bounded(
            tool, ["git", *argv], real, env, min(timeout_s, ctx.remaining()), shell=False, cancel=ctx.cancel
        )
        return proc.returncode, proc.stderr.decode("utf-8", "replace").strip(), proc.stdout

    # Reading config runs nothing; it tells us which program-naming keys to override.
    code, err, out = git(safe_git.CONFIG_LIST_ARGS, list(safe_git.ALWAYS))
    if code == 0:
        names = safe_git.parse_names(out)
        if not safe_git.honours_overrides(names):
            raise ToolFailed(
                f"{tool}: the git on this workstation ignores GIT_CONFIG_COUNT (git 2.31 or newer needed), "
                "so a repository's config could make it run programs; upgrade git to use git_status",
                tool=tool,
                path=path,
            )
        code, err, out = git(safe_git.STATUS_ARGS, safe_git.overrides(names))
    if code != 0:
        if "not a git repository" in err:
            raise ToolFailed(f"{tool}: {path!r} is not inside a git repository", tool=tool, path=path)
        raise ToolFailed(f"{tool}: git status failed in {path!r} (exit {code}): {err}", tool=tool, path=path)
    return _parse_porcelain(str(real), out.decode("utf-8", "replace"))


def _parse_porcelain(path: str, output: str) -> dict[str, Any]:
    lines = output.splitlines()
    branch = lines[0][3:] if lines and lines[0].startswith("## ") else ""
    entries = [
        {"status": line[:2], "path": line[3:]} for line in lines if line and not line.startswith("## ")
    ]
    return {"path": path, "branch": branch, "entries": entries, "clean": not entries}


# --- shell_execute -------------------------------------------------------------------------------


def _shell_execute(
    sandbox: Sandbox, timeout_s: float, args: dict[str, Any], ctx: BuiltinContext
) -> dict[str, Any]:
    tool = "shell_execute"
    if "cwd" in args:
        cwd = sandbox.resolve(tool, args["cwd"])
    elif sandbox.roots:
        cwd = sandbox.roots[0]
    else:
        raise ToolFailed(f"{tool}: this client agent has no sandbox roots to run in", tool=tool)
    timeout = min(float(args.get("timeout_s", timeout_s)), ctx.remaining())
    proc = run_bounded(
        tool, args["command"], cwd, minimal_env(os.environ), timeout, shell=True, cancel=ctx.cancel
    )
    out, err = proc.stdout, proc.stderr
    return {
        "exit_code": proc.returncode,
        "stdout": out[:SHELL_OUTPUT_CAP].decode("utf-8", "replace"),
        "stderr": err[:SHELL_OUTPUT_CAP].decode("utf-8", "replace"),
        "truncated": len(out) > SHELL_OUTPUT_CAP or len(err) > SHELL_OUTPUT_CAP,
        "cwd": str(cwd),
    }


def _shell_disabled(args: dict[str, Any], ctx: BuiltinContext) -> Any:
    raise ToolFailed(SHELL_DISABLED, tool="shell_execute")


# --- table -------------------------------------------------------------------------------------------

_PATH = {"type": "string", "minLength": 1, "description": "absolute, or relative to the first sandbox root"}


def native_tools(
    sandbox: Sandbox, shell_enabled: bool, default_timeout_s: float = 30.0
) -> dict[str, BuiltinTool]:
    """Every native tool, by name. With ``shell_enabled`` false, ``shell_execute`` is a stub that
    fails with ``SHELL_DISABLED`` (the caller decides whether to announce it)."""

    def shell(args: dict[str, Any], ctx: BuiltinContext) -> Any:
        return _shell_execute(sandbox, default_timeout_s, args, ctx)

    tools = [
        BuiltinTool(
            _descriptor(
                "read_local_file",
                "Read a file inside the client's sandbox roots; returns {path, size, encoding "
                "(utf-8|base64), content, truncated}.",
                {"path": _PATH, "max_bytes": {"type": "integer", "minimum": 1, "maximum": 100_000_000}},
                ["path"],
            ),
            lambda args, ctx: _read_local_file(sandbox, args),
        ),
        BuiltinTool(
            _descriptor(
                "write_local_file",
                "Write UTF-8 text to a file inside the client's sandbox roots (parents are created); "
                "returns {path, bytes}.",
                {"path": _PATH, "content": {"type": "string"}},
                ["path", "content"],
            ),
            lambda args, ctx: _write_local_file(sandbox, args),
        ),
        BuiltinTool(
            _descriptor(
                "list_directory",
                "List a directory inside the client's sandbox roots; returns {path, entries: "
                "[{name, type, size}], truncated}.",
                {"path": _PATH},
                ["path"],
            ),
            lambda args, ctx: _list_directory(sandbox, args),
        ),
        BuiltinTool(
            _descriptor(
                "git_status",
                "`git status --porcelain=v1 -b` of a repository inside the client's sandbox roots; "
                "returns {path, branch, entries: [{status, path}], clean}.",
                {"path": _PATH},
                ["path"],
            ),
            lambda args, ctx: _git_status(sandbox, default_timeout_s, args, ctx),
        ),
        BuiltinTool(
            _descriptor(
                "shell_execute",
                "Run a shell command on the client (working directory inside the sandbox roots; the "
                "command has the user's rights); returns {exit_code, stdout, stderr, truncated, cwd}.",
                {
                    "command": {"type": "string", "minLength": 1},
                    "cwd": _PATH,
                    "timeout_s": {"type": "number", "exclusiveMinimum": 0, "maximum": 86_400},
                },
                ["command"],
            ),
            shell if shell_enabled else _shell_disabled,
        ),
    ]
    return {tool.descriptor.name: tool for tool in tools}
