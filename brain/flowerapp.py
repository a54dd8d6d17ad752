"""The Celery app module Flower is started with (layer: brain, Flower glue):
``celery -A brain.flowerapp flower``. It is the server pool's app, plus two changes to Flower.

Flower's ``/api/workers`` answers from ``inspect`` broadcasts only, and client agents run
with remote control off (docs/security.md, "A workstation"), so it omitted them while the dashboard,
built from events, listed them (the brain sends their worker events, ``brain.runtime.events``).
Here ``/api/workers`` also lists each worker the dashboard shows that did not answer
``inspect``, with the fields the dashboard has for it and ``"source": "events"``. Workers
that answered ``inspect`` are listed exactly as Flower lists them.

Two more for who may read it (``brain.stack.flowerauth`` always gives Flower a password): Flower
serves ``/metrics`` to anyone, password or not, so here it asks for the password like every
page; and a Flower on loopback answers only requests whose Host header names loopback, so a
web page that rebinds its own DNS name to 127.0.0.1 gets 421, not the dashboard. And a request
without the right password gets a 401 that says how to log in (the user, where the password
is: ``brain.stack.flowerauth``), never Flower's own advice to set FLOWER_UNAUTHENTICATED_API.

And one for finding trees: Flower's navigation bar gets a **Trees** link to the web view
(``VANCETOPE_FLOWER_WEB_URL``, which `vancetope up` and compose.yaml set), which shows the
trees Flower's task rows belong to. It is added to the navigation bar's HTML after Flower
renders it; a release whose bar no longer has the list it goes into keeps its bar as it is
(logged once).

And one for calls at the gate (docs/fair-share.md): the brain sends a ``task-throttled`` event
for a server call that waits there (``brain.runtime.throttle_events``). Celery's event state
ranks a state it does not know above STARTED, so the pool worker's later ``task-received``
and ``task-started`` would not have replaced THROTTLED; here THROTTLED ranks as PENDING does.
Its ``throttled_by`` (the limit that held it) is one of the task's fields, listed by
``/api/tasks`` and the task's page (kept once the call runs: what it waited on). The event
comes from the brain, not a worker: it is counted for no worker, nor makes the brain one.
So is the ``task-revoked`` the brain sends for a call it ended before a worker began it
(``brain.runtime.revoked``): Celery's own REVOKED, which a worker's later received and started
do not replace (its succeeded does), nor a late ``task-retried`` (``undoes_revoked``), and no
worker for it; and the ``task-failed``
(``WorkerLostError``) it sends for a run whose worker went away mid-call, which keeps the
worker that began it.

The change replaces one entry of Flower's URL table before Flower builds its application
(the ``celery -A`` module is imported first). If a Flower release moves that entry, the
change is skipped with an error in Flower's log and Flower runs as released;
``tests/unit/brain/test_flowerapp.py`` fails on such a release.

Flower stops on SIGTERM by raising SystemExit in its main thread and letting the interpreter
exit. With Redis gone (stopped first, or gone with a stack that was killed) it never did:
exiting joins Flower's executor threads, and one of them retries its ``enable_events``
broadcast for ever (seen every time: still running 30 s after SIGTERM). Nor did it when the
SystemExit landed in a weakref callback, which swallows it (seen in CI). So SIGTERM still
takes Flower's clean way out, and ``EXIT_GRACE_S`` later ends the process if that way hangs.
"""

from __future__ import annotations

import html
import logging
import os
import signal
import threading
from types import FrameType
from typing import Any

from celery import states as celery_states
from celery.events.state import Task as CeleryTask
from flower import command as flower_command
from flower import urls
from flower import views as flower_views
from flower.api import BaseApiHandler
from flower.api import workers as flower_workers
from flower.app import Flower
from flower.events import EventsState
from flower.views import monitor as flower_monitor
from tornado import httputil, web

from brain.core.revoked import LOST_MARK
from brain.stack.flowerauth import (
    UNAUTHORIZED_DEFAULT,
    UNAUTHORIZED_VARIABLE,
    UNPROTECTED_BODY,
    WEB_URL_VARIABLE,
    host_allowed,
)
from workers.contracts import TASK_FAILED_EVENT, TASK_REVOKED_EVENT, TASK_THROTTLED_EVENT
from workers.server_worker import app

