"""Tool-argument problems in one wording on every route (layer: workers, pure).

The brain checks a tree's arguments before anything runs, a server worker and a client
agent check them again before a call (the schema they hold may be newer); all three say
the same thing, and list every problem, not the first: ``args.items[1].name: 7 is not
of type 'string'``, ``args: 'value' is a required property``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from jsonschema.exceptions import ValidationError

ArgPath = tuple[str | int, ...]


def where(path: Iterable[str | int], root: str = "args") -> str:
    """``("a", 0, "b")`` -> ``args.a[0].b``: how a problem names a place inside the arguments."""
    out = root
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def in_order(errors: Iterable[ValidationError]) -> list[ValidationError]:
    """Errors by place, then message: the same list in the same order whoever validates."""
    return sorted(errors, key=lambda e: (tuple(str(p) for p in e.absolute_path), e.message))


def describe(error: ValidationError) -> str:
    return f"{where(error.absolute_path)}: {error.message}"


def problems(errors: Iterable[ValidationError]) -> list[str]:
    return [describe(e) for e in in_order(errors)]


def joined(tool: str, found: Sequence[str]) -> str:
    """The message of a call refused for its arguments."""
    return f"invalid arguments for tool {tool!r}: " + "; ".join(found)


def first_field(errors: Sequence[ValidationError]) -> str:
    """The dotted name of the first offending field (for the error's data), ``(arguments)``
    when the problem is the arguments object itself and no field can be named."""
    error = in_order(errors)[0]
    path = [str(part) for part in error.absolute_path]
    if error.validator == "required" and isinstance(error.instance, dict):
        path.extend([name for name in error.validator_value if name not in error.instance][:1])
    elif error.validator == "additionalProperties" and isinstance(error.instance, dict):
        path.extend(sorted(set(error.instance) - set(error.schema.get("properties", {})))[:1])
    return ".".join(path) or "(arguments)"
