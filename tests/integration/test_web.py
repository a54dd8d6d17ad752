"""The web view in a real browser (Debian's chromium, headless, driven by Playwright) and
beside a real stack: `up` prints where it is, a tree page follows a running tree live."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest

from brain.core.models import SessionKind, TaskRecord, TaskState, TreeStatus
from brain.runtime.service import Brain
from brain.stack.embedded import EmbeddedStack
from brain.stack.redis_server import free_port, port_free
from brain.stack.webauth import WEB_SECRET_FILE, WEB_USER, web_access
from tests.conftest import CHROMIUM_FLAGS, agent_with_servers, tree, wait_until
from tests.integration.test_supervisor import running_up, up_log
from tests.unit.brain.web.served import T0, USERS, served, stored_tree

pytestmark = pytest.mark.integration

EVERY_NODE_DONE = "[...document.querySelectorAll('#graph g.node')].every(n => n.dataset.state === 'done')"


@contextmanager
def browser_page(chromium: str, user: str, password: str) -> Iterator[Any]:
    playwright = pytest.importorskip("playwright.sync_api")
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        try:
            context = browser.new_context(http_credentials={"username": user, "password": password})
            yield context.new_page()
        finally:
            browser.close()


def serve_web(stack: EmbeddedStack) -> tuple[str, str, str]:
    """The stack's web view started on a free port of loopback: (its URL, user, password)."""
    port = free_port()
    access = web_access("127.0.0.1", stack.settings.data_dir, {})
    stack.start_web(port, access)
    wait_until(lambda: not port_free(port), timeout=120, what="the web view to listen")
    user, password = access.basic_auth.split(":", 1)
    return f"http://127.0.0.1:{port}", user, password


def node_states(page: Any) -> dict[str, str]:
    return dict(
        page.evaluate(
            "[...document.querySelectorAll('#graph g.node')].map(n => [n.dataset.taskId, n.dataset.state])"
        )
    )


def bars(page: Any) -> dict[str, set[str]]:
    """The timeline's bars drawn in each task's row: ``wait`` (queued) and ``bar`` (ran)."""
    rows = page.evaluate(
        "[...document.querySelectorAll('#timeline .vrow')]"
        ".map(r => [r.dataset.taskId, [...r.querySelectorAll('.lane i')].map(i => i.className)])"
    )
    return {task_id: set(classes) for task_id, classes in rows}


def lane_box(page: Any, task_id: str, kind: str) -> tuple[float, float]:
    """(left, width) in percent of a task's ``kind`` bar in the timeline."""
    left, width = page.evaluate(
        f"(() => {{ const i = document.querySelector('#timeline .vrow[data-task-id=\"{task_id}\"] i.{kind}');"
        " return [parseFloat(i.style.left), parseFloat(i.style.width)]; })()"
    )
    return left, width


def test_up_serves_the_web_view_behind_its_password_and_prints_where(tmp_path: Path) -> None:
    port = free_port()
    with running_up(tmp_path, "--no-agent", "--no-gateway", "--web-port", str(port)) as up:
        line = wait_until(
            lambda: re.search(r"web: (http://127\.0\.0\.1:\d+/) \(([^)]*)\)", up_log(tmp_path)),
            timeout=120,
            what="`vancetope up` to print its web: line",
        )
        assert line.group(1) == f"http://127.0.0.1:{port}/"
        secret_file = tmp_path / "data" / WEB_SECRET_FILE
        assert line.group(2) == f"user {WEB_USER}, password in {secret_file}"
        password = secret_file.read_text().strip()
        assert password not in up_log(tmp_path)
        refused = httpx2.get(line.group(1) + "trees", timeout=10)
        assert refused.status_code == 401 and str(secret_file) in refused.text
        assert httpx2.get(line.group(1) + "trees", auth=(WEB_USER, password), timeout=10).status_code == 200
        assert up.poll() is None