log = logging.getLogger("vancetope.flower")

WORKERS_API = r"/api/workers"
METRICS = r"/metrics"
# Flower has no work to finish on its way out (it keeps no state on disk here).
EXIT_GRACE_S = 5.0
_flower_sigterm = flower_command.sigterm_handler


def event_workers(state: Any) -> dict[str, dict[str, Any]]:
    """The workers the dashboard lists, as it lists them: Flower's per-worker task counters,
    the event state's worker fields, ``status`` (alive)."""
    listed = {}
    for name, counts in state.counter.items():
        worker = state.workers.get(name)
        if worker is None:
            continue
        fields = {key: getattr(worker, key) for key in worker._fields}
        listed[name] = {**counts, **fields, "status": worker.alive, "source": "events"}
    return listed


class ListWorkers(flower_workers.ListWorkers):
    """Flower's ``/api/workers`` with the workers known from events only."""

    _from_events: dict[str, dict[str, Any]] | None = None  # set per request by get()

    @web.authenticated
    async def get(self) -> None:
        if self.get_argument("status", default=False, type=bool):
            await super().get()  # already built from events: every worker is there
            return
        name = self.get_argument("workername", default=None)
        known = event_workers(self.application.events.state)
        if name is not None:
            if name in known and name not in self.application.workers:
                self.write({name: known[name]})  # Flower itself would answer 404
                return
            known = {}
        self._from_events = known
        await super().get()

    def write(self, chunk: Any) -> None:
        # Flower's get() ends by writing its {name: info} dict: add the missing workers to it.
        if isinstance(chunk, dict) and self._from_events:
            chunk = {**{k: v for k, v in self._from_events.items() if k not in chunk}, **chunk}
            self._from_events = {}
        super().write(chunk)


class Metrics(flower_monitor.Metrics):
    """Flower's Prometheus page, behind the password like the rest of Flower (it names every
    worker and client agent, and counts their tasks)."""

    @web.authenticated
    async def get(self) -> None:
        await super().get()


class WrongHost(web.RequestHandler):
    """The answer to a request whose Host header is not Flower's own address."""

    def prepare(self) -> None:
        raise web.HTTPError(421, "this Flower answers only to its own address, not %s", self.request.host)


def _find_handler(self: Flower, request: httputil.HTTPServerRequest, **kwargs: Any) -> Any:
    if not host_allowed(request.host, self.options.address or "0.0.0.0"):
        return self.get_handler_delegate(request, WrongHost)
    return _flower_find_handler(self, request, **kwargs)


_flower_find_handler = Flower.find_handler


def unauthorized_body(has_password: bool, environ: Any = os.environ) -> str:
    """What a 401 says: who to log in as and where the password is (`vancetope up` passes its
    own words in ``VANCETOPE_FLOWER_UNAUTHORIZED``). Never Flower's own advice, which for the
    API is to set FLOWER_UNAUTHENTICATED_API, i.e. to turn the password off."""
    if not has_password:
        return UNPROTECTED_BODY
    return str(environ.get(UNAUTHORIZED_VARIABLE) or UNAUTHORIZED_DEFAULT)


def _answers_401(released: Any) -> Any:
    def write_error(self: web.RequestHandler, status_code: int, **kwargs: Any) -> None:
        if status_code != 401:
            released(self, status_code, **kwargs)
            return
        options = getattr(self.application, "options", None)
        has_password = bool(getattr(options, "basic_auth", None) or getattr(options, "auth", None))
        self.set_status(401)
        if has_password:
            self.set_header("WWW-Authenticate", 'Basic realm="flower"')
        self.set_header("Content-Type", "text/plain; charset=UTF-8")
        self.finish(unauthorized_body(has_password))

    write_error.__wrapped__ = released  # type: ignore[attr-defined]
    return write_error


# Flower's primary navigation list (templates/navbar.html): the web view's link ends it.
NAV_LIST = b'<ul class="app-nav navbar-nav">'
NAVBAR = "navbar.html"
_nav_missing_logged = False


