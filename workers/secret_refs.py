"""``${vault:NAME}`` references, resolved late (layer: workers; issue 12 item 2).

Server-side settings may name a vault secret instead of holding it: in an ``mcpServers``
entry's ``env`` and ``headers``, and in ``http_headers`` — never in ``args`` or ``command``,
which every local user can read (``workers.mcp_config`` refuses them there). The reference stays a
reference in every file, message and record; it is resolved only in the process that needs
the value, at the moment it starts a server or makes a call, and the value is remembered for
masking (``workers.masking``). The brain installs the resolver (``brain.runtime.vault``): this layer
knows no store and no key.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from workers import masking
from workers.errors import WorkerError

VAULT_REF = re.compile(r"\$\{vault:([A-Za-z_][A-Za-z0-9_.-]{0,127})\}")

Resolver = Callable[[str], str]
_resolver: Resolver | None = None


class SecretUnavailable(WorkerError):
    """A ``${vault:NAME}`` reference cannot be resolved; the message names the reference and
    where it is, never a value."""


def use_resolver(resolver: Resolver | None) -> None:
    """Install how this process reads a secret by name (``brain.runtime.vault.install``)."""
    global _resolver
    _resolver = resolver


def references(text: str) -> list[str]:
    return VAULT_REF.findall(text)


def resolve(text: str, where: str) -> str:
    """``text`` with each ``${vault:NAME}`` replaced by the secret's value."""
    if "${vault:" not in text:
        return text

    def value_of(match: re.Match[str]) -> str:
        name = match.group(1)
        if _resolver is None:
            raise SecretUnavailable(
                f"{where} refers to ${{vault:{name}}}, but this process has no vault "
                "(the brain and the server pool resolve vault references)"
            )
        try:
            value = _resolver(name)
        except WorkerError:
            raise
        except Exception as exc:
            raise SecretUnavailable(f"{where} refers to ${{vault:{name}}}: {exc}") from exc
        masking.remember(value)
        return value

    return VAULT_REF.sub(value_of, text)


def resolve_values(values: Mapping[str, str], where: str) -> dict[str, str]:
    return {key: resolve(value, f"{where} {key!r}") for key, value in values.items()}


__all__ = ["VAULT_REF", "SecretUnavailable", "references", "resolve", "resolve_values", "use_resolver"]
