"""The queue report: work waiting and who consumes it, and the alarm when nobody does (brain.hot.queues)."""

from __future__ import annotations

from brain.core.fairshare import AppliedLimit
from brain.hot.gate import KeyView, LaneView
from brain.hot.queues import (
    ClientQueue,
    PoolQueue,
    QueuesReport,
    UserQueue,
    limit_queues,
    pool_names,
    user_caps,
    user_queues,
)


def test_work_waiting_with_nobody_consuming_is_an_alarm_saying_what_to_start() -> None:
    report = QueuesReport(
        pools=[
            PoolQueue(pool="default", queue="server", waiting=4, workers=["server@h"]),
            PoolQueue(pool="gpu", queue="server.gpu", waiting=2, workers=[]),
            PoolQueue(pool="io", queue="server.io", waiting=0, workers=[]),
        ],
        clients=[
            ClientQueue(
                client_id="laptop",
                user="ada",
                connected=False,
                queue="client.laptop",
                waiting=1,
                taken=0,
                parked=2,
            ),
            ClientQueue(
                client_id="desk",
                user="ada",
                connected=True,
                queue="client.desk",
                waiting=5,
                taken=1,
                parked=0,
            ),
        ],
        users=[UserQueue(user="bob", parked=3, connected_clients=[])],
    )
    assert [p.nobody_consuming for p in report.pools] == [False, True, False]
    assert report.alarms() == [
        "pool 'gpu': 2 call(s) waiting on queue 'server.gpu', no live worker; start one: vancetope worker --pool gpu",
        (
            "client 'laptop' (user 'ada'): 1 call(s) queued, 2 parked, not connected; start its agent "
            "(vancetope-agent run)"
        ),
        (
            "user 'bob': 3 task(s) parked for any of the user's clients, none connected; start a client "
            "agent of this user"
        ),
    ]
    assert report.model_dump()["pools"][1]["nobody_consuming"] is True


def test_user_queues_list_who_of_the_user_is_connected() -> None:
    parked = {"user:ada": 2, "user:bob": 1, "client:laptop": 4, "user:eve": 0}
    assert user_queues(parked, {"desk": "ada", "phone": "eve"}) == [
        UserQueue(user="ada", parked=2, connected_clients=["desk"]),
        UserQueue(user="bob", parked=1, connected_clients=[]),
    ]


def test_pool_names_put_the_default_first_once() -> None:
    assert pool_names(["io", "gpu"], ["gpu", "default"]) == ["default", "gpu", "io"]


def test_limit_rows_say_what_waits_on_each_limit_for_whom_and_how_fast_calls_go() -> None:
    rate = AppliedLimit("tool", "sleep", "5/s", None)
    cap = AppliedLimit("server", "jira", None, 2)
    lanes = [
        LaneView("default", "ada", ("tool:sleep",), 3, "rate_limit 5/s of tool sleep", "tool:sleep"),
        LaneView(
            "default",
            "bob",
            ("tool:sleep", "server:jira"),
            2,
            "max_concurrency 2 of server jira",
            "server:jira",
        ),
        LaneView("gpu", "ada", ("server:jira",), 0, "", ""),  # empty: counted nowhere
    ]
    now = 1_000_000.5
    keys = {
        # admitted in each of the last 10 whole seconds (the current one, 1_000_000, not counted)
        "tool:sleep": KeyView(0, {999_990 + i: 5 for i in range(11)}, None, None),
        "server:jira": KeyView(2, {999_999: 3}, None, None),
        "server:busy": KeyView(0, {}, now + 1.5, "paused by HTTP 429 from server busy (Retry-After 2s)"),
        "server:idle": KeyView(0, {}, None, None),  # neither written nor paused: not listed
    }
    rows = {row.limit: row for row in limit_queues([rate, cap], lanes, keys, now)}
    assert list(rows) == ["tool:sleep", "server:jira", "server:busy"]
    sleep, jira, busy = rows["tool:sleep"], rows["server:jira"], rows["server:busy"]
    assert (sleep.waiting, sleep.throttled, sleep.waiting_by_user) == (5, 3, {"ada": 3, "bob": 2})
    assert (sleep.rate_limit, sleep.rate_per_s, sleep.running) == ("5/s", 5.0, 0)
    assert (jira.waiting, jira.throttled, jira.waiting_by_user) == (2, 2, {"bob": 2})
    assert (jira.max_concurrency, jira.running, jira.rate_per_s) == (2, 2, 0.3)
    assert (busy.rate_limit, busy.max_concurrency, busy.waiting) == (None, None, 0)
    assert busy.paused_until == now + 1.5 and busy.paused_why is not None


def test_max_in_flight_per_user_shows_as_a_cap_per_user_with_calls_at_the_gate() -> None:
    lanes = [
        LaneView(
            "default",
            "ada",
            ("user:ada@default",),
            3,
            "max_in_flight_per_user 2 of user ada on pool default",
            "user:ada@default",
        ),
        LaneView("default", "bob", (), 1, "queue_window 8 of pool default", ""),  # not under the cap
        LaneView("crawl", "", ("user:-@crawl",), 1, "", ""),
    ]
    caps = user_caps(lanes, 2)
    assert [(c.key, c.max_concurrency) for c in caps] == [("user:-@crawl", 2), ("user:ada@default", 2)]
    rows = {row.limit: row for row in limit_queues(caps, lanes, {}, 0.0)}
    assert (rows["user:ada@default"].waiting, rows["user:ada@default"].throttled) == (3, 3)