def with_web_link(navbar: bytes, web_url: str) -> bytes:
    """Flower's rendered navigation bar with a last item **Trees** linking ``web_url``'s
    ``/trees`` (a new tab: the web view asks for its own password); unchanged, and logged
    once, if the bar has no primary list."""
    global _nav_missing_logged
    start = navbar.find(NAV_LIST)
    end = navbar.find(b"</ul>", start) if start >= 0 else -1
    if end < 0:
        if not _nav_missing_logged:
            _nav_missing_logged = True
            log.error("this Flower release's navigation bar changed: no link to the web view in it")
        return navbar
    href = html.escape(web_url.rstrip("/") + "/trees", quote=True)
    item = (
        f'<li class="nav-item"><a class="nav-link" id="vancetope-web" href="{href}" target="_blank" '
        'rel="noopener" title="Vancetope web view: task trees, their graph and timeline">Trees</a></li>'
    ).encode()
    return navbar[:end] + item + navbar[end:]


def _links_web_view(released: Any) -> Any:
    def render_string(self: web.RequestHandler, template_name: str, **kwargs: Any) -> bytes:
        rendered: bytes = released(self, template_name, **kwargs)
        web_url = os.environ.get(WEB_URL_VARIABLE)
        if template_name != NAVBAR or not web_url:
            return rendered
        return with_web_link(rendered, web_url)

    render_string.__wrapped__ = released  # type: ignore[attr-defined]
    return render_string


def _replace(path: str, released: type, ours: type) -> bool:
    for i, handler in enumerate(urls.handlers):
        if isinstance(handler, tuple) and handler[0] == path:
            if handler[1] not in (released, ours):
                break
            urls.handlers[i] = (path, ours)
            return True
    return False


THROTTLED = "THROTTLED"
# The states a running call shows from the custom events of its worker (``task-progress``) or
# of the brain for its agent (``task-awaiting_approval``, ``task-approved``).
RUNNING_STATES = ("PROGRESS", "AWAITING_APPROVAL", "APPROVED")
# Event fields Flower's task list and page show beside Celery's own: what a call waited on at
# the gate, and of a revoked call whether it was stopped while it ran (``terminated``) and
# whether its time limit ended it (``expired``). Celery's state keeps every field of an event
# but lists only those of ``Task._fields``.
SHOWN_FIELDS = ("throttled_by", "terminated", "expired")


def rank_states() -> None:
    """THROTTLED ranks as PENDING (a worker's received, started, succeeded replace it; it
    replaces sent), and a task's fields include ``SHOWN_FIELDS``. The running call's custom
    states rank between STARTED and REVOKED: Celery ranks any state it does not know above
    REVOKED, so a call stopped after it reported progress or was approved (its task cancelled,
    ``workers.call_stop``) showed PROGRESS or APPROVED for ever; a late ``task-started`` still
    does not take them back, and each replaces the other."""
    lookup = celery_states.PRECEDENCE_LOOKUP
    lookup[THROTTLED] = lookup[celery_states.PENDING]
    between = (lookup[celery_states.REVOKED] + lookup[celery_states.STARTED]) / 2
    for state in RUNNING_STATES:
        lookup[state] = between  # type: ignore[assignment]
    for field in SHOWN_FIELDS:
        if field not in CeleryTask._fields:
            CeleryTask._fields = (*CeleryTask._fields, field)
            setattr(CeleryTask, field, None)


def from_the_brain(event: dict[str, Any], workers: Any) -> bool:
    """Whether a task event is one the brain sends about a call no worker has: ``task-throttled``,
    or a ``task-revoked`` (or a ``task-failed`` marked ``LOST_MARK``: its worker went away) from
    a sender Flower knows no worker by (a Celery worker that revokes a task it holds sends
    heartbeats under the name it sends the event with)."""
    kind = event.get("type")
    ended = kind == TASK_REVOKED_EVENT or (kind == TASK_FAILED_EVENT and bool(event.get(LOST_MARK)))
    return kind == TASK_THROTTLED_EVENT or (ended and event.get("hostname") not in workers)


