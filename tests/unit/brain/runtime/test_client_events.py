"""The brain's events for client agents go out from a thread of their own: in order, all of
them by ``close``, a client's task events gathered into one message, and a slow or failing
Flower channel never holds the call or the result that caused them (they were three round
trips of a client call's)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery

from brain.runtime import events as events_module
from brain.runtime.events import GATHER_S, ClientEvents
from workers.contracts import ToolCall, ToolResult, ToolType


class Channel:
    """Stands in for Celery's EventDispatcher: records what it is asked to send; ``gate``
    holds every send until it is set."""

    def __init__(self, fail_first: bool = False) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.flushes: list[int] = []  # how many events each flush sent
        self.gate = threading.Event()
        self.gate.set()
        self.sending = threading.Event()  # set once a send has begun (and waits at the gate)
        self.fail_first = fail_first
        self.closed = False

    def send(self, event: str, **fields: Any) -> None:
        self.sending.set()
        self.gate.wait()
        if self.fail_first:
            self.fail_first = False
            raise ConnectionError("Redis went away")
        self.sent.append((event, fields))

    def flush(self) -> None:
        self.flushes.append(len(self.sent) - sum(self.flushes))

    def close(self) -> None:
        self.closed = True


class Link:
    """Stands in for the kombu connection a sender opens."""

    def __init__(self) -> None:
        self.released = False

    def release(self) -> None:
        self.released = True


class App:
    """Stands in for the Celery app: the connections it opened; every dispatcher is ``channel``."""

    def __init__(self, channel: Channel) -> None:
        self.opened: list[Link] = []
        self.events = SimpleNamespace(Dispatcher=lambda conn, **options: channel)

    def connection_for_write(self) -> Link:
        self.opened.append(Link())
        return self.opened[-1]


class Events(ClientEvents):
    def __init__(self, channel: Channel) -> None:
        super().__init__(Celery("test"))
        self.channel = channel
        self.channels: dict[str, Channel] = {}

    def _dispatcher(self, client_id: str) -> Any:
        return self.channel if not self.channels else self.channels.setdefault(client_id, Channel())


def ids(i: int) -> dict[str, str]:
    """The ids a call and its result share."""
    return {"run_id": f"r{i}", "tree_id": "t", "task_id": f"k{i}", "tool": "read_local_file"}


def call(client_id: str, i: int) -> ToolCall:
    limits = {"timeout_s": 5, "max_result_bytes": 1000, "max_deliveries": 3}
    return ToolCall(**ids(i), tool_type=ToolType.BUILT_IN, args={"path": "a"}, **limits, client_id=client_id)


def result(client_id: str, i: int) -> ToolResult:
    times = {"started_at": 1.0, "finished_at": 2.0}
    return ToolResult(**ids(i), ok=True, value="x", worker="w", **times, client_id=client_id)


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


def test_a_burst_of_task_events_goes_out_as_one_flush_per_client() -> None:
    events = Events(Channel())
    events.channels = {"laptop": Channel(), "desk": Channel()}
    for channel in events.channels.values():
        channel.gate.clear()  # the sender holds its first batch until the whole burst is queued
    for i in range(20):
        client = "laptop" if i % 2 else "desk"
        events.task_sent(call(client, i))
        events.task_done(result(client, i))
    for channel in events.channels.values():
        channel.gate.set()
    events.close()
    for client, channel in events.channels.items():
        assert len(channel.sent) == 30, client  # received, started, succeeded for 10 calls each
        assert sum(channel.flushes) == 30
        assert len(channel.flushes) <= 2, channel.flushes  # not one per event
    assert [f["uuid"] for e, f in events.channels["desk"].sent if e == "task-received"] == [
        f"r{i}" for i in range(0, 20, 2)
    ]


def test_events_go_out_after_the_gathering_window_without_close() -> None:
    channel = Channel()
    events = Events(channel)
    events.online("laptop")
    waited = threading.Event()
    for _ in range(300):  # up to 30 s on a busy machine; passes after about GATHER_S
        if channel.sent:
            break
        waited.wait(GATHER_S)
    assert [e for e, _ in channel.sent] == ["worker-online"]
    events.close()


def test_a_sender_still_sending_when_close_stops_waiting_releases_its_connection_when_done(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # close() used to release the connection itself once its wait was over; the sender, still
    # busy, then opened another for the events it had left, and nobody released that one.
    monkeypatch.setattr(events_module, "DRAIN_S", 0.01)
    channel = Channel()
    channel.gate.clear()  # the first send blocks until the test lets it go
    app = App(channel)
    events = ClientEvents(app)  # type: ignore[arg-type]  # the stand-in has what it uses
    events.online("laptop")
    assert channel.sending.wait(60)
    sender = events._sender
    assert sender is not None
    events.heartbeat("laptop")  # left to send after close() stopped waiting
    closing = threading.Thread(target=events.close, daemon=True)
    closing.start()
    closing.join(30)  # close() waits DRAIN_S for the stuck sender, then returns
    assert not closing.is_alive(), "close() waited for a stuck sender"
    channel.gate.set()
    sender.join(30)
    assert not sender.is_alive()
    assert [e for e, _ in channel.sent] == ["worker-online", "worker-heartbeat"]
    assert len(app.opened) == 1 and app.opened[0].released
    assert channel.closed


def test_a_calls_start_or_progress_handled_after_its_end_is_not_sent() -> None:
    """Seen in CI: a client call that failed at once had its "retried" sent (by the relay) before
    its "received" (by the thread that published it), which turned Flower's RETRY back to
    RECEIVED for good (Celery lets any event replace RETRY). Once a run's end was sent, its late
    received, start, progress and approval events are not."""
    from workers.contracts import ErrorInfo, ToolProgress, ToolStarted

    channel = Channel()
    events = Events(channel)
    failed = result("laptop", 1).model_copy(
        update={"ok": False, "value": None, "error": ErrorInfo(type="ToolError", message="no")}
    )
    events.task_retried(failed, next_at=100.0)
    events.task_sent(call("laptop", 1))
    events.task_started(
        ToolStarted(run_id="r1", tree_id="t", task_id="k1", started_at=1.0, client_id="laptop")
    )
    events.task_progress(
        ToolProgress(run_id="r1", tree_id="t", task_id="k1", progress=1, total=2, at=1.5, client_id="laptop")
    )
    events.task_started(
        ToolStarted(run_id="r2", tree_id="t", task_id="k2", started_at=1.0, client_id="laptop")
    )
    events.close()
    assert [(e, f["uuid"]) for e, f in channel.sent] == [
        ("task-started", "r1"),
        ("task-retried", "r1"),
        ("task-started", "r2"),
    ]


def until(condition: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_retry_is_said_again_so_a_received_from_another_process_does_not_show_for_good(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The "received" of a client call is sent by the process that published it (the CLI, a
    schedule), the "retried" by the brain that recorded the failure: on a loaded box the first
    reached Flower last (CI), and Celery's state lets it replace RETRY. The brain says RETRY
    again a moment later."""
    from workers.contracts import ErrorInfo

    monkeypatch.setattr(events_module, "RESTATE_RETRY_S", 5 * events_module.GATHER_S)  # after the "received"
    channel = Channel()
    brain, submitter = Events(channel), Events(channel)
    failed = result("laptop", 1).model_copy(
        update={"ok": False, "value": None, "error": ErrorInfo(type="ToolError", message="no")}
    )
    brain.task_retried(failed, next_at=100.0)
    until(lambda: len(channel.sent) == 2)
    submitter.task_sent(call("laptop", 1))  # late, from another process
    submitter.close()
    until(lambda: [e for e, _ in channel.sent].count("task-retried") == 2)
    brain.close()
    assert [e for e, _ in channel.sent] == ["task-started", "task-retried", "task-received", "task-retried"]
    first, again = (f for e, f in channel.sent if e == "task-retried")
    assert again == first  # the same failure at the same time, said again


