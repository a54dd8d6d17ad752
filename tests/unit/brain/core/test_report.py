"""brain.core.report: the JSON shapes scripts read (docs/output.md). A contract: fields are added,
never renamed or removed, so the tests name every field."""

from __future__ import annotations

import json

from brain.core.client_health import Mark
from brain.core.models import (
    Enrollment,
    Location,
    SessionKind,
    TaskRecord,
    TaskState,
    TaskTree,
    ToolSpec,
    TreeRecord,
    TreeStatus,
)
from brain.core.report import clients_report, tree_report, trees_report
from brain.core.sessions import ClientSession
from brain.core.snapshot import RegistrySnapshot
from workers.contracts import ClientType, ToolDescriptor, ToolType

TREE = TaskTree.model_validate(
    {
        "id": "nightly",
        "tasks": [{"id": "a", "tool": "echo"}, {"id": "b", "tool": "echo", "depends_on": ["a"]}],
    }
)
SUMMARY_FIELDS = {
    "tree_id", "name", "status", "session", "user", "client_id", "submitted_at", "finished_at", "counts", "schedule",
}  # fmt: skip


def record(tree_id: str = "nightly-1", **fields: object) -> TreeRecord:
    return TreeRecord(tree_id=tree_id, tree=TREE, submitted_at=100.0, **fields)  # type: ignore[arg-type]


def test_a_tree_report_has_the_summary_and_every_task_record_whole_in_order() -> None:
    big = "x" * 100_000  # results are never cut
    tasks = [
        TaskRecord(tree_id="nightly-1", task_id="a", tool="echo", state=TaskState.DONE, result=big),
        TaskRecord(tree_id="nightly-1", task_id="b", tool="echo", state=TaskState.PENDING),
    ]
    report = tree_report(record(user="ada", schedule="nightly", status=TreeStatus.RUNNING), tasks)
    assert set(report) == SUMMARY_FIELDS | {"tasks"}
    assert report["name"] == "nightly" and report["status"] == "running" and report["session"] == "autonomous"
    assert report["user"] == "ada" and report["schedule"] == "nightly" and report["finished_at"] is None
    assert report["counts"] == {"done": 1, "pending": 1}
    assert [t["task_id"] for t in report["tasks"]] == ["a", "b"]
    assert report["tasks"][0]["result"] == big
    json.dumps(report)  # plain JSON all through


def test_trees_report_counts_in_sorted_state_order_and_zero_for_a_tree_without_counts() -> None:
    trees = [record("t2", session=SessionKind.INTERACTIVE, client_id="laptop"), record("t1")]
    report = trees_report(trees, {"t2": {"running": 1, "done": 3}})
    assert [r["tree_id"] for r in report] == ["t2", "t1"]  # as given: newest first
    assert list(report[0]["counts"]) == ["done", "running"]
    assert report[0]["session"] == "interactive" and report[0]["client_id"] == "laptop"
    assert report[1]["counts"] == {}
    assert all(set(r) == SUMMARY_FIELDS for r in report)


def test_clients_report_every_enrolled_client_never_its_secret() -> None:
    enrolled = {
        cid: Enrollment(client_id=cid, user="ada", enrolled_at=1.0, secret_sha256="f" * 64)
        for cid in ("laptop", "desk")
    }
    sessions = {
        "laptop": ClientSession(
            client_id="laptop", user="ada", session_id="s1", client_type=ClientType.CLI, connected_at=5.0,
            tools=[ToolDescriptor(name=n, type=ToolType.NATIVE) for n in ("zz", "aa")],
            held_tools=[ToolDescriptor(name="changed", type=ToolType.NATIVE)],
        )
    }  # fmt: skip
    marks = {"desk": Mark(causes={"quota": "keeps 90 MB", "ack type": "its ack is a list"}, since=2.0)}
    rtts = {"laptop": 23.5, "desk": 9.0}  # desk's is an old key: it is offline
    seen = {"desk": 3.0}
    report = clients_report(enrolled, sessions, {"client:laptop": 2, "user:ada": 7}, None, marks, rtts, seen)

    assert "registry" not in report
    desk, laptop = report["clients"]  # by client id
    assert laptop == {
        "client_id": "laptop", "user": "ada", "enrolled_at": 1.0, "connected": True, "client_type": "cli",
        "connected_at": 5.0, "round_trip_ms": 23.5, "last_seen": None, "tools": ["aa", "zz"], "held_tools": ["changed"], "clashes": [],
        "misbehaving": None, "waiting": {"client": 2, "user": 7},
    }  # fmt: skip
    assert desk["connected"] is False and desk["client_type"] is None and desk["tools"] == []
    assert desk["round_trip_ms"] is None and desk["last_seen"] == 3.0
    assert desk["misbehaving"] == "its ack is a list; keeps 90 MB"  # causes by kind
    assert desk["waiting"] == {"client": 0, "user": 7}
    assert "f" * 64 not in json.dumps(report)


def test_clients_report_says_the_registrys_last_load_once_it_has_one() -> None:
    assert "registry" not in clients_report({}, {}, {}, RegistrySnapshot())
    loaded = RegistrySnapshot(loaded_at=42.0, changes=["+ tool echo"])
    assert clients_report({}, {}, {}, loaded)["registry"] == {
        "tools": 0,
        "loaded_at": 42.0,
        "changes": ["+ tool echo"],
        "clashes": [],
    }


def test_clients_report_names_every_clash_of_the_registry_and_of_each_clients_tools() -> None:
    # Issue 24 item E: reported, never silently merged.
    registry = RegistrySnapshot(
        tools={"git_status": ToolSpec(name="git_status", location=Location.CLIENT, type=ToolType.NATIVE)},
        clashes={"git_status": ["registry file", "git.git_status"]},
        loaded_at=42.0,
    )
    laptop = ClientSession(
        client_id="laptop", user="ada", session_id="s1", client_type=ClientType.CLI, connected_at=5.0,
        tools=[ToolDescriptor(name="git_status", type=ToolType.MCP, mcp_server="mine")],
    )  # fmt: skip
    enrolled = {"laptop": Enrollment(client_id="laptop", user="ada", enrolled_at=1.0)}
    report = clients_report(enrolled, {"laptop": laptop}, {}, registry)
    assert report["clients"][0]["clashes"] == [
        (
            "tool name 'git_status' is offered by registry's native tool, mine.git_status: 'git_status' is the "
            "registry's native tool; write 'mine.git_status' for the other"
        )
    ]
    assert report["registry"]["clashes"] == [
        (
            "tool name 'git_status' is offered by registry file, git.git_status: 'git_status' is the registry "
            "file's tool; write 'git.git_status' for the other"
        )
    ]
