"""JSON with comments, as VS Code's ``mcp.json`` is written (layer: workers).

One job: turn JSONC text (``//`` and ``/* */`` comments, a trailing comma before ``}`` or
``]``, a leading byte-order mark) into JSON text for ``json.loads``. Each comment, the
trailing comma and the mark become spaces (a comment's newlines stay), so the text keeps
its length and its lines: ``json.loads``'s line and column numbers still point into the file
as the user wrote it. Strings are copied as they are, so ``"http://host"`` or ``",]"``
inside one is never touched. Anything else that is not JSON (a comma with no value before
it, single quotes, a bare key) is left for ``json.loads`` to report.
"""

from __future__ import annotations

import json
import re

_NOT_NEWLINE = re.compile(r"[^\n]")
# A comma after one of these has no value before it: it is not a trailing comma, and json
# must see it to say so.
_NO_VALUE_BEFORE = frozenset("[{,:")
_WHITESPACE = frozenset(" \t\r\n")


def jsonc_to_json(text: str) -> str:
    """``text`` with its comments, trailing commas and byte-order mark blanked out; an
    unterminated ``/*`` raises ``json.JSONDecodeError`` at its start."""
    out: list[str] = []
    trailing: int | None = None  # where in ``out`` a comma is that only blanks have followed so far
    last = ""  # the last character that is not a blank, a comment or a string's inside
    i, n = 0, len(text)
    if text.startswith("\ufeff"):
        out.append(" ")
        i = 1
    while i < n:
        char = text[i]
        if char == '"':
            end = _string_end(text, i)
            out.append(text[i:end])
            trailing, last, i = None, '"', end
        elif text.startswith("//", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
            out.append(" " * (end - i))
            i = end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            if end < 0:
                raise json.JSONDecodeError("unterminated /* comment", text, i)
            out.append(_NOT_NEWLINE.sub(" ", text[i : end + 2]))
            i = end + 2
        elif char in _WHITESPACE:
            out.append(char)
            i += 1
        else:
            if char in "}]" and trailing is not None:
                out[trailing] = " "
            trailing = len(out) if char == "," and last not in _NO_VALUE_BEFORE and last else None
            out.append(char)
            last = char
            i += 1
    return "".join(out)


def _string_end(text: str, start: int) -> int:
    """The index after the string that opens at ``start`` (or the end of the text: an
    unterminated string is copied whole, and json reports it where it really is)."""
    i, n = start + 1, len(text)
    while i < n:
        char = text[i]
        if char == "\\":
            i += 2
        elif char == '"':
            return i + 1
        elif char == "\n":
            return i  # JSON strings do not span lines: json reports the string from here on
        else:
            i += 1
    return n
