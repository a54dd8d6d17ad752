"""Pinned client tool definitions (layer: brain/hot; pure split, thin Redis glue).

One job: remember, per client, a digest of each tool definition it announced (name, MCP
server, description, input schema) and hold back a tool whose definition changed since
(a "rug pull", docs/security.md "A workstation"): it is not routed to until the operator runs
``vancetope clients approve-tools CLIENT [TOOL...]``. A tool seen for the first time is
pinned as announced. Pins live in the brain's own key ``vt:toolpins:<id>``, which the
client's Redis user cannot reach.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import redis

from brain.hot.state import as_text
from workers.contracts import CLIENT_ACK, ToolDescriptor, client_key, key_tool_pins


def pin_of(tool: ToolDescriptor) -> str:
    definition = {
        "name": tool.name,
        "mcp_server": tool.mcp_server,
        "description": tool.description,
        "input_schema": tool.input_schema,
    }
    return hashlib.sha256(json.dumps(definition, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@dataclass(frozen=True)
class PinSplit:
    accepted: list[ToolDescriptor] = field(default_factory=list)
    held: list[ToolDescriptor] = field(default_factory=list)
    new_pins: dict[str, str] = field(default_factory=dict)


def split_pinned(tools: Iterable[ToolDescriptor], pins: Mapping[str, str]) -> PinSplit:
    """Pure: tools as pinned (or new, then pinned) are accepted; changed ones are held."""
    split = PinSplit()
    for tool in tools:
        digest = pin_of(tool)
        pinned = pins.get(tool.name)
        if pinned is None:
            split.new_pins[tool.name] = digest
            split.accepted.append(tool)
        elif pinned == digest:
            split.accepted.append(tool)
        else:
            split.held.append(tool)
    return split


class ToolPins:
    def __init__(self, r: redis.Redis) -> None:
        self.r = r

    def check(self, client_id: str, tools: list[ToolDescriptor]) -> PinSplit:
        key = key_tool_pins(client_id)
        pins = {as_text(k): as_text(v) for k, v in self.r.hgetall(key).items()}
        split = split_pinned(tools, pins)
        if split.new_pins:
            self.r.hset(key, mapping=cast(Any, split.new_pins))
        return split

    def approve(self, client_id: str, held: Iterable[ToolDescriptor], names: Iterable[str] = ()) -> list[str]:
        """Pin the held tools named (all when ``names`` is empty) as they are now, then drop the
        client's ack: its agent announces again and the brain accepts them. The names pinned."""
        wanted = set(names)
        chosen = {t.name: pin_of(t) for t in held if not wanted or t.name in wanted}
        if chosen:
            self.r.hset(key_tool_pins(client_id), mapping=cast(Any, chosen))
            self.r.delete(client_key(client_id, CLIENT_ACK))
        return sorted(chosen)

    def forget(self, client_id: str) -> None:
        self.r.delete(key_tool_pins(client_id))