def undoes_revoked(event: dict[str, Any], tasks: Any) -> bool:
    """Whether ``event`` is a ``task-retried`` for a task already REVOKED, which Celery's state
    would let replace it (it lets any event replace RETRY and RETRY replace any state). The
    brain revokes a failed attempt shown RETRY when its task is cancelled or expires while it
    waits for its next attempt (a new run); a RETRY of it heard after that is late, never new:
    a client's RETRY said again by the brain that recorded the failure (``RESTATE_RETRY_S``,
    another brain may have done the cancel), or a pool worker's sent after the cancel began."""
    if event.get("type") != "task-retried":
        return False
    task = tasks.get(event.get("uuid"))
    return task is not None and task.state == celery_states.REVOKED


def _throttled_from_no_worker(released: Any) -> Any:
    def event(self: EventsState, event: dict[str, Any]) -> None:
        if undoes_revoked(event, self.tasks):
            return
        if not from_the_brain(event, self.workers):
            released(self, event)
            return
        # Celery's state makes a worker of any task event's sender; this one's is the brain.
        hostname = event.get("hostname")
        known = hostname in self.workers
        before = self.tasks.get(event.get("uuid"))
        worker = before.worker if before is not None else None
        released(self, event)
        task = self.tasks.get(event.get("uuid"))
        if task is not None:
            task.worker = worker
        if not known:
            self.workers.pop(hostname, None)
        counts = self.counter.get(hostname)
        if counts is not None:
            counts.pop(event.get("type"), None)
            if not counts:
                del self.counter[hostname]

    event.__wrapped__ = released  # type: ignore[attr-defined]
    return event


def install() -> bool:
    """Serve ``/api/workers`` with ``ListWorkers``, ``/metrics`` behind the password, check
    the Host header, link the web view from the navigation bar; False (and logged) if Flower's
    table changed."""
    Flower.find_handler = _find_handler  # type: ignore[method-assign]
    rank_states()
    if not hasattr(EventsState.event, "__wrapped__"):
        EventsState.event = _throttled_from_no_worker(EventsState.event)  # type: ignore[method-assign]
    for handler in (flower_views.BaseHandler, BaseApiHandler):
        if "write_error" in vars(handler) and not hasattr(vars(handler)["write_error"], "__wrapped__"):
            handler.write_error = _answers_401(vars(handler)["write_error"])  # type: ignore[method-assign]
    if not hasattr(flower_views.BaseHandler.render_string, "__wrapped__"):
        flower_views.BaseHandler.render_string = _links_web_view(  # type: ignore[method-assign]
            flower_views.BaseHandler.render_string
        )
    installed = True
    if not _replace(WORKERS_API, flower_workers.ListWorkers, ListWorkers):
        installed = False
        log.error(
            "this Flower release serves %s differently; client agents are missing from it "
            "(the dashboard still shows them). Install the Flower version pyproject.toml names.",
            WORKERS_API,
        )
    if not _replace(METRICS, flower_monitor.Metrics, Metrics):
        installed = False
        log.error(
            "this Flower release serves %s differently and it may answer without the password. "
            "Install the Flower version pyproject.toml names.",
            METRICS,
        )
    return installed


def exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    """Flower's SIGTERM handler, with a timer that ends the process if its exit hangs."""
    timer = threading.Timer(EXIT_GRACE_S, os._exit, args=(0,))
    timer.daemon = True
    timer.start()
    _flower_sigterm(signum, frame)


def install_exit() -> None:
    """Flower's command installs ``flower.command.sigterm_handler`` when it starts, after the
    ``-A`` module is imported: it installs this one instead."""
    flower_command.sigterm_handler = exit_on_sigterm
    if signal.getsignal(signal.SIGTERM) is _flower_sigterm:  # already installed
        signal.signal(signal.SIGTERM, exit_on_sigterm)


install()
install_exit()

__all__ = [
    "EXIT_GRACE_S",
    "ListWorkers",
    "Metrics",
    "app",
    "exit_on_sigterm",
    "install",
    "install_exit",
    "rank_states",
    "unauthorized_body",
    "with_web_link",
]
