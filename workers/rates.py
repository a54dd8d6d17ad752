"""Rate limits and concurrency caps as written in configuration (layer: workers; pure).

One job: read ``rate_limit: "10/s"`` (also ``/m``, ``/h``) and ``max_concurrency: N``
wherever they are written — a registry tool, an ``mcpServers`` entry, a ``[[pools]]``
table — with one grammar and one wording of its errors. It lives in ``workers/`` because
the ``mcpServers`` file is read here (``workers.mcp_config``); the brain's models
(``brain.core.fairshare``) use the same functions. How the limits are enforced is
``brain.hot.gate``; docs/fair-share.md says what they mean.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}
_RATE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*/\s*(s|m|h)\s*")
# A rate a Redis-side token bucket can keep: at most 10,000 calls a second, at least one a day.
MAX_PER_S = 10_000.0
MIN_PER_S = 1 / 86_400
MAX_CONCURRENCY = 100_000


def rate_per_s(text: str) -> float:
    """Calls per second of ``"N/s"``, ``"N/m"`` or ``"N/h"``; ValueError saying how to write it."""
    found = _RATE.fullmatch(text) if isinstance(text, str) else None
    if found is None:
        raise ValueError(
            f"{text!r} is not a rate limit: write calls per second, minute or hour as "
            '"10/s", "100/m" or "1000/h"'
        )
    count = float(found.group(1))
    if count <= 0:
        raise ValueError(f"{text!r}: a rate limit must allow at least some calls (N > 0)")
    per_s = count / _UNITS[found.group(2)]
    if per_s > MAX_PER_S:
        raise ValueError(f"{text!r} is over {MAX_PER_S:g}/s, the most a rate limit can hold")
    if per_s < MIN_PER_S:
        raise ValueError(f"{text!r} is under one call a day, the least a rate limit can hold")
    return per_s


def _rate_text(value: Any) -> Any:
    if value is None:
        return None
    if not isinstance(value, str):
        # ValueError, not TypeError: pydantic turns only the former into a validation error.
        raise ValueError(  # noqa: TRY004
            f'{value!r} is not a rate limit: write it as a string, e.g. "10/s", "100/m" or "1000/h"'
        )
    rate_per_s(value)
    return " ".join(value.split()).replace(" ", "")


def _concurrency(value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{value!r} is not a number of calls: write a whole number of at least 1")  # noqa: TRY004
    if value < 1:
        raise ValueError(f"{value} would let no call run: write a whole number of at least 1")
    if value > MAX_CONCURRENCY:
        raise ValueError(f"{value} is over {MAX_CONCURRENCY}, the most a cap can hold")
    return value


# A rate limit as written ("10/s"), checked; ``rate_per_s`` turns it into a number.
RateLimitText = Annotated[str | None, BeforeValidator(_rate_text)]
# A concurrency cap: a whole number of at least 1.
Concurrency = Annotated[int | None, BeforeValidator(_concurrency)]


class Limits(BaseModel):
    """The limits written on one tool, MCP server or pool (both None: unlimited)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rate_limit: RateLimitText = Field(default=None)
    max_concurrency: Concurrency = Field(default=None)

    @property
    def any(self) -> bool:
        return self.rate_limit is not None or self.max_concurrency is not None
