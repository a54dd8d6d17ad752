"""Who hears that an upstream resource changed (layer: brain/core, pure).

An upstream MCP server's ``notifications/resources/updated`` reaches the gateway as a
``ResourceUpdated`` on a pub/sub channel (``workers.contracts``): published by a server pool,
or by the brain for a client agent, stamped with the client whose outbox carried it. What a
client's agent says is untrusted: the message is bounded before it is parsed, parsed strictly,
and passed on only to sessions that subscribed to that very URI of that very server while the
user's catalog said the server is that client's (so never to another user's session).
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import ValidationError

from brain.core.models import Location
from workers.contracts import MAX_RESOURCE_UPDATE_BYTES, ResourceUpdated


class Dropped(ValueError):
    """A message on the channel that is not passed on, and why."""


def parse_update(raw: bytes | str) -> ResourceUpdated:
    """The message as a ``ResourceUpdated``; ``Dropped`` saying why not (too big, not one)."""
    size = len(raw)
    if size > MAX_RESOURCE_UPDATE_BYTES:
        raise Dropped(f"{size} bytes, over the {MAX_RESOURCE_UPDATE_BYTES}-byte limit")
    try:
        return ResourceUpdated.model_validate_json(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise Dropped(f"malformed: {'.'.join(map(str, first['loc'])) or 'message'}: {first['msg']}") from None


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


__all__ = ["Dropped", "may_notify", "parse_update", "subscribers"]
