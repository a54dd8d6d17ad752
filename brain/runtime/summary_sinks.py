"""Where a run summary goes besides the store (layer: brain/runtime; I/O glue).

One job: write a summary to the file its schedule names (Markdown or JSON, by extension)
and POST it to the schedule's webhook. A sink that fails is reported as a line, never
raised: a full disk or a webhook that is down must not stop the next summary.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

import httpx2

from brain.core.schedules import Schedule, summary_format, zone_of
from brain.core.summary import RunSummary, render_markdown

log = logging.getLogger("vancetope.brain")
WEBHOOK_TIMEOUT_S: Final = 10.0


def summary_path(template: str, summary: RunSummary, timezone: str = "UTC") -> Path:
    """The file ``template`` names for ``summary``; ``{date}`` is the run's start day in the
    schedule's time zone (a 02:00 Paris batch is filed under its Paris date)."""
    started = datetime.fromtimestamp(summary.submitted_at, zone_of(timezone))
    return Path(
        template.format(
            schedule=summary.schedule or summary.name,
            date=started.strftime("%Y-%m-%d"),
            tree_id=summary.tree_id,
            kind=summary.kind.value,
        )
    )


def payload(summary: RunSummary) -> dict[str, Any]:
    """What a JSON file and a webhook receive: the summary, and its Markdown under ``markdown``
    (chat webhooks can post it as is)."""
    return {**summary.model_dump(mode="json"), "markdown": render_markdown(summary)}


def write_summary_file(path: Path, summary: RunSummary) -> None:
    """Write atomically (a reader never sees half a report); a later summary of the same
    name (the final one after a deadline's) replaces it."""
    text = (
        json.dumps(payload(summary), indent=2) + "\n"
        if summary_format(str(path)) == "json"
        else render_markdown(summary)
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def post_summary(url: str, summary: RunSummary, timeout: float = WEBHOOK_TIMEOUT_S) -> None:
    """POST the summary as JSON; an HTTP error status raises like a network failure."""
    response = httpx2.post(url, json=payload(summary), timeout=timeout)
    response.raise_for_status()


def deliver(spec: Schedule, summary: RunSummary) -> list[str]:
    """Send ``summary`` to ``spec``'s sinks; one line per sink that failed (logged too)."""
    problems: list[str] = []
    if spec.summary_file:
        path = summary_path(spec.summary_file, summary, spec.timezone)
        try:
            write_summary_file(path, summary)
        except OSError as exc:
            problems.append(f"schedule {spec.name!r}: could not write summary file {path}: {exc}")
    if spec.summary_webhook:
        try:
            post_summary(spec.summary_webhook, summary)
        except httpx2.HTTPError as exc:
            # Only scheme and host: a webhook URL often carries its secret in the path, and
            # httpx's own text of a status error quotes the whole URL, so it is not used.
            where = urlsplit(spec.summary_webhook)
            shown = f"{where.scheme}://{where.hostname}/…"
            detail = (
                f"it answered HTTP {exc.response.status_code}"
                if isinstance(exc, httpx2.HTTPStatusError)
                else str(exc).replace(spec.summary_webhook, shown)
            )
            problems.append(f"schedule {spec.name!r}: summary webhook {shown} failed: {detail}")
    for line in problems:
        log.warning("%s", line)
    return problems
