"""The gateway's way into the brain (layer: brain/runtime; models, the brain's handler, the
gateway's sender).

Issue 20 (H6): the gateway used to submit and cancel itself, as the brain does, so its Redis
user could write every key — a forged ``run_tool`` on any workstation. Now it only *asks*:
a request on queue ``gateway`` (``GATEWAY_QUEUE``) carries the caller's bearer token, and the
brain turns the token into the user itself (``tokens.user_of``), checks the tree as every way
in does (limits, registry), submits or cancels, and puts one reply on
``gateway.reply.<request_id>``. A gateway that lies about the user gets nothing: it would need
the user's token. Everything in a request is hostile input to the brain.
"""

from __future__ import annotations

import base64
import json
import logging
import time
import uuid
from typing import Any, Literal

import redis
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from brain.core.limits import check_tree_data
from brain.core.models import SessionKind
from brain.core.submission import SubmitRequest
from brain.core.treefile import tree_from_data
from brain.errors import BrainError
from brain.runtime import gateway_tokens as tokens
from brain.runtime.service import Brain
from workers.contracts import GATEWAY_QUEUE, key_gateway_reply

log = logging.getLogger("vancetope.gateway.door")
# How long a reply waits for the gateway to read it.
REPLY_TTL_S = 120
# One blocking pop's longest wait: under redis-py's default socket read timeout (5 s).
BLOCK_S = 2.0
_REQUEST_ID = r"^[0-9a-f]{32}$"


class GatewayRequest(BaseModel):
    """What the gateway asks the brain: submit a tree, or cancel (a task of) a tree."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    request_id: str = Field(pattern=_REQUEST_ID)
    token: str = Field(min_length=1, max_length=256, repr=False)
    kind: Literal["submit", "cancel"]
    tree: dict[str, Any] | None = None
    session: SessionKind = SessionKind.INTERACTIVE
    tree_id: str | None = Field(default=None, max_length=256)
    task_id: str | None = Field(default=None, max_length=256)
    # A tools/call (one task, its MCP client waiting), not brain_submit_tree: its MCP server may
    # ask that client (sampling, elicitation). A one-task tree only (Scheduler.submit).
    call: bool = False


class GatewayReply(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    ok: bool
    error: str = ""
    tree_id: str | None = None
    warnings: list[str] = Field(default_factory=list)
    cancelled: list[str] = Field(default_factory=list)


class DoorRefused(BrainError):
    """The brain refused a gateway request; the text says why (shown to the MCP client)."""


# --- the brain's side --------------------------------------------------------------------


def handle(brain: Brain, request: GatewayRequest) -> GatewayReply:
    """Serve one request as the token's user. Never raises a BrainError: it is the reply."""
    user = tokens.user_of(brain.store, request.token)
    if user is None:
        log.error("refused gateway request %s: its token is not a valid gateway token", request.request_id)
        return GatewayReply(ok=False, error="the token is not valid (revoked or unknown)")
    try:
        if request.kind == "submit":
            return _submit(brain, user, request)
        return _cancel(brain, user, request)
    except BrainError as exc:
        log.error("refused gateway request %s of user %s: %s", request.request_id, user, exc)
        return GatewayReply(ok=False, error=str(exc))


def _submit(brain: Brain, user: str, request: GatewayRequest) -> GatewayReply:
    if request.tree is None:
        raise DoorRefused("a submit request needs a tree")
    source = "brain_submit_tree" if request.session is SessionKind.AUTONOMOUS else "tools/call"
    check_tree_data(request.tree, brain.settings, source=source)
    tree = tree_from_data(request.tree, source=source)
    accepted = brain.scheduler.accept(
        SubmitRequest(
            tree=tree,
            source=source,
            session=request.session,
            user=user,
            gateway_call=request.call and request.session is SessionKind.INTERACTIVE,
            # A call's run id is the gateway's choice, so that it listens to the tree's channel
            # before anything runs (an MCP server may log or ask at once). Checked as every
            # chosen id is; one already taken is refused by the store.
            tree_id=request.tree_id if request.call else None,
        )
    )
    log.info("gateway: submitted tree %s for user %s", accepted.record.tree_id, user)
    return GatewayReply(ok=True, tree_id=accepted.record.tree_id, warnings=accepted.warnings)


def _cancel(brain: Brain, user: str, request: GatewayRequest) -> GatewayReply:
    record = brain.store.get_tree(request.tree_id) if request.tree_id else None
    if record is None or record.user != user:
        # Another user's tree is as unknown as a tree that does not exist.
        raise DoorRefused(f"no tree {request.tree_id!r} of yours")
    if request.task_id is not None and brain.store.get_task(record.tree_id, request.task_id) is None:
        raise DoorRefused(f"tree {record.tree_id!r} has no task {request.task_id!r}")
    return GatewayReply(ok=True, cancelled=brain.sweeps.cancel(record.tree_id, request.task_id))


def on_request(brain: Brain, body: Any) -> None:
    """One message of queue ``gateway``: handle it and put the reply where the gateway waits."""
    try:
        request = GatewayRequest.model_validate(body)
    except ValidationError as exc:
        log.error("dropped a malformed gateway request: %s", exc.errors(include_input=False))
        return
    reply = handle(brain, request)
    key = key_gateway_reply(request.request_id)
    pipe = brain.hot.r.pipeline(transaction=True)
    pipe.lpush(key, reply.model_dump_json())
    pipe.expire(key, REPLY_TTL_S)
    pipe.execute()


# --- the gateway's side ------------------------------------------------------------------


def envelope(body: dict[str, Any]) -> bytes:
    """A kombu message (the Redis transport's JSON form) the brain's consumer reads: the
    gateway only LPUSHes it, so its Redis user needs no binding set, no Celery, no kombu."""
    payload = json.dumps(body).encode()
    return json.dumps(
        {
            "body": base64.b64encode(payload).decode(),
            "content-encoding": "utf-8",
            "content-type": "application/json",
            "headers": {},
            "properties": {
                "body_encoding": "base64",
                "delivery_tag": str(uuid.uuid4()),
                "delivery_mode": 2,
                "priority": 0,
                "delivery_info": {"exchange": "", "routing_key": GATEWAY_QUEUE},
            },
        }
    ).encode()


def ask(r: redis.Redis, timeout_s: float, **fields: Any) -> GatewayReply:
    """Send one request and wait for its reply; DoorRefused with the brain's words, or when no
    brain answered within ``timeout_s``."""
    request = GatewayRequest(request_id=uuid.uuid4().hex, **fields)
    body = request.model_dump(mode="json")
    if not request.call:
        body.pop("call")  # what a brain before the field reads too
    r.lpush(GATEWAY_QUEUE, envelope(body))
    found = None
    deadline = time.monotonic() + timeout_s
    # Short blocking pops up to the deadline: redis-py 8 reads with a 5 s socket timeout by
    # default, so one BLPOP of 30 s raised "Timeout reading from socket" when the brain was slow.
    while found is None and (left := deadline - time.monotonic()) > 0:
        found = r.blpop([key_gateway_reply(request.request_id)], timeout=min(left, BLOCK_S))
    if found is None:
        raise DoorRefused(
            f"the brain did not answer the gateway's {request.kind} request within {timeout_s:g}s; is it running?"
        )
    reply = GatewayReply.model_validate_json(found[1])
    if not reply.ok:
        raise DoorRefused(reply.error)
    return reply


__all__ = ["DoorRefused", "GatewayReply", "GatewayRequest", "ask", "envelope", "handle", "on_request"]
