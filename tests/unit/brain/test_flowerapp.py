"""Vancetope's change to Flower stays in place on the Flower release we install."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest
from celery.events import Event
from celery.events.state import State
from flower import app as flower_app
from flower import urls as flower_urls
from flower.api import workers as flower_workers
from flower.app import Flower
from flower.events import EventsState
from flower.options import default_options
from tornado.httpclient import AsyncHTTPClient
from tornado.httpserver import HTTPServer
from tornado.testing import bind_unused_port

from brain import flowerapp
from brain.core.revoked import LOST_MARK
from brain.stack.flowerauth import (
    FLOWER_SECRET_FILE,
    UNAUTHORIZED_DEFAULT,
    UNAUTHORIZED_VARIABLE,
    UNPROTECTED_BODY,
    WEB_URL_VARIABLE,
    decide_access,
)


def test_flower_serves_api_workers_with_vancetopes_handler() -> None:
    # Importing brain.flowerapp (what `celery -A` does) installed it into the very table
    # Flower builds its application from.
    assert (flowerapp.WORKERS_API, flowerapp.ListWorkers) in flower_app.default_handlers
    assert flowerapp.install() is True  # idempotent
    assert issubclass(flowerapp.ListWorkers, flower_workers.ListWorkers)


def test_flowers_workers_api_still_reads_what_the_change_relies_on() -> None:
    # ListWorkers.get answers from application.workers (inspect) and writes one dict; the
    # dashboard lists events.state.counter x events.state.workers. A release that changes
    # either needs brain/flowerapp.py reviewed.
    source = flower_workers.ListWorkers.get.__wrapped__.__code__.co_names  # under @web.authenticated
    assert {"workers", "write", "is_worker"} <= set(source)


def test_event_workers_lists_what_the_dashboard_shows() -> None:
    worker = SimpleNamespace(
        _fields=("hostname", "active", "sw_ident"),
        hostname="client-agent@laptop",
        active=1,
        sw_ident="vancetope-agent",
        alive=True,
    )
    state = SimpleNamespace(
        counter={"client-agent@laptop": {"task-received": 2}, "gone@host": {"task-received": 1}},
        workers={"client-agent@laptop": worker},
    )
    assert flowerapp.event_workers(state) == {
        "client-agent@laptop": {
            "task-received": 2,
            "hostname": "client-agent@laptop",
            "active": 1,
            "sw_ident": "vancetope-agent",
            "status": True,
            "source": "events",
        }
    }


# --- a 401 says how to log in, never "turn the password off" -------------------------------------


async def _fetch(
    basic_auth: list[str], paths: tuple[str, ...], auth: tuple[str, str] | None = None
) -> dict[str, tuple[int, str, str]]:
    """Each of ``paths`` from a real Flower app on our Celery app: (status, its challenge, body)."""
    options = SimpleNamespace(**default_options.as_dict())
    options.basic_auth, options.address = basic_auth, "127.0.0.1"
    # Flower's own settings (its templates), as its command builds it.
    flower = Flower(options=options, capp=flowerapp.app, events=mock.MagicMock(), **flower_urls.settings)
    sock, port = bind_unused_port()
    server = HTTPServer(flower)
    server.add_sockets([sock])
    client = AsyncHTTPClient(force_instance=True)
    try:
        answers = {}
        for path in paths:
            r = await client.fetch(
                f"http://127.0.0.1:{port}{path}",
                raise_error=False,
                auth_username=auth[0] if auth else None,
                auth_password=auth[1] if auth else None,
            )
            answers[path] = (r.code, r.headers.get("WWW-Authenticate", ""), r.body.decode())
        return answers
    finally:
        client.close()
        server.stop()
        await server.close_all_connections()


PROTECTED = ("/api/workers", "/api/tasks", "/", "/tasks/datatable", "/metrics")


def test_a_401_says_who_to_log_in_as_and_where_the_password_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    access = decide_access("127.0.0.1", {}, tmp_path / FLOWER_SECRET_FILE)
    monkeypatch.setenv(UNAUTHORIZED_VARIABLE, access.env()[UNAUTHORIZED_VARIABLE])
    answers = asyncio.run(_fetch(["vancetope:right"], PROTECTED))
    for path, (code, challenge, body) in answers.items():
        assert code == 401 and challenge == 'Basic realm="flower"', path
        assert f'curl -u "vancetope:$(cat {tmp_path / FLOWER_SECRET_FILE})"' in body, path
        assert "UNAUTHENTICATED" not in body, path


def test_a_401_never_recommends_turning_the_password_off(monkeypatch: pytest.MonkeyPatch) -> None:
    # Flower's own API answer was "FLOWER_UNAUTHENTICATED_API environment variable is required".
    monkeypatch.delenv(UNAUTHORIZED_VARIABLE, raising=False)
    with_password = asyncio.run(_fetch(["vancetope:right"], ("/api/workers",)))["/api/workers"]
    assert with_password[0] == 401 and with_password[2] == UNAUTHORIZED_DEFAULT
    assert "FLOWER_BASIC_AUTH" in with_password[2] and "flower.secret" in with_password[2]
    without = asyncio.run(_fetch([], ("/api/workers", "/api/tasks")))
    for code, _, body in without.values():
        assert code == 401 and body == UNPROTECTED_BODY and "UNAUTHENTICATED" not in body


def test_flowers_navigation_bar_links_the_web_views_trees_when_it_is_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(WEB_URL_VARIABLE, "http://127.0.0.1:8766/")
    code, _, body = asyncio.run(_fetch(["vancetope:right"], ("/tasks",), auth=("vancetope", "right")))[
        "/tasks"
    ]
    assert code == 200
    nav = body[body.index('<ul class="app-nav navbar-nav">') :]
    nav = nav[: nav.index("</ul>")]
    assert (
        '<a class="nav-link" id="vancetope-web" href="http://127.0.0.1:8766/trees"' in nav
    )  # last in the list
    assert nav.index(">Broker</a>") < nav.index(">Trees</a>")
    monkeypatch.delenv(WEB_URL_VARIABLE)
    code, _, body = asyncio.run(_fetch(["vancetope:right"], ("/tasks",), auth=("vancetope", "right")))[
        "/tasks"
    ]
    assert code == 200 and "vancetope-web" not in body and ">Broker</a>" in body


def test_a_navigation_bar_without_its_list_is_left_as_it_is() -> None:
    bar = b'<nav><ul class="other">x</ul></nav>'
    assert flowerapp.with_web_link(bar, "http://h:1/") == bar
    escaped = flowerapp.with_web_link(b'<ul class="app-nav navbar-nav"><li>a</li></ul>', 'http://h:1/"x')
    assert b'href="http://h:1/&quot;x/trees"' in escaped


def _task_event(kind: str, hostname: str, clock: int, **fields: object) -> dict[str, object]:
    return Event(
        f"task-{kind}", uuid="run-1", hostname=hostname, clock=clock, local_received=time.time(), **fields
    )


def test_a_call_at_the_gate_shows_throttled_until_a_worker_takes_it() -> None:
    # The events of a call that waited at the gate, in the order Flower gets them.
    state = State()
    brain, pool = "gen1@brain", "default@pool"
    state.event(_task_event("sent", brain, 1, name="vancetope.run_tool", args="sleep(seconds)"))
    assert state.tasks["run-1"].state == "PENDING"
    state.event(_task_event("throttled", brain, 2, throttled_by="rate_limit 1/s of tool sleep"))
    assert state.tasks["run-1"].state == "THROTTLED"
    assert state.tasks["run-1"].as_dict()["throttled_by"] == "rate_limit 1/s of tool sleep"
    state.event(_task_event("received", pool, 3, name="vancetope.run_tool"))
    assert state.tasks["run-1"].state == "RECEIVED"
    state.event(_task_event("started", pool, 4))
    assert state.tasks["run-1"].state == "STARTED"
    state.event(_task_event("succeeded", pool, 5, result="{}", runtime=0.1))
    assert state.tasks["run-1"].state == "SUCCESS"
    # What it waited on stays among its fields.
    assert state.tasks["run-1"].as_dict()["throttled_by"] == "rate_limit 1/s of tool sleep"


@pytest.mark.parametrize(
    ("running", "then", "shown"),
    [
        # A call stopped after it reported progress or was approved (its task cancelled): REVOKED.
        # Celery ranks a state it does not know above REVOKED: it showed PROGRESS for ever.
        ("progress", "revoked", "REVOKED"),
        ("awaiting_approval", "revoked", "REVOKED"),
        ("approved", "revoked", "REVOKED"),
        ("progress", "succeeded", "SUCCESS"),
        ("approved", "failed", "FAILURE"),
        # A late started does not take a running call's state back; another one replaces it.
        ("progress", "started", "PROGRESS"),
        ("approved", "started", "APPROVED"),
        ("awaiting_approval", "approved", "APPROVED"),
        ("approved", "progress", "PROGRESS"),
    ],
)
def test_a_running_calls_own_state_gives_way_to_how_it_ended(running: str, then: str, shown: str) -> None:
    state = State()
    state.event(_task_event("received", "default@pool", 1))
    state.event(_task_event("started", "default@pool", 2))
    state.event(_task_event(running, "default@pool", 3))
    state.event(_task_event(then, "default@pool", 4, terminated=True))
    assert state.tasks["run-1"].state == shown


@pytest.mark.parametrize(("terminated", "expired"), [(True, False), (False, True), (False, False)])
def test_a_revoked_call_shows_whether_it_was_stopped_while_it_ran_and_whether_it_expired(
    terminated: bool, expired: bool
) -> None:
    state = State()
    state.event(_task_event("sent", "gen1@brain", 1))
    state.event(
        _task_event("revoked", "default@pool", 2, terminated=terminated, signum=None, expired=expired)
    )
    shown = state.tasks["run-1"].as_dict()
    assert (shown["state"], shown["terminated"], shown["expired"]) == ("REVOKED", terminated, expired)


def test_a_late_throttled_event_does_not_take_a_running_call_back() -> None:
    state = State()
    state.event(_task_event("sent", "gen1@brain", 1))
    state.event(_task_event("received", "default@pool", 2))
    state.event(_task_event("started", "default@pool", 3))
    state.event(_task_event("throttled", "gen1@brain", 4, throttled_by="queue_window 4 of pool default"))
    assert state.tasks["run-1"].state == "STARTED"


def test_flower_counts_a_throttled_event_for_no_worker() -> None:
    state = EventsState()
    state.event(_task_event("sent", "gen1@brain", 1))
    state.event(_task_event("throttled", "gen1@brain", 2, throttled_by="rate_limit 1/s of tool sleep"))
    assert state.tasks["run-1"].state == "THROTTLED"
    assert state.tasks["run-1"].worker is None
    assert "gen1@brain" not in state.workers
    assert dict(state.counter["gen1@brain"]) == {"task-sent": 1}
    state.event(_task_event("received", "default@pool", 3))
    state.event(_task_event("throttled", "gen2@brain", 4, throttled_by="rate_limit 1/s of tool sleep"))
    assert state.tasks["run-1"].worker.hostname == "default@pool"
    assert set(state.workers) == {"default@pool"}
    assert "gen2@brain" not in state.counter


REVOKED = {"terminated": False, "signum": None}


def test_a_call_the_brain_ended_at_the_gate_shows_revoked_and_stays_so() -> None:
    state = EventsState()
    state.event(_task_event("sent", "gen1@brain", 1, name="vancetope.run_tool"))
    state.event(_task_event("throttled", "gen1@brain", 2, throttled_by="rate_limit 1/s of tool sleep"))
    state.event(_task_event("revoked", "gen2@brain", 3, expired=False, **REVOKED))
    assert state.tasks["run-1"].state == "REVOKED"
    # A throttled event from a pass that read the gate before the cancel does not bring it back.
    state.event(_task_event("throttled", "gen1@brain", 4, throttled_by="rate_limit 1/s of tool sleep"))
    assert state.tasks["run-1"].state == "REVOKED"
    # Sent by the brain: no worker for the task, none listed, nothing counted.
    assert state.tasks["run-1"].worker is None
    assert "gen2@brain" not in state.workers and "gen2@brain" not in state.counter


def test_a_revoked_call_a_worker_popped_anyway_shows_how_that_ended() -> None:
    # Popped before its cancel was written: the worker refuses it at begin and succeeds.
    state = EventsState()
    state.event(_task_event("sent", "gen1@brain", 1))
    state.event(_task_event("revoked", "gen1@brain", 2, expired=True, **REVOKED))
    state.event(_task_event("received", "default@pool", 3))
    state.event(_task_event("started", "default@pool", 4))
    assert state.tasks["run-1"].state == "REVOKED"
    state.event(_task_event("succeeded", "default@pool", 5, result="{}", runtime=0.0))
    assert state.tasks["run-1"].state == "SUCCESS"
    assert state.tasks["run-1"].worker.hostname == "default@pool"


def test_a_workers_own_revoked_event_is_celerys() -> None:
    state = EventsState()
    state.event(_task_event("received", "default@pool", 1))
    state.event(_task_event("revoked", "default@pool", 2, expired=False, **REVOKED))
    assert state.tasks["run-1"].state == "REVOKED"
    assert dict(state.counter["default@pool"]) == {"task-received": 1, "task-revoked": 1}


def test_a_run_whose_worker_was_lost_shows_failure_and_keeps_the_worker_that_began_it() -> None:
    """Issue 26: the brain's ``task-failed`` (WorkerLostError) for a run it sent again as a new
    run: FAILURE, under the pool worker that began it, and the brain listed as no worker."""
    state = EventsState()
    state.event(_task_event("received", "default@pool", 1))
    state.event(_task_event("started", "default@pool", 2))
    state.event(_task_event("failed", "gen1@brain", 3, exception="WorkerLostError('gone')", traceback="",
                            **{LOST_MARK: True}))  # fmt: skip
    assert state.tasks["run-1"].state == "FAILURE"
    assert state.tasks["run-1"].exception == "WorkerLostError('gone')"
    assert state.tasks["run-1"].worker.hostname == "default@pool"
    assert set(state.workers) == {"default@pool"} and "gen1@brain" not in state.counter


def test_a_late_retry_does_not_undo_the_brains_revoke() -> None:
    """Issue 26: a failed attempt (RETRY) whose task was cancelled shows REVOKED; Celery's state
    lets a RETRY replace any state, and a client's RETRY is said again seconds later."""
    state = EventsState()
    state.event(_task_event("received", "client-agent@laptop", 1))
    state.event(_task_event("retried", "client-agent@laptop", 2, exception="ToolError", traceback=""))
    state.event(_task_event("revoked", "gen1@brain", 3, expired=False, **REVOKED))
    state.event(_task_event("retried", "client-agent@laptop", 4, exception="ToolError", traceback=""))
    assert state.tasks["run-1"].state == "REVOKED"
    # Any other task's RETRY is Celery's as ever.
    state.event({**_task_event("retried", "default@pool", 5, exception="X", traceback=""), "uuid": "run-2"})
    assert state.tasks["run-2"].state == "RETRY"
