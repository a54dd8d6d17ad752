"""brain.core.summary: what a run did and for whom its waiting work waits, from records alone."""

from __future__ import annotations

from typing import Any

from brain.core.models import SessionKind, TaskRecord, TaskState, TaskTree, TreeRecord, TreeStatus
from brain.core.summary import SummaryCounts, SummaryKind, TaskLine, WaitingFor, render_markdown, summarise

S = TaskState


def run(
    tasks: list[tuple[str, str, TaskState, dict[str, Any]]], **tree: Any
) -> tuple[TreeRecord, list[TaskRecord]]:
    spec = TaskTree.model_validate({"id": "night", "tasks": [{"id": t[0], "tool": t[1]} for t in tasks]})
    record = TreeRecord(
        tree_id="night-1", tree=spec, submitted_at=100.0, schedule="nightly", user="demo", **tree
    )
    records = [
        TaskRecord(tree_id="night-1", task_id=tid, tool=tool, state=state, **extra)
        for tid, tool, state, extra in tasks
    ]
    return record, records


def test_counts_cover_every_state_a_run_can_leave_its_tasks_in() -> None:
    tree, tasks = run(
        [
            ("a", "echo", S.DONE, {}),
            ("b", "echo", S.DONE, {}),
            ("c", "http_get", S.FAILED, {"reason": "HTTP 500"}),
            ("d", "read_local_file", S.EXPIRED, {"reason": "expired: waited 3600s"}),
            ("e", "echo", S.SKIPPED, {"reason": "upstream task 'c' failed"}),
            ("f", "read_local_file", S.PENDING_CLIENT, {}),
            ("g", "sleep", S.RUNNING, {}),
            ("h", "echo", S.PENDING, {}),
        ]
    )
    summary = summarise(tree, tasks, SummaryKind.DEADLINE, at=200.0)
    assert summary.counts == SummaryCounts(
        total=8, done=2, failed=1, expired=1, skipped=1, waiting=1, in_flight=1, pending=1
    )
    assert summary.failed == [
        TaskLine(task_id="c", tool="http_get", state=S.FAILED, reason="HTTP 500"),
        TaskLine(task_id="d", tool="read_local_file", state=S.EXPIRED, reason="expired: waited 3600s"),
    ]
    assert [t.task_id for t in summary.skipped] == ["e"]
    assert (summary.schedule, summary.kind, summary.user) == ("nightly", SummaryKind.DEADLINE, "demo")


def test_waiting_work_is_grouped_by_the_client_and_user_it_waits_for() -> None:
    tree, tasks = run(
        [
            ("notes", "read_local_file", S.PENDING_CLIENT, {}),
            ("ls", "list_directory", S.PENDING_CLIENT, {}),
            ("git", "git_status", S.BLOCKED, {"client_id": "laptop"}),  # taken back from laptop
            ("again", "read_local_file", S.BLOCKED, {}),
        ]
    )
    assert summarise(tree, tasks, SummaryKind.FINAL, at=1.0).waiting_for == [
        WaitingFor(
            user="demo",
            client_id=None,
            tasks=["notes", "ls", "again"],
            tools=["read_local_file", "list_directory"],
        ),
        WaitingFor(user="demo", client_id="laptop", tasks=["git"], tools=["git_status"]),
    ]


def test_an_interactive_runs_waiting_work_waits_for_its_sessions_client() -> None:
    tree, tasks = run(
        [("notes", "read_local_file", S.BLOCKED, {})], session=SessionKind.INTERACTIVE, client_id="desk"
    )
    (waiting,) = summarise(tree, tasks, SummaryKind.FINAL, at=1.0).waiting_for
    assert (waiting.user, waiting.client_id) == ("demo", "desk")