def test_a_tree_page_shows_a_parked_task_and_flips_every_node_to_done_live_when_the_agent_connects(
    chromium: str,
    stack_factory: Callable[..., EmbeddedStack],
    brain_factory: Callable[[EmbeddedStack], Brain],
    tmp_path: Path,
) -> None:  # chromium first: a skip comes before the stack starts
    agent = agent_with_servers(tmp_path, {})
    (tmp_path / "sandbox" / "notes.txt").write_text("the notes")
    # The agent is enrolled but not started: its task parks until it connects.
    stack = stack_factory(services=("brain", "server-pool"), agent_config=agent)
    brain = brain_factory(stack)
    url, user, password = serve_web(stack)
    rec = brain.scheduler.submit(
        tree(
            {
                "id": "live",
                "tasks": [
                    {"id": "start", "tool": "echo", "args": {"value": "s"}},
                    {
                        "id": "read",
                        "tool": "read_local_file",
                        "args": {"path": "notes.txt"},
                        "depends_on": ["start"],
                    },
                    {"id": "after", "tool": "echo", "args": {"value": "a"}, "depends_on": ["read"]},
                ],
            }
        ),
        session=SessionKind.INTERACTIVE,
        client_id="laptop",
    )
    wait_until(
        lambda: (
            getattr(brain.store.get_task(rec.tree_id, "read"), "state", None)
            in (TaskState.BLOCKED, TaskState.PENDING_CLIENT)
        ),
        timeout=120,
        what="the client's task to park",
    )
    with browser_page(chromium, user, password) as page:
        page.goto(f"{url}/trees")
        row = page.locator(f'tr[data-tree-id="{rec.tree_id}"]')
        assert row.get_attribute("data-status") == "running"
        assert "waiting for client laptop" in row.inner_text()
        page.goto(f"{url}/trees/{rec.tree_id}")
        page.evaluate("window.notReloaded = true")
        before = node_states(page)
        assert before["start"] == "done" and before["after"] == "pending"
        assert before["read"] in ("blocked", "pending_client")
        assert bars(page) == {"start": {"wait", "bar"}, "read": {"wait"}, "after": set()}
        # The parked task says why on the node (the whole reason in its tooltip).
        parked = page.locator('g.node[data-task-id="read"]')
        assert "Waiting for Client for Tool: read_local_file" in parked.locator("title").text_content()
        assert "Waiting for Client" in (parked.locator("text").last.text_content() or "")
        stack.start_service("client-agent")
        # Polled from here: Playwright's wait_for_function evaluates a string in the page, which
        # the page's Content-Security-Policy (no eval) refuses, as it should.
        wait_until(lambda: page.evaluate(EVERY_NODE_DONE), timeout=120, what="every node to show done")
        assert page.evaluate("window.notReloaded") is True, "the page updated by reloading"
        wait_until(
            lambda: page.evaluate("document.getElementById('status').dataset.status") == "done",
            timeout=120,
            what="the tree's status to show done",
        )
        assert node_states(page) == {"start": "done", "read": "done", "after": "done"}
        # The timeline's bars moved live too: each task's bar starts where the store says it
        # started (read and after started after the page was drawn) and runs to its finish.
        wait_until(
            lambda: (
                bars(page) == {"start": {"wait", "bar"}, "read": {"wait", "bar"}, "after": {"wait", "bar"}}
            ),
            timeout=120,
            what="every task's bar",
        )
        assert page.evaluate("window.notReloaded") is True, "the page updated by reloading"
        start = page.evaluate("JSON.parse(document.getElementById('task-data').textContent).start")
        span = float(page.evaluate("document.getElementById('timeline').dataset.span"))
        for t in brain.store.get_tasks(rec.tree_id):
            assert t.started_at is not None and t.finished_at is not None
            left, width = lane_box(page, t.task_id, "bar")
            assert left == pytest.approx((t.started_at - start) / span * 100, abs=0.02), t.task_id
            assert left + width >= (t.finished_at - start) / span * 100 - 0.02, t.task_id


def test_a_stored_tree_of_1000_tasks_renders_in_chromium(chromium: str, tmp_path: Path) -> None:
    """Measures (prints) how long Chromium takes to load and lay out the page; asserts only
    what it shows, never a time (the machine may be slow)."""
    tasks: list[dict[str, Any]] = []
    for i in range(1000):  # ten columns of a hundred, each task after one of the column before
        deps = [f"t{i - 100}"] if i >= 100 else []
        tasks.append({"id": f"t{i}", "tool": "echo", "args": {"value": i}, "depends_on": deps})
    states = {f"t{i}": TaskState.DONE if i < 600 else TaskState.PENDING for i in range(1000)}
    with served(tmp_path) as web:
        stored_tree(web.writer, "big-1", tasks, states)
        with browser_page(chromium, "ops", USERS["ops"]) as page:
            page.goto(f"{web.url}/trees")  # a first page: Chromium's own start-up is not counted
            started = time.perf_counter()
            page.goto(f"{web.url}/trees/big-1", wait_until="load")
            page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
            took = time.perf_counter() - started
            shown = node_states(page)
            laid_out = page.evaluate("document.getElementById('graph').dataset.layout")
            # dagre ranks by depends_on: t0..t99 first, t900..t999 last, left to right.
            xs = page.evaluate(
                "['t0', 't500', 't999'].map(id => document.querySelector(`g.node[data-task-id=\"${id}\"]`)"
                ".transform.baseVal.consolidate().matrix.e)"
            )
    print(f"\n1,000-task tree page: loaded, laid out by dagre and painted in Chromium in {took:.2f}s")
    assert laid_out == "dagre"
    assert xs[0] < xs[1] < xs[2]
    assert len(shown) == 1000
    assert sum(state == "done" for state in shown.values()) == 600


