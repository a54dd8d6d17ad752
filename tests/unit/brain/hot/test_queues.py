"""The queue report: work waiting and who consumes it, and the alarm when nobody does (brain.hot.queues)."""

from __future__ import annotations

from brain.hot.queues import ClientQueue, PoolQueue, QueuesReport, UserQueue, pool_names, user_queues


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
