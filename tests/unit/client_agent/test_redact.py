"""What leaves the workstation (pure): redaction of a result's text, and the agent's own cap."""

from __future__ import annotations

import pytest

from client_agent.redact import BUILTIN_PATTERNS, REPLACEMENT, Redactor, capped
from workers.contracts import ToolResult, result_size

KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\nAAAA\n-----END OPENSSH PRIVATE KEY-----"


def result(value: object = None, mcp: dict | None = None, ok: bool = True) -> ToolResult:
    return ToolResult(
        run_id="r", tree_id="t", task_id="read", tool="read_local_file", ok=ok, value=value, mcp=mcp,
        started_at=0.0, finished_at=1.0, client_id="laptop",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("builtin", "text"),
    [
        ("private_keys", f"before\n{KEY}\nafter"),
        ("private_keys", "-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----"),
        ("aws_keys", "id AKIAIOSFODNN7EXAMPLE here"),
        ("aws_keys", "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"),
        ("github_tokens", "token ghp_" + "a" * 36),
        ("github_tokens", "github_pat_" + "B" * 40),
        ("bearer_tokens", "Authorization: Bearer abcdefghijklmnop.qrstuv"),
    ],
)
def test_each_builtin_set_redacts_its_secrets(builtin: str, text: str) -> None:
    redacted, n = Redactor.build((), [builtin]).text(text)
    assert n >= 1 and REPLACEMENT in redacted
    assert "PRIVATE KEY-----\nb3B" not in redacted and "EXAMPLE" not in redacted.replace(REPLACEMENT, "")


def test_builtin_sets_leave_ordinary_text_alone() -> None:
    redactor = Redactor.build((), list(BUILTIN_PATTERNS))
    assert redactor.text("a bearer of good news; the AKIA prefix; ghp_short") == (
        "a bearer of good news; the AKIA prefix; ghp_short",
        0,
    )


def test_every_string_of_a_native_value_is_redacted_and_counted() -> None:
    redactor = Redactor.build([r"hunter\d"], ["private_keys"])
    out = redactor.result(result({"content": f"pw hunter2\n{KEY}", "list": ["hunter3", 5], "hunter4": True}))
    assert out.redactions == 4
    assert out.value == {
        "content": f"pw {REPLACEMENT}\n{REPLACEMENT}",
        "list": [REPLACEMENT, 5],
        REPLACEMENT: True,
    }


def test_an_mcp_result_has_its_text_blocks_resources_and_structured_content_redacted() -> None:
    redactor = Redactor.build([r"s3cr3t"])
    whole = {
        "content": [
            {"type": "text", "text": "a s3cr3t"},
            {"type": "image", "data": "czNjcjN0", "mimeType": "image/png"},  # binary: left alone
            {"type": "resource", "resource": {"uri": "file:///x", "text": "s3cr3t s3cr3t"}},
        ],
        "structuredContent": {"nested": ["s3cr3t"]},
        "isError": False,
    }
    out = redactor.result(result(mcp=whole))
    assert out.redactions == 4
    assert out.mcp is not None
    assert out.mcp["content"][0]["text"] == f"a {REPLACEMENT}"
    assert out.mcp["content"][1] == whole["content"][1]
    assert out.mcp["content"][2]["resource"]["text"] == f"{REPLACEMENT} {REPLACEMENT}"
    assert out.mcp["structuredContent"] == {"nested": [REPLACEMENT]}


def test_a_result_without_matches_is_returned_as_is() -> None:
    original = result("nothing to hide")
    assert Redactor.build([r"s3cr3t"]).result(original) is original


def test_a_result_over_the_agents_cap_fails_naming_its_size_and_the_cap_and_carries_nothing() -> None:
    big = result("x" * 500)
    out = capped(big, 100)
    assert not out.ok and out.value is None and out.error is not None
    assert out.error.type == "ResultTooLarge"
    assert (
        f"is {result_size(big.value, big.mcp)} bytes" in out.error.message
        and "max_result_bytes of 100 bytes" in out.error.message
    )
    assert "task 'read'" in out.error.message and "not sent" in out.error.message
    assert capped(big, None) is big and capped(big, 10_000) is big
