"""Who hears that an upstream resource changed (layer: brain/core, pure).

An upstream MCP server's ``notifications/resources/updated`` reaches the gateway as a
``ResourceUpdated`` on a pub/sub channel (``workers.contracts``): published by a server pool,
or by the brain for a client agent, stamped with the client whose outbox carried it. What a
client's agent says is untrusted: the message is bounded before it is parsed, parsed strictly,
and passed on only to sessions that subscribed to that very URI of that very server while the
user's catalog said the server is that client's (so never to another user's session).

A hostile workstation can send a thousand of them a relay round, so what each costs is bounded
twice: the brain passes on only updates about a server the client's session announced a reader
for (``announced_servers``), and every drop is logged at most once a minute per sender, with
the count since (``DropCounts``), in the brain and in the gateway.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import ValidationError

from brain.core.models import Location
from brain.core.sessions import ClientSession
from workers.contracts import MAX_RESOURCE_UPDATE_BYTES, READ_RESOURCE, ResourceUpdated, surface_op

# A sender's drops are logged at most this often (the first at once).
DROP_LOG_EVERY_S = 60.0


class Dropped(ValueError):
    """A message on the channel that is not passed on, and why; ``kind``: "too big" or
    "malformed" (what a log line is kept to once a minute by)."""

    def __init__(self, kind: str, why: str) -> None:
        super().__init__(why)
        self.kind = kind


def parse_update(raw: bytes | str) -> ResourceUpdated:
    """The message as a ``ResourceUpdated``; ``Dropped`` saying why not (too big, not one)."""
    size = len(raw)
    if size > MAX_RESOURCE_UPDATE_BYTES:
        raise Dropped("too big", f"{size} bytes, over the {MAX_RESOURCE_UPDATE_BYTES}-byte limit")
    try:
        return ResourceUpdated.model_validate_json(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise Dropped(
            "malformed", f"malformed: {'.'.join(map(str, first['loc'])) or 'message'}: {first['msg']}"
        ) from None


def subscribers(subscribed: Mapping[str, Mapping[str, str]], reader: str, uri: str) -> list[str]:
    """The sessions (of ``subscribed``: session -> URI -> the surface tool that reads it) that
    subscribed to ``uri`` as read by ``reader`` (``<server>#read_resource``), in order."""
    return sorted(sid for sid, uris in subscribed.items() if uris.get(uri) == reader)


def may_notify(location: Location, clients: tuple[str, ...], client_id: str | None) -> bool:
    """Whether a change said by ``client_id`` (None: a server pool) may be about the server
    behind a reader the user sees at ``location``, offered by the user's ``clients``: a client
    speaks only for servers it offers this user; a pool only for servers that run on the server."""
    if client_id is None:
        return location is not Location.CLIENT
    return client_id in clients


def announced_servers(session: ClientSession | None) -> frozenset[str]:
    """The MCP servers whose resources ``session`` offers to read (``<server>#read_resource``
    announced and routable): the only servers whose changes that client may report."""
    if session is None:
        return frozenset()
    found = set()
    for tool in session.tools:
        parts = surface_op(tool.name)
        if parts is not None and parts[1] == READ_RESOURCE:
            found.add(parts[0])
    return frozenset(found)


class DropCounts:
    """When to log that a sender's update was dropped: the first at once, then at most one line
    per ``every_s`` for that sender, saying how many it covers. One entry per sender (a client id
    or the pool), so it is bounded by the enrolled clients."""

    def __init__(self, every_s: float = DROP_LOG_EVERY_S) -> None:
        self.every_s = every_s
        self._by_sender: dict[str, tuple[float, int]] = {}  # sender -> (last line at, drops since)

    def dropped(self, sender: str, now: float) -> int | None:
        """Count one drop of ``sender``'s at ``now``: the number of drops to write a line about
        now (this one included), or None to stay quiet."""
        last = self._by_sender.get(sender)
        if last is None or now - last[0] >= self.every_s:
            self._by_sender[sender] = (now, 0)
            return 1 if last is None else last[1] + 1
        self._by_sender[sender] = (last[0], last[1] + 1)
        return None


__all__ = [
    "DROP_LOG_EVERY_S",
    "DropCounts",
    "Dropped",
    "announced_servers",
    "may_notify",
    "parse_update",
    "subscribers",
]