def test_close_cancels_a_retry_not_yet_said_again() -> None:
    from workers.contracts import ErrorInfo

    channel = Channel()
    events = Events(channel)
    failed = result("laptop", 1).model_copy(
        update={"ok": False, "value": None, "error": ErrorInfo(type="ToolError", message="no")}
    )
    events.task_retried(failed, next_at=100.0)
    events.close()
    assert not any(t.is_alive() for t in events._restates) and not events._restates


@pytest.mark.parametrize(
    ("error", "task_ended", "end"),
    [
        (None, False, "task-succeeded"),
        (None, True, "task-succeeded"),  # the tool ran, though its task had ended
        # The agent gave the call up as the brain had ended its task (cancelled, expired) while
        # it ran or waited for approval: REVOKED as Celery shows a task it terminated, as the
        # server pool shows one it stopped. Before, FAILURE: an alert on failures paged for a cancel.
        ("Cancelled", True, "task-revoked"),
        # A Cancelled the store recorded as the task's failure (nobody ended the task: an agent
        # that stopped, or one that says so of a failure): FAILURE, never hidden as a cancel.
        ("Cancelled", False, "task-failed"),
        ("ToolError", True, "task-failed"),
        ("ToolTimeout", False, "task-failed"),
    ],
)
def test_a_clients_call_ends_in_flower_as_its_agent_says_it_ended(
    error: str | None, task_ended: bool, end: str
) -> None:
    from workers.contracts import ErrorInfo

    channel = Channel()
    events = Events(channel)
    done = result("laptop", 1)
    if error is not None:
        failure = {"ok": False, "value": None, "error": ErrorInfo(type=error, message="it ended so")}
        done = done.model_copy(update=failure)
    events.task_done(done, task_ended=task_ended)
    events.close()
    assert [e for e, _ in channel.sent] == ["task-started", end]
    if end == "task-revoked":
        assert {k: channel.sent[1][1][k] for k in ("terminated", "signum", "expired")} == {
            "terminated": True,
            "signum": None,
            "expired": False,
        }
