"""brain.runtime.gateway_door: what the gateway may ask is a closed shape, and its envelope is kombu's."""

from __future__ import annotations

import base64
import json

import pytest
from pydantic import ValidationError

from brain.runtime.gateway_door import GatewayRequest, envelope
from workers.contracts import GATEWAY_QUEUE, key_gateway_reply

GOOD = {"request_id": "a" * 32, "token": "vtg_x", "kind": "submit", "tree": {"id": "t", "tasks": []}}


def test_a_request_names_no_user_and_nothing_else_it_could_forge() -> None:
    assert GatewayRequest.model_validate(GOOD).kind == "submit"
    for bad in (
        {**GOOD, "user": "ada"},  # the user is the token's, never a field
        {**GOOD, "kind": "run_tool"},
        {**GOOD, "request_id": "../../client.laptop"},
        {**GOOD, "token": ""},
    ):
        with pytest.raises(ValidationError):
            GatewayRequest.model_validate(bad)
    assert "vtg_x" not in repr(GatewayRequest.model_validate(GOOD))  # never logged


def test_the_reply_key_takes_only_a_request_id() -> None:
    assert key_gateway_reply("0" * 32) == "gateway.reply." + "0" * 32
    with pytest.raises(ValueError, match="invalid gateway request id"):
        key_gateway_reply("x*")


def test_the_envelope_is_the_redis_transports_json_with_the_body_in_base64() -> None:
    message = json.loads(envelope(GOOD))
    assert message["content-type"] == "application/json"
    assert message["properties"]["delivery_info"]["routing_key"] == GATEWAY_QUEUE
    assert json.loads(base64.b64decode(message["body"])) == GOOD
