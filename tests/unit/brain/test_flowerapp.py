"""Vancetope's change to Flower stays in place on the Flower release we install."""

from __future__ import annotations

from types import SimpleNamespace

from flower import app as flower_app
from flower.api import workers as flower_workers

from brain import flowerapp


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
