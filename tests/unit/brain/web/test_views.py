"""What the web pages show, from records (pure): layout by dependency depth, what a tree waits for."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

from brain.core.models import TaskRecord, TaskState, TaskTree, TreeRecord
from brain.errors import BadQuery
from brain.web.views import (
    Seen,
    client_rows,
    clock,
    critical_path,
    first_failure,
    group_counts,
    group_label,
    group_state,
    layout,
    task_rows,
    time_window,
    timeline,
    waits_for,
)

S = TaskState


def tree_of(tasks: list[dict], client_id: str | None = None) -> TreeRecord:
    return TreeRecord(
        tree_id="t-1", tree=TaskTree.model_validate({"id": "t", "tasks": tasks}), user="ada",
        client_id=client_id, submitted_at=100.0,
    )  # fmt: skip


def rec(task_id: str, state: TaskState = S.PENDING, **fields: object) -> TaskRecord:
    return TaskRecord(tree_id="t-1", task_id=task_id, tool="echo", state=state, **fields)  # type: ignore[arg-type]


def test_columns_follow_the_longest_chain_of_dependencies() -> None:
    tree = tree_of(
        [
            {"id": "a", "tool": "echo"},
            {"id": "b", "tool": "echo", "depends_on": ["a"]},
            {"id": "c", "tool": "echo", "depends_on": ["a", "b"]},
            {"id": "d", "tool": "echo"},
        ]
    )
    graph = layout(tree, [rec(i) for i in "abcd"])
    assert {n.task.task_id: (n.col, n.row) for n in graph.nodes} == {
        "a": (0, 0), "b": (1, 0), "c": (2, 0), "d": (0, 1),
    }  # fmt: skip
    assert sorted(graph.edges) == [("a", "b"), ("a", "c"), ("b", "c")]


def test_a_fan_outs_items_are_one_node_after_it_with_their_count_by_state_and_dependents_drawn_from_it() -> (
    None
):
    tree = tree_of(
        [
            {"id": "list", "tool": "echo"},
            {"id": "each", "tool": "echo", "depends_on": ["list"], "for_each": "list"},
            {"id": "sum", "tool": "echo", "depends_on": ["each"]},
        ]
    )
    states = [S.DONE, S.RUNNING, S.DONE, S.FAILED]
    items = [rec(f"each[{i}]", state, parent="each") for i, state in enumerate(states)]
    graph = layout(tree, [rec("list", S.DONE), rec("each", S.FANNED_OUT, fan_out=4), rec("sum"), *items])
    cols = {n.node_id: n.col for n in graph.nodes}
    assert cols == {"list": 0, "each": 1, "each[*]": 2, "sum": 3}
    (group,) = [n for n in graph.nodes if n.group is not None]
    assert group.group == {"done": 2, "running": 1, "failed": 1}
    assert sorted(graph.edges) == [("each", "each[*]"), ("each", "sum"), ("list", "each")]
    assert group_state(group.group) == "running"
    assert group_label(group.group) == "×4 · 2 done · 1 failed · 1 running"
    assert group_state({"done": 3, "failed": 1}) == "failed" and group_state({"done": 3}) == "done"
    assert group_counts({"each[0]": "done", "each[1]": "done", "sum": "pending", "x[3]": "failed"}) == {
        "each[*]": {"done": 2},
        "x[*]": {"failed": 1},
    }


def test_a_deep_chain_lays_out_without_recursion() -> None:
    tasks = [{"id": "t0", "tool": "echo"}] + [
        {"id": f"t{i}", "tool": "echo", "depends_on": [f"t{i - 1}"]} for i in range(1, 3000)
    ]
    graph = layout(tree_of(tasks), [rec(f"t{i}") for i in range(3000)], max_nodes=3000)
    assert graph.by_id["t2999"].col == 2999


def test_a_graph_of_more_nodes_than_the_limit_groups_each_tools_tasks_by_depth() -> None:
    # Three columns: a and b (tools echo, read), then 40 echo tasks after a, then one after all.
    tasks = [{"id": "a", "tool": "echo"}, {"id": "b", "tool": "read"}]
    tasks += [{"id": f"m{i}", "tool": "echo", "depends_on": ["a"]} for i in range(40)]
    tasks += [{"id": "z", "tool": "echo", "depends_on": [f"m{i}" for i in range(40)] + ["b"]}]
    records = [rec("a", S.DONE), TaskRecord(tree_id="t-1", task_id="b", tool="read", state=S.DONE)]
    records += [rec(f"m{i}", S.DONE if i < 30 else S.RUNNING) for i in range(40)] + [rec("z")]
    tree = tree_of(tasks)
    assert len(layout(tree, records).nodes) == 43  # under the limit: every task its node
    graph = layout(tree, records, max_nodes=10)
    assert [(n.node_id, n.col, n.group) for n in graph.nodes] == [
        ("a", 0, None), ("b", 0, None), ("echo@1", 1, {"done": 30, "running": 10}), ("z", 2, None),
    ]  # fmt: skip
    assert sorted(graph.edges) == [("a", "echo@1"), ("b", "z"), ("echo@1", "z")]
    assert graph.node_of["m7"] == "echo@1" and graph.node_of["z"] == "z"
    # Still too many (a limit of 2): neighbouring depths go together too, two, then four...
    small = layout(tree, records, max_nodes=2)
    assert [(n.node_id, n.group) for n in small.nodes] == [
        ("echo@0-2", {"done": 31, "running": 10, "pending": 1}), ("b", None),
    ]  # fmt: skip
    assert small.edges == [("b", "echo@0-2")]


def test_what_a_running_tree_waits_for_one_line_per_cause() -> None:
    tree = tree_of([{"id": x, "tool": "echo"} for x in "abcde"])
    tasks = [
        rec("a", S.PENDING_CLIENT, client_id="laptop", queued_at=7200.0),
        rec("b", S.BLOCKED, client_id="laptop", queued_at=3600.0),
        rec("c", S.BLOCKED),
        rec("d", S.AWAITING_APPROVAL, client_id="desk"),
        rec("e", S.RETRYING, retry_at=9000.0),
    ]
    lines = waits_for(tree, tasks, now=10_000.0)
    assert lines[0] == "1 task waiting for a client of user ada"
    assert lines[1].startswith("2 tasks waiting for client laptop (parked since ")
    assert lines[2] == "1 task awaiting its user's approval on client desk"
    assert lines[3].startswith("1 task retrying (next at ")
    # A tree bound to a client: its parked work waits for that client.
    assert waits_for(tree_of([{"id": "c", "tool": "echo"}], "laptop"), [rec("c", S.BLOCKED)], 0.0) == [
        "1 task waiting for client laptop"
    ]


def test_parked_work_says_since_when_its_client_is_offline_when_the_brain_recorded_it() -> None:
    tree = tree_of([{"id": x, "tool": "echo"} for x in "abc"])
    tasks = [
        rec("a", S.PENDING_CLIENT, client_id="laptop", queued_at=3600.0),
        rec("b", S.BLOCKED, client_id="desk", queued_at=3600.0),
        rec("c", S.BLOCKED, client_id="box", queued_at=3600.0),
    ]
    # desk is connected (its work is on its way); box never went offline since recorded.
    seen = Seen(connected=frozenset({"desk"}), last_seen={"laptop": 7200.0, "desk": 60.0})
    assert waits_for(tree, tasks, 10_000.0, seen) == [
        f"1 task waiting for client box (parked since {clock(3600.0)})",
        f"1 task waiting for client desk (parked since {clock(3600.0)})",
        f"1 task waiting for client laptop (offline since {clock(7200.0)})",
    ]


def test_the_timeline_spans_the_first_queue_to_the_last_finish_and_skips_pending_tasks() -> None:
    tasks = [
        rec("a", S.DONE, first_queued_at=10.0, started_at=11.0, finished_at=15.0),
        rec("b", S.RUNNING, queued_at=12.0, started_at=13.0),
        rec("c"),
    ]
    start, end, bars = timeline(tasks, now=20.0)
    assert (start, end) == (10.0, 20.0)  # b still runs: up to now
    assert [(b.task_id, b.finished) for b in bars] == [("a", 15.0), ("b", None)]


def test_client_rows_put_each_users_connected_clients_first_then_the_recently_seen_then_the_rest() -> None:
    now = 1_700_000_000.0

    def client(
        cid: str, user: str, connected: bool = False, last_seen: float | None = None
    ) -> dict[str, Any]:
        return {
            "client_id": cid, "user": user, "connected": connected, "connected_at": now - 60 if connected else None,
            "client_type": "desktop" if connected else None, "round_trip_ms": 4.34 if connected else None,
            "last_seen": last_seen, "tools": ["lookup"] if connected else [], "held_tools": [], "clashes": [],
            "misbehaving": None, "waiting": {"client": 2, "user": 1},
        }  # fmt: skip

    report = {
        "clients": [
            client("old", "ada", last_seen=now - 3 * 86400),
            client("never", "ada"),
            client("gone-late", "ada", last_seen=now - 60),
            client("gone-early", "ada", last_seen=now - 3600),
            client("laptop", "ada", connected=True),
            client("box", "bob", last_seen=now - 10),
        ]
    }
    rows = client_rows(report, now)
    assert list(rows) == ["ada", "bob"]
    assert [(r.client_id, r.state) for r in rows["ada"]] == [
        ("laptop", "connected"),
        ("gone-late", "recently seen"),
        ("gone-early", "recently seen"),
        ("never", "offline"),
        ("old", "offline"),
    ]
    laptop, late = rows["ada"][0], rows["ada"][1]
    assert laptop.said.startswith("connected since ") and laptop.round_trip == "4.3 ms"
    assert late.said == f"offline since {clock(now - 60)}" and late.round_trip == ""
    assert laptop.waiting == "2 tasks for it; 1 task for any client of user ada"
    assert rows["ada"][3].said == "offline (not seen since recorded)"
    assert rows["ada"][4].said.startswith("offline since 2023-")


def test_the_trees_pages_time_window_from_since_until_or_a_span_back_from_now() -> None:
    now = 1_700_000_000.0
    local = datetime(2026, 12, 6, 2, 0).timestamp()  # no zone given: the web process's local time
    assert time_window(None, None, None, now) == (None, None)
    assert time_window("2026-12-06T02:00", None, None, now) == (local, None)
    assert time_window("2026-12-06", "2026-12-06T02:00", None, now) == (local - 7200, local)
    assert (
        time_window("2026-12-06T02:00+00:00", None, None, now)[0]
        == datetime.fromisoformat("2026-12-06T02:00+00:00").timestamp()
    )
    assert time_window("1700000000", "1700000100.5", None, now) == (now, now + 100.5)
    assert time_window(None, None, "12h", now) == (now - 12 * 3600, None)
    assert time_window(None, None, "90m", now) == (now - 5400, None)
    assert time_window(None, str(now), "1.5d", now) == (now - 1.5 * 86400, now)
    assert time_window(None, None, "2w", now)[0] == now - 14 * 86400


@pytest.mark.parametrize(
    ("since", "until", "last", "says"),
    [
        ("yesterday", None, None, "?since='yesterday' is no time"),
        (None, "02:00pm", None, "?until='02:00pm' is no time"),
        ("nan", None, None, "?since='nan' is no time"),
        (None, None, "12", "?last='12': give a number and a unit"),
        (None, None, "h", "?last='h'"),
        ("2026-12-06", None, "12h", "not both"),
        ("2026-12-06T03:00", "2026-12-06T02:00", None, "must be before ?until="),
    ],
)
def test_a_malformed_time_filter_says_which_parameter_and_what_to_give(
    since: str | None, until: str | None, last: str | None, says: str
) -> None:
    with pytest.raises(BadQuery) as caught:
        time_window(since, until, last, 1_700_000_000.0)
    assert says in str(caught.value)


def test_the_first_failure_is_the_earliest_finished_and_skipped_what_follows_it_through_skipped_tasks() -> (
    None
):
    tree = tree_of(
        [
            {"id": "a", "tool": "echo"},
            {"id": "b", "tool": "echo", "depends_on": ["a"]},
            {"id": "c", "tool": "echo", "depends_on": ["b"]},
            {"id": "d", "tool": "echo", "depends_on": ["c"]},
            {"id": "e", "tool": "echo", "depends_on": ["b"], "run_if": "all_done"},
            {"id": "g", "tool": "echo", "depends_on": ["e"]},
            {"id": "h", "tool": "echo", "depends_on": ["a"]},
            {"id": "i", "tool": "echo", "depends_on": ["h"]},
        ]
    )
    tasks = [
        rec("a", S.DONE, finished_at=5.0),
        rec("b", S.FAILED, finished_at=20.0),
        rec("c", S.SKIPPED, finished_at=20.0),
        rec("d", S.SKIPPED, finished_at=20.0),
        rec("e", S.DONE, finished_at=25.0),  # ran anyway: what follows it was not skipped by b
        rec("g", S.SKIPPED, finished_at=30.0),
        rec("h", S.EXPIRED, finished_at=10.0),
        rec("i", S.SKIPPED, finished_at=10.0),
    ]
    first = first_failure(tree, tasks)
    assert first is not None and first.task.task_id == "h" and first.skipped == ["i"]
    without_h = [t for t in tasks if t.task_id not in ("h", "i")]
    first = first_failure(tree, without_h)
    assert first is not None and first.task.task_id == "b" and first.skipped == ["c", "d"]
    assert first_failure(tree, [rec("a", S.DONE)]) is None


def test_the_critical_path_goes_back_from_the_task_that_ended_last_through_the_dependency_that_ended_last() -> (
    None
):
    tree = tree_of(
        [
            {"id": "a", "tool": "echo"},
            {"id": "b", "tool": "echo", "depends_on": ["a"]},
            {"id": "c", "tool": "echo", "depends_on": ["a"]},
            {"id": "d", "tool": "echo", "depends_on": ["b", "c"]},
            {"id": "e", "tool": "echo"},
            {"id": "f", "tool": "echo", "depends_on": ["d"]},
        ]
    )

    def ran(task_id: str, start: float, end: float | None, state: TaskState = S.DONE) -> TaskRecord:
        return rec(task_id, state, queued_at=start, started_at=start, finished_at=end)

    tasks = [ran("a", 0, 10), ran("b", 10, 30), ran("c", 10, 20), ran("d", 30, 40), ran("e", 0, 35), rec("f")]
    assert critical_path(tree, tasks, now=100.0) == ["a", "b", "d"]  # f never left pending
    # Still running: d ends now, so the path leads to it; e ended before.
    tasks[3] = ran("d", 30, None, S.RUNNING)
    assert critical_path(tree, tasks, now=100.0) == ["a", "b", "d"]
    # Equal ends: the dependency first in the tree's order.
    tasks[2] = ran("c", 10, 30)
    assert critical_path(tree, tasks, now=100.0) == ["a", "b", "d"]
    tasks[1] = ran("b", 10, 25)
    assert critical_path(tree, tasks, now=100.0) == ["a", "c", "d"]
    # Nothing left pending yet: no path. A failure ends a path like a success.
    assert critical_path(tree, [rec("a")], now=1.0) == []
    assert critical_path(tree, [ran("a", 0, 10), ran("b", 10, 50, S.FAILED)], now=99.0) == ["a", "b"]


def test_the_task_lists_rows_carry_times_from_the_start_its_node_and_the_critical_mark_never_values() -> None:
    tree = tree_of([{"id": "a", "tool": "echo", "args": {"value": "planted"}}, {"id": "b", "tool": "echo"}])
    tasks = [
        rec("a", S.DONE, first_queued_at=100.0, started_at=101.0, finished_at=103.5, route="server"),
        rec("b", S.BLOCKED, queued_at=104.0, client_id="laptop", reason="client laptop is offline"),
    ]
    graph = layout(tree, tasks)
    assert task_rows(tasks, graph, 100.0, ["a"]) == [
        ["a", "echo", "done", "server", "", 0.0, 1.0, 3.5, "a", 1],
        ["b", "echo", "blocked", "", "client laptop is offline", 4.0, None, None, "b", 0],
    ]
