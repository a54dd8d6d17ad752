"""The brain's events for client agents go out from a thread of their own: in order, all of
them by ``close``, and a slow or failing Flower channel never holds the call or the result
that caused them (they were three round trips of a client call's)."""

from __future__ import annotations

import threading
from typing import Any

from celery import Celery

from brain.events import ClientEvents


class Channel:
    """Stands in for Celery's EventDispatcher: records what it is asked to send; ``gate``
    holds every send until it is set."""

    def __init__(self, fail_first: bool = False) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.fail_first = fail_first

    def send(self, event: str, **fields: Any) -> None:
        self.gate.wait()
        if self.fail_first:
            self.fail_first = False
            raise ConnectionError("Redis went away")
        self.sent.append((event, fields))


class Events(ClientEvents):
    def __init__(self, channel: Channel) -> None:
        super().__init__(Celery("test"))
        self.channel = channel

    def _dispatcher(self, client_id: str) -> Any:
        return self.channel


def test_events_are_sent_in_order_with_the_time_they_happened_and_all_of_them_by_close() -> None:
    channel = Channel()
    events = Events(channel)
    for i in range(200):
        events.heartbeat("laptop", active=i)
    events.close()
    assert [f["active"] for _, f in channel.sent] == list(range(200))
    stamps = [f["timestamp"] for _, f in channel.sent]
    assert stamps == sorted(stamps)


def test_a_stuck_flower_channel_does_not_hold_the_caller() -> None:
    channel = Channel()
    channel.gate.clear()  # every send blocks until released
    events = Events(channel)
    caller = threading.Thread(target=lambda: [events.online(f"c{i}") for i in range(50)], daemon=True)
    caller.start()
    caller.join(30)  # only reached on failure: a caller sending in its own thread never returns
    assert not caller.is_alive(), "sending an event waited for the channel"
    channel.gate.set()
    events.close()
    assert len(channel.sent) == 50


def test_a_failed_send_is_logged_and_the_next_ones_still_go(caplog: Any) -> None:
    channel = Channel(fail_first=True)
    events = Events(channel)
    events.online("laptop")
    events.offline("laptop")
    events.close()
    assert [e for e, _ in channel.sent] == ["worker-offline"]
    assert "could not send worker-online for client laptop to Flower" in caplog.text