def test_a_stored_tree_of_10000_tasks_keeps_its_page_small_and_usable_in_chromium(
    chromium: str, tmp_path: Path
) -> None:
    """The graph groups each column's tasks and the task list draws only the rows in view, so
    the DOM stays a few hundred elements; the list scrolls to the last task, finds one, lists
    a group's tasks on a click, and a state change moves its group's count live."""
    tasks: list[dict[str, Any]] = []
    for i in range(10_000):  # ten columns of a thousand
        deps = [f"t{i - 1000}"] if i >= 1000 else []
        tasks.append({"id": f"t{i}", "tool": "echo", "args": {"value": i}, "depends_on": deps})
    states = {f"t{i}": TaskState.DONE if i < 6000 else TaskState.PENDING for i in range(10_000)}
    with served(tmp_path) as web:
        stored_tree(web.writer, "huge-1", tasks, states)
        with browser_page(chromium, "ops", USERS["ops"]) as page:
            page.goto(f"{web.url}/trees")
            started = time.perf_counter()
            page.goto(f"{web.url}/trees/huge-1", wait_until="load")
            page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
            took = time.perf_counter() - started
            elements = page.evaluate("document.getElementsByTagName('*').length")
            groups = page.locator("#graph g.node.collapsed")
            assert page.evaluate("document.getElementById('graph').dataset.layout") == "dagre"
            assert groups.count() == 10 and page.locator("#graph g.node").count() == 10
            assert groups.nth(6).get_attribute("data-group") == "echo@6"
            assert groups.nth(6).locator("text.count").text_content() == "×1000 · 1000 pending"
            rows = page.locator("#timeline .vrow")
            assert 10 <= rows.count() <= 100
            assert rows.first.get_attribute("data-task-id") == "t0"
            # Scrolled to its end, the list draws the last tasks (and still only those in view).
            page.evaluate("document.getElementById('timeline').scrollTop = 1e9")
            wait_until(
                lambda: page.locator('#timeline .vrow[data-task-id="t9999"]').count() == 1,
                timeout=120,
                what="the last task's row",
            )
            assert rows.count() <= 100
            assert page.locator('#timeline .vrow[data-task-id="t0"]').count() == 0
            page.locator("#find").fill("t4242")
            wait_until(lambda: rows.count() == 1, timeout=120, what="one row found")
            assert rows.first.get_attribute("data-state") == "done"
            rows.first.click()  # its details under the graph
            wait_until(
                lambda: page.locator('#details .task[data-task-id="t4242"]').count() == 1,
                timeout=120,
                what="the clicked task's details",
            )
            page.locator("#find").fill("")
            groups.nth(6).click()  # the list shows that group's tasks
            wait_until(
                lambda: page.locator("#shown-count").text_content() == "1000 of 10000 tasks",
                timeout=120,
                what="the group's tasks listed",
            )
            assert rows.first.get_attribute("data-task-id") == "t6000"
            # Live: a task of the group ends; its node counts it without a reload.
            page.evaluate("window.notReloaded = true")
            web.writer.end_tasks(
                "huge-1", from_states={TaskState.PENDING}, state=TaskState.FAILED, reason="boom",
                finished_at=T0 + 9, task_id="t6000",
            )  # fmt: skip
            wait_until(
                lambda: (
                    groups.nth(6).locator("text.count").text_content() == "×1000 · 999 pending · 1 failed"
                ),
                timeout=120,
                what="the group's count to follow its task",
            )
            assert groups.nth(6).get_attribute("data-state") == "failed"
            assert rows.first.get_attribute("data-state") == "failed"
            assert page.evaluate("window.notReloaded") is True
    print(f"\n10,000-task tree page: loaded and laid out in Chromium in {took:.2f}s, {elements} elements")
    assert elements < 1500


