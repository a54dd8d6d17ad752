"""What of a result leaves the workstation (layer: client_agent, pure).

One job: before a result is sent, replace every match of the user's redaction patterns
(``redact`` in agent.toml, and the built-in sets named in ``redact_builtin``) in its text
- a native tool's value (every string in it), an MCP result's text content blocks, the
text of its embedded resources and every string of its ``structuredContent`` - and count
the replacements; then check the result against the agent's own ``max_result_bytes``.
Binary content (base64 ``data``/``blob``) is left alone: a pattern cannot read it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from workers.contracts import ErrorInfo, ToolResult, result_size

REPLACEMENT = "[REDACTED]"

# Named sets a user turns on with redact_builtin = ["private_keys", ...].
BUILTIN_PATTERNS: dict[str, tuple[str, ...]] = {
    "private_keys": (
        r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----[\s\S]*?-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----",
    ),
    "aws_keys": (
        r"\b(?:AKIA|ASIA|ABIA|ACCA)[0-9A-Z]{16}\b",
        r"(?i)\baws_secret_access_key\s*[=:]\s*['\"]?[A-Za-z0-9/+=]{40}['\"]?",
    ),
    "github_tokens": (
        r"\b(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{36,255}\b",
        r"\bgithub_pat_[A-Za-z0-9_]{22,255}\b",
    ),
    "bearer_tokens": (r"(?i)\bbearer\s+[A-Za-z0-9\-._~+/]{16,}=*",),
}


@dataclass(frozen=True)
class Redactor:
    """Compiled patterns; ``apply`` returns the redacted copy and how many matches it replaced."""

    patterns: tuple[re.Pattern[str], ...] = ()

    @classmethod
    def build(cls, patterns: Iterable[str], builtin: Iterable[str] = ()) -> Redactor:
        every = [*(p for name in builtin for p in BUILTIN_PATTERNS[name]), *patterns]
        return cls(tuple(re.compile(p) for p in every))

    def text(self, value: str) -> tuple[str, int]:
        total = 0
        for pattern in self.patterns:
            value, n = pattern.subn(REPLACEMENT, value)
            total += n
        return value, total

    def anything(self, value: Any) -> tuple[Any, int]:
        """Every string in a JSON value (keys too: a dict keyed by secrets would leak them)."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list):
            done = [self.anything(item) for item in value]
            return [v for v, _ in done], sum(n for _, n in done)
        if isinstance(value, dict):
            out: dict[Any, Any] = {}
            total = 0
            for key, item in value.items():
                new_key, k = self.anything(key) if isinstance(key, str) else (key, 0)
                out[new_key], n = self.anything(item)
                total += k + n
            return out, total
        return value, 0

    def mcp(self, whole: dict[str, Any]) -> tuple[dict[str, Any], int]:
        """An MCP CallToolResult: text blocks, embedded resources' text, structuredContent."""
        total = 0
        out = dict(whole)
        blocks = []
        for block in whole.get("content") or []:
            block, n = self._block(block)
            blocks.append(block)
            total += n
        if "content" in whole:
            out["content"] = blocks
        if whole.get("structuredContent") is not None:
            out["structuredContent"], n = self.anything(whole["structuredContent"])
            total += n
        return out, total

    def _block(self, block: Any) -> tuple[Any, int]:
        if not isinstance(block, dict):
            return block, 0
        if block.get("type") == "text" and isinstance(block.get("text"), str):
            text, n = self.text(block["text"])
            return {**block, "text": text}, n
        resource = block.get("resource")
        if (
            block.get("type") == "resource"
            and isinstance(resource, dict)
            and isinstance(resource.get("text"), str)
        ):
            text, n = self.text(resource["text"])
            return {**block, "resource": {**resource, "text": text}}, n
        return block, 0

    def result(self, result: ToolResult) -> ToolResult:
        """``result`` with its value and MCP result redacted and ``redactions`` counted."""
        if not self.patterns or not result.ok:
            return result
        value, n = self.anything(result.value)
        whole, m = self.mcp(result.mcp) if result.mcp is not None else (None, 0)
        if n + m == 0:
            return result
        return result.model_copy(update={"value": value, "mcp": whole, "redactions": n + m})


def capped(result: ToolResult, max_bytes: int | None) -> ToolResult:
    """``result``, or a failure naming its size and the cap when it is over ``max_bytes``: the
    payload is dropped here and never sent."""
    if max_bytes is None or not result.ok:
        return result
    try:
        size = result_size(result.value, result.mcp)
    except (TypeError, ValueError) as exc:
        return _not_json(result, exc)
    if size <= max_bytes:
        return result
    error = ErrorInfo(
        type="ResultTooLarge",
        message=(
            f"result of tool {result.tool!r} for task {result.task_id!r} is {size} bytes, over this "
            f"workstation's max_result_bytes of {max_bytes} bytes: it was not sent (return less, or "
            "raise max_result_bytes in the agent's config)"
        ),
        data={"task": result.task_id, "tool": result.tool, "size": size, "cap": max_bytes},
    )
    return result.model_copy(update={"ok": False, "value": None, "mcp": None, "error": error})


def _not_json(result: ToolResult, exc: Exception) -> ToolResult:
    """A value that is not JSON cannot be sent or measured: a failure, as the server worker's."""
    error = ErrorInfo(
        type="ToolFailed",
        message=f"result of tool {result.tool!r} for task {result.task_id!r} is not JSON-serialisable: {exc}",
        data={"task": result.task_id, "tool": result.tool},
    )
    return result.model_copy(update={"ok": False, "value": None, "mcp": None, "error": error})
