"""brain.runtime.submitters: a submit credential's ACL rules reach its own user's queue only."""

from __future__ import annotations

import fnmatch

import pytest

from brain.core.models import SubmitCredential
from brain.runtime.submitters import submit_username, submitter_acl_rules

PRIORITY = "\x06\x16"  # kombu's separator before a queue's priority


def test_a_credential_reaches_its_queue_and_its_priority_keys_and_nothing_named_alike() -> None:
    rules = submitter_acl_rules(SubmitCredential(user="alice", secret_sha256="a" * 64, created_at=1.0))
    assert rules[:3] == ["reset", "on", "#" + "a" * 64]
    patterns = [r[1:] for r in rules if r.startswith("~")]

    def reaches(key: str) -> bool:  # Redis's glob has fnmatch's [^...] as [!...]
        return any(fnmatch.fnmatchcase(key, p.replace("[^", "[!")) for p in patterns)

    assert reaches("submit.alice") and reaches(f"submit.alice{PRIORITY}3")
    assert reaches("_kombu.binding.submit.alice")
    for other in (
        "submit.alice2",
        "submit.alice.x",
        "submit.alice-x",
        "submit.bob",
        "client.alice",
        "server",
    ):
        assert not reaches(other), other
    assert "resetchannels" in rules and "-@all" in rules
    granted = {r[1:] for r in rules if r.startswith("+")}
    assert not granted & {"eval", "evalsha", "lpop", "rpop", "brpop", "scan", "keys", "get", "psubscribe"}


def test_a_user_name_that_could_widen_the_pattern_is_refused() -> None:
    assert submit_username("alice") == "vts-alice"
    for bad in ("a*", "a?", "a[b]", "", "a b", "../x"):
        with pytest.raises(ValueError, match="invalid user"):
            submit_username(bad)