def test_markdown_names_the_counts_whom_to_bring_online_and_what_failed() -> None:
    tree, tasks = run(
        [
            ("a", "echo", S.DONE, {}),
            ("c", "http_get", S.FAILED, {"reason": "HTTP 500"}),
            ("notes", "read_local_file", S.PENDING_CLIENT, {}),
            ("git", "git_status", S.BLOCKED, {"client_id": "laptop"}),
        ],
        status=TreeStatus.FAILED,
    )
    text = render_markdown(summarise(tree, tasks, SummaryKind.FINAL, at=0.0))
    assert text.startswith("# nightly: failed\n")
    assert "| 1 | 1 | 0 | 0 | 0 | 2 | 0 | 0 | 0 | 4 |" in text
    assert "- any client of user `demo` offering `read_local_file`: 1 task(s) (notes)" in text
    assert "- client `laptop` of user `demo`: 1 task(s) (git)" in text
    assert "- `c` (http_get, failed): HTTP 500" in text


def test_a_deadline_summary_says_the_run_is_still_going() -> None:
    tree, tasks = run([("g", "sleep", S.RUNNING, {})])
    text = render_markdown(summarise(tree, tasks, SummaryKind.DEADLINE, at=0.0))
    assert text.startswith("# nightly: deadline reached, still running\n")


def test_status_shows_the_stored_final_summary_else_the_latest_else_one_made_for_an_ended_tree() -> None:
    from brain.core.summary import shown_summary

    tree, tasks = run([("a", "echo", S.DONE, {})])
    deadline = summarise(tree, tasks, SummaryKind.DEADLINE, at=5.0)
    final = summarise(tree, tasks, SummaryKind.FINAL, at=9.0)
    assert shown_summary(tree, tasks, [], now=1.0) is None  # running, nothing stored
    assert shown_summary(tree, tasks, [deadline], now=1.0) == deadline
    assert shown_summary(tree, tasks, [deadline, final], now=1.0) == final
    ended = tree.model_copy(update={"status": TreeStatus.DONE, "finished_at": 7.0})
    made = shown_summary(ended, tasks, [], now=99.0)
    assert made is not None and (made.kind, made.at, made.counts.done) == (SummaryKind.FINAL, 7.0, 1)


def test_a_summarys_parts_add_up_to_its_tasks_whatever_their_states() -> None:
    # Issue 21: a task awaiting its user's approval was neither waiting nor in flight, so the
    # parts of a summary added up to 10 of 11 tasks.
    tree, tasks = run([(f"t{i}", "echo", state, {}) for i, state in enumerate(TaskState)])
    counts = summarise(tree, tasks, SummaryKind.DEADLINE, at=200.0).counts
    parts = counts.model_dump()
    total = parts.pop("total")
    assert total == len(TaskState) and sum(parts.values()) == total, parts
    # queued on a server or a client, running, awaiting approval, a for_each task's items
    assert counts.in_flight == 5


def test_the_morning_summary_lists_retried_tasks_and_fan_outs() -> None:
    """Issue 23, item 4: which tasks needed more than one attempt and what the last failed one
    said; each fan-out with how many of its items were done and failed."""
    from brain.core.retry import Attempt
    from workers.contracts import ErrorInfo

    timeout = ErrorInfo(type="ToolTimeout", message="no answer in 30s")
    tree, tasks = run(
        [
            ("fetch", "http_get", S.DONE, {"attempts": [Attempt(number=1, error=timeout)]}),
            ("each", "echo", S.FAILED, {"fan_out": 3}),
        ]
    )
    tasks += [
        TaskRecord(tree_id="night-1", task_id=f"each[{i}]", tool="echo", state=state, parent="each")
        for i, state in enumerate((S.DONE, S.DONE, S.FAILED))
    ]
    summary = summarise(tree, tasks, SummaryKind.FINAL, at=200.0)
    text = render_markdown(summary)
    assert (
        "- `fetch` (http_get, done): 2 attempts; the last failed one: ToolTimeout: no answer in 30s" in text
    )
    assert "- `each` (echo, failed): 3 items, 2 done, 1 failed" in text
