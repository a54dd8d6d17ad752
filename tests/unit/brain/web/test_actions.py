"""The web view's actions over HTTP against a real brain (real Redis, real SQLite store, no
workers: server tasks stay queued): cancel a tree or a task, each only with the page's CSRF
token for the browser's session cookie, and an unknown tree or task a 404 saying so."""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx2
import pytest

from brain.core.models import SessionKind, TaskState
from brain.runtime.service import Brain
from brain.stack.redis_server import RedisServer
from brain.web.actions import Actions
from brain.web.csrf import COOKIE
from tests.conftest import tree, wait_until
from tests.unit.brain.web.served import USERS, served, stored_tree
from workers.contracts import ClientConnected, ToolDescriptor, ToolType

AUTH = ("ops", USERS["ops"])
TOKEN = re.compile(r'name="csrf" value="([0-9a-f]+)"')


@pytest.fixture
def submitted(brain_on_redis: Brain) -> str:
    brain_on_redis.publish_registry()  # what a brain worker does: Actions connects as the CLI does
    rec = brain_on_redis.scheduler.submit(
        tree(
            {
                "id": "night",
                "tasks": [
                    {"id": "a", "tool": "echo", "args": {"value": 1}},
                    {"id": "b", "tool": "echo", "args": {"value": 2}},
                ],
            }
        ),
        user="ada",
    )
    return rec.tree_id


def test_cancel_needs_the_pages_csrf_token_and_cancels_a_task_then_the_tree(
    tmp_path: Path, brain_on_redis: Brain, redis_server: RedisServer, submitted: str
) -> None:
    brain = brain_on_redis
    store_path = brain.settings.data_dir / "vancetope.db"
    actions = Actions(brain.settings, redis_server.url)
    try:
        with served(tmp_path, actions=actions, store_path=store_path) as web:
            origin = {"Origin": web.url}
            with httpx2.Client(base_url=web.url, auth=AUTH, timeout=30) as browser:
                page = browser.get(f"/trees/{submitted}")
                assert page.status_code == 200 and COOKIE in page.cookies
                assert (
                    "HttpOnly" in page.headers["set-cookie"]
                    and "SameSite=Strict" in page.headers["set-cookie"]
                )
                token = TOKEN.search(page.text)
                assert token is not None, "the running tree's page offers no cancel form"
                # No token, a wrong one, or the right one with another session cookie: refused.
                for form, cookies in (
                    ({}, None),
                    ({"csrf": "0" * 64}, None),
                    ({"csrf": token.group(1)}, {COOKIE: "someone-elses-session"}),
                ):
                    refused = httpx2.post(
                        f"{web.url}/trees/{submitted}/cancel",
                        data=form,
                        cookies=cookies or dict(browser.cookies),
                        auth=AUTH,
                        headers=origin,
                        timeout=30,
                    )
                    assert refused.status_code == 403, form
                    assert "CSRF token" in refused.text
                assert set(brain.store.task_states(submitted).values()) == {TaskState.QUEUED_SERVER}

                form = {"csrf": token.group(1)}
                missing = browser.post(f"/trees/{submitted}/tasks/nope/cancel", data=form, headers=origin)
                assert missing.status_code == 404
                assert (
                    f"tree &#x27;{submitted}&#x27; has no task &#x27;nope&#x27;; its tasks: a, b"
                    in missing.text
                )
                unknown = browser.post("/trees/nope/cancel", data=form, headers=origin)
                assert unknown.status_code == 404 and "no task tree with id &#x27;nope&#x27;" in unknown.text

                one = browser.post(f"/trees/{submitted}/tasks/a/cancel", data=form, headers=origin)
                assert one.status_code == 303 and one.headers["location"] == f"/trees/{submitted}"
                assert brain.store.task_states(submitted) == {
                    "a": TaskState.SKIPPED,
                    "b": TaskState.QUEUED_SERVER,
                }
                whole = browser.post(f"/trees/{submitted}/cancel", data=form, headers=origin)
                assert whole.status_code == 303
                assert set(brain.store.task_states(submitted).values()) == {TaskState.SKIPPED}
                assert brain.store.get_task(submitted, "b").reason == "cancelled by user"
                # A finished tree offers no cancel.
                assert TOKEN.search(browser.get(f"/trees/{submitted}").text) is None
    finally:
        actions.close()


def test_without_a_brain_no_page_offers_an_action_and_a_post_is_refused(tmp_path: Path) -> None:
    with served(tmp_path) as web:
        stored_tree(web.writer, "night-1", [{"id": "a", "tool": "echo", "args": {"value": 1}}])
        page = httpx2.get(f"{web.url}/trees/night-1", auth=AUTH, timeout=10)
        assert page.status_code == 200 and "Cancel" not in page.text and COOKIE not in page.cookies
        refused = httpx2.post(
            f"{web.url}/trees/night-1/cancel",
            data={"csrf": "x"},
            auth=AUTH,
            headers={"Origin": web.url},
            timeout=10,
        )
        assert refused.status_code == 403