def test_cancel_clicked_in_chromium_cancels_the_tree_and_a_post_without_the_csrf_token_is_refused(
    chromium: str,
    stack_factory: Callable[..., EmbeddedStack],
    brain_factory: Callable[[EmbeddedStack], Brain],
) -> None:
    # The brain only, no server pool: the tree's tasks stay queued until cancelled.
    stack = stack_factory(services=("brain",))
    brain = brain_factory(stack)
    url, user, password = serve_web(stack)
    rec = brain.scheduler.submit(
        tree(
            {
                "id": "night",
                "tasks": [
                    {"id": "first", "tool": "echo", "args": {"value": 1}},
                    {"id": "then", "tool": "echo", "args": {"value": 2}, "depends_on": ["first"]},
                ],
            }
        ),
        user="ada",
    )
    origin = url
    url = f"{url}/trees/{rec.tree_id}"
    with browser_page(chromium, user, password) as page:
        page.goto(url)
        # Same origin and the password, but no token: the Guard lets it by, the CSRF check not.
        refused = page.request.post(f"{url}/cancel", headers={"Origin": origin})
        assert refused.status == 403 and "CSRF token" in refused.text()
        assert brain.store.get_tree(rec.tree_id).status is TreeStatus.RUNNING
        page.on("dialog", lambda dialog: dialog.accept())  # "Cancel every unfinished task...?"
        page.get_by_role("button", name="Cancel tree").click()
        wait_until(
            lambda: brain.store.get_tree(rec.tree_id).status is not TreeStatus.RUNNING,
            timeout=120,
            what="the tree to end cancelled",
        )
        assert {t.state for t in brain.store.get_tasks(rec.tree_id)} == {TaskState.SKIPPED}
        assert all(t.reason == "cancelled by user" for t in brain.store.get_tasks(rec.tree_id))
        page.wait_for_load_state()
        wait_until(
            lambda: set(node_states(page).values()) == {"skipped"}, timeout=120, what="the page to show it"
        )


def test_a_fan_out_is_one_node_with_its_count_that_follows_its_items_live(
    chromium: str, tmp_path: Path
) -> None:
    tasks = [
        {"id": "list", "tool": "echo", "args": {"value": [1, 2]}},
        {"id": "each", "tool": "echo", "depends_on": ["list"], "for_each": "list"},
        {"id": "sum", "tool": "echo", "depends_on": ["each"]},
    ]
    with served(tmp_path) as web:
        stored_tree(web.writer, "fan-1", tasks, {"list": TaskState.DONE, "each": TaskState.FANNED_OUT})
        items = [
            TaskRecord(
                tree_id="fan-1", task_id=f"each[{i}]", tool="echo", state=TaskState.RUNNING, parent="each"
            )
            for i in range(50)
        ]
        web.writer.add_tasks("fan-1", items)
        with browser_page(chromium, "ops", USERS["ops"]) as page:
            page.goto(f"{web.url}/trees/fan-1")
            page.evaluate("window.notReloaded = true")
            group = page.locator('#graph g.node[data-group="each[*]"]')
            assert page.locator("#graph g.node").count() == 4  # list, each, its 50 items as one, sum
            assert group.get_attribute("data-state") == "running"
            assert group.locator("text.count").text_content() == "×50 · 50 running"
            for i in range(30):
                web.writer.end_tasks(
                    "fan-1", from_states={TaskState.RUNNING}, state=TaskState.DONE, reason="", finished_at=T0 + 9,
                    task_id=f"each[{i}]",
                )  # fmt: skip
            wait_until(
                lambda: group.locator("text.count").text_content() == "×50 · 30 done · 20 running",
                timeout=120,
                what="the group's count to follow its items",
            )
            assert group.get_attribute("data-state") == "running"
            web.writer.end_tasks(
                "fan-1",
                from_states={TaskState.RUNNING},
                state=TaskState.FAILED,
                reason="",
                finished_at=T0 + 9,
            )
            wait_until(
                lambda: group.get_attribute("data-state") == "failed", timeout=120, what="the group to fail"
            )
            assert page.evaluate("window.notReloaded") is True, "the page updated by reloading"
