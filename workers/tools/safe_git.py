"""Running git on a workstation without letting a repository run programs (layer: workers).

One job: run a read-only git command (``git_status``) in a repository a task tree may
have shaped. Git runs programs named by its config: filter drivers (``clean``,
``smudge``, ``process``), ``core.fsmonitor``, hooks, ``diff.external``, pagers,
``core.sshCommand`` and more. A repository's ``.git/config`` (written by a tree, or
cloned with it) and the user's or system's config must not start any of them here.

How (chosen over a pure-python git library: that would be a new dependency of every
client agent, report status differently from the user's own git, and would need the
same audit, since git libraries implement filter drivers too; ``git`` is what the
user already runs):

1. system and global config are not read (``GIT_CONFIG_NOSYSTEM``, ``GIT_CONFIG_GLOBAL``);
2. ``git config --list --name-only -z`` lists every key the repository's config sets
   (reading config runs nothing; includes are followed, so included keys are listed);
3. the command runs with every program-naming key overridden by a harmless value,
   passed as ``GIT_CONFIG_KEY_<n>``/``GIT_CONFIG_VALUE_<n>`` (command-line config wins
   over repository config, and, unlike ``-c key=value``, a subsection holding ``=``
   cannot confuse it), plus hooks off, fsmonitor off, no pager, no submodules.
   A git that ignores ``GIT_CONFIG_COUNT`` (before 2.31) is caught in step 2 (the
   overrides it was given are missing from the list) and not run further.

The decision (which keys, which values, which environment) is pure and table-tested.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

# Keys whose value is a program, by variable name (the part after the last dot) ...
PROGRAM_VARIABLES = frozenset(
    {
        "fsmonitor", "hookspath", "pager", "editor", "askpass", "sshcommand", "gitproxy",
        "alternaterefscommand", "external", "command", "textconv", "clean", "smudge", "process",
        "driver", "cmd", "program", "helper", "packobjectshook", "receivepack", "uploadpack", "vcs",
        "difffilter", "tunnel", "sendmailcmd", "smtpserver", "browser",
    }
)  # fmt: skip
# ... and by section (pager.<command>), or by section and variable (<tool>.path, submodule update).
PROGRAM_SECTIONS = frozenset({"pager"})
PROGRAM_PATHS = frozenset({"browser", "man", "difftool", "mergetool"})

# Always set: hooks and fsmonitor are off even when the config does not mention them, and git
# opens no bare repository it finds by itself: a tree can write HEAD, objects/, refs/ and a
# config naming any program or a working tree outside the sandbox (core.worktree) into a sandbox
# folder (none of them a control file), and git would take that folder for a repository.
ALWAYS = (("core.fsmonitor", "false"), ("core.hooksPath", "/dev/null"), ("safe.bareRepository", "explicit"))
NEUTRAL = {"core.fsmonitor": "false", "core.hookspath": "/dev/null"}
# Only reads: no optional index lock, no submodule recursion (a submodule has its own config).
STATUS_ARGS = ("--no-pager", "status", "--porcelain=v1", "-b", "--ignore-submodules=all")
CONFIG_LIST_ARGS = ("--no-pager", "config", "--list", "--name-only", "-z")


def runs_a_program(name: str) -> bool:
    """Whether the config key ``name`` (``section[.subsection].variable``) names a program."""
    section, _, rest = name.partition(".")
    section, variable = section.lower(), rest.rpartition(".")[2].lower()
    if variable in PROGRAM_VARIABLES or section in PROGRAM_SECTIONS:
        return True
    if variable == "path" and section in PROGRAM_PATHS:
        return True
    return section == "submodule" and variable == "update"  # "!command"


def overrides(names: Iterable[str]) -> list[tuple[str, str]]:
    """The (key, value) pairs that make every program-naming key in ``names`` harmless."""
    pairs = list(ALWAYS)
    seen = {key.lower() for key, _ in pairs}
    for name in names:
        if runs_a_program(name) and name.lower() not in seen:
            seen.add(name.lower())
            pairs.append((name, NEUTRAL.get(name.lower(), "")))
    return pairs


def honours_overrides(names: Iterable[str]) -> bool:
    """Whether git listed the ``ALWAYS`` overrides it was given: git before 2.31 ignores
    ``GIT_CONFIG_COUNT``, and would then run what the repository's config names."""
    return "core.hookspath" in {name.lower() for name in names}


def parse_names(output: bytes) -> list[str]:
    """Keys from ``git config --list --name-only -z`` (NUL-terminated)."""
    return [name for name in output.decode("utf-8", "surrogateescape").split("\0") if name]


def git_env(base: Mapping[str, str], ceiling: Path, pairs: Iterable[tuple[str, str]]) -> dict[str, str]:
    """``base`` (already minimal) plus what makes git read only the repository's config,
    stay below ``ceiling`` and apply ``pairs`` over everything it read."""
    env = {
        **base,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_ATTR_NOSYSTEM": "1",
        # Git must not find a repository above the sandbox root and report on it.
        "GIT_CEILING_DIRECTORIES": str(ceiling),
        "GIT_OPTIONAL_LOCKS": "0",
        "GIT_TERMINAL_PROMPT": "0",
        "LC_ALL": "C",
    }
    pairs = list(pairs)
    for n, (key, value) in enumerate(pairs):
        env[f"GIT_CONFIG_KEY_{n}"] = key
        env[f"GIT_CONFIG_VALUE_{n}"] = value
    env["GIT_CONFIG_COUNT"] = str(len(pairs))
    return env