def announce(brain: Brain, client_id: str, session_id: str, description: str = "") -> None:
    """What the brain does with a client's announcement: its session, its tools checked
    against their pins (a changed definition is held)."""
    tools = (
        [ToolDescriptor(name="lookup", type=ToolType.NATIVE, description=description)] if description else []
    )
    msg = ClientConnected(
        client_id=client_id, session_id=session_id, available_tools=tools, sent_at=time.time()
    )
    book = brain.scheduler.presence
    book.connect(msg, book.enrollment(client_id), time.time())


def test_the_clients_page_shows_each_users_clients_last_seen_and_waiting_work_and_approves_held_tools(
    tmp_path: Path, brain_on_redis: Brain, redis_server: RedisServer
) -> None:
    brain = brain_on_redis
    brain.publish_registry()
    book = brain.scheduler.presence
    for cid, user in (("laptop", "ada"), ("desk", "ada"), ("box", "bob")):
        book.enroll(cid, user)
    announce(brain, "laptop", "s1", "Look it up.")
    announce(brain, "laptop", "s1", "Look it up, and mail it away.")  # changed since pinned: held
    announce(brain, "desk", "s2")
    brain.clients.on_disconnected("desk", "s2", "missed heartbeats")
    # Parked for any client of ada: none offers read_local_file.
    brain.scheduler.submit(
        tree({"id": "t", "tasks": [{"id": "r", "tool": "read_local_file", "args": {"path": "x"}}]}),
        user="ada",
    )
    bound = brain.scheduler.submit(
        tree({"id": "d", "tasks": [{"id": "r", "tool": "read_local_file", "args": {"path": "x"}}]}),
        session=SessionKind.INTERACTIVE,
        client_id="desk",
    )
    actions = Actions(brain.settings, redis_server.url)
    try:
        store_path = brain.settings.data_dir / "vancetope.db"
        with (
            served(tmp_path, actions=actions, store_path=store_path) as web,
            httpx2.Client(base_url=web.url, auth=AUTH, timeout=30) as browser,
        ):
            page = browser.get("/clients")
            assert page.status_code == 200
            rows = dict(re.findall(r'data-client-id="([^"]+)" data-client-state="([^"]+)"', page.text))
            assert rows == {"laptop": "connected", "desk": "recently seen", "box": "offline"}
            assert page.text.index('data-user="ada"') < page.text.index('data-user="bob"')
            assert "offline since" in page.text and "not seen since recorded" in page.text
            assert "changed, held until approved: lookup" in page.text
            assert "1 task for any client of user ada" in page.text
            token = TOKEN.search(page.text)
            assert token is not None
            origin = {"Origin": web.url}
            url = "/clients/laptop/approve-tools"
            assert browser.post(url, data={"tool": "lookup"}, headers=origin).status_code == 403
            other = browser.post(url, data={"tool": "nope", "csrf": token.group(1)}, headers=origin)
            assert other.status_code == 404 and "holds no changed tool nope" in other.text
            approved = browser.post(url, data={"tool": "lookup", "csrf": token.group(1)}, headers=origin)
            assert approved.status_code == 303 and approved.headers["location"] == "/clients"
            # The trees page says since when the client its work waits for is gone.
            row = re.search(rf'<tr data-tree-id="{bound.tree_id}".*?</tr>', browser.get("/trees").text)
            assert row is not None and "1 task waiting for client desk (offline since " in row.group(0)
        # Pinned as announced: the agent's next announcement is accepted whole.
        announce(brain, "laptop", "s1", "Look it up, and mail it away.")
        session = book.session("laptop")
        assert (
            session is not None and session.held_tools == [] and [t.name for t in session.tools] == ["lookup"]
        )
        assert book.last_seen().keys() == {"desk"}
    finally:
        actions.close()


def test_the_web_views_brain_follows_a_registry_the_brain_publishes_after_it_connected(
    brain_on_redis: Brain, redis_server: RedisServer
) -> None:
    brain_on_redis.publish_registry()
    actions = Actions(brain_on_redis.settings, redis_server.url)
    try:
        assert actions.run(lambda b: b.scheduler.registry.changes) == []
        reloaded = brain_on_redis.scheduler.registry.model_copy(update={"changes": ["added tool: lookup"]})
        brain_on_redis.hot.put_registry(reloaded.model_dump(mode="json"))  # what a reload publishes
        wait_until(
            lambda: actions.run(lambda b: b.scheduler.registry.changes) == ["added tool: lookup"],
            timeout=60,
            what="the web view's brain to read the reloaded registry",
        )
    finally:
        actions.close()
