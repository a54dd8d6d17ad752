"""How many commands of each kind a real redis-server ran (``INFO commandstats``): what a
test of a cost counts instead of timing it."""

from __future__ import annotations

import redis


def reset_counts(r: redis.Redis) -> None:
    r.config_resetstat()


def command_counts(r: redis.Redis) -> dict[str, int]:
    """Calls per command since ``reset_counts`` (the INFO and CONFIG of the counting left out)."""
    stats = r.info("commandstats")
    counts = {name.removeprefix("cmdstat_"): int(row["calls"]) for name, row in stats.items()}
    return {name: n for name, n in counts.items() if not name.startswith(("info", "config"))}
