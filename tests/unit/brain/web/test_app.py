"""The web view over HTTP (a real uvicorn server, a real read-only SQLite store): who may read
it, and what /trees, /trees/<id> and a tree's events say."""

from __future__ import annotations

import html
import json
import re
import time
from pathlib import Path
from typing import Any

import httpx2
import pytest

from brain.core.models import TaskState, TreeStatus
from tests.unit.brain.web.served import T0, UNAUTHORIZED, USERS, served, stored_tree
from workers import masking

AUTH = ("ops", USERS["ops"])
S = TaskState
CHAIN = [
    {"id": "fetch", "tool": "echo", "args": {"value": "planted-secret-value"}},
    {"id": "parse", "tool": "echo", "args": {"value": "x"}, "depends_on": ["fetch"]},
    {"id": "upload", "tool": "read_local_file", "args": {"path": "/p"}, "depends_on": ["parse"]},
    {"id": "notify", "tool": "echo", "args": {"value": "y"}, "depends_on": ["fetch"]},
]


def test_without_the_password_every_page_is_401_saying_where_the_password_is(tmp_path: Path) -> None:
    with served(tmp_path) as web:
        stored_tree(web.writer, "night-1", CHAIN)
        for path in ("/", "/trees", "/trees/night-1", "/trees/night-1/events", "/trees/night-1/tasks/fetch"):
            answer = httpx2.get(web.url + path, timeout=10)
            assert answer.status_code == 401, path
            assert answer.text == UNAUTHORIZED
            assert answer.headers["www-authenticate"].startswith("Basic ")
            assert "night-1" not in answer.text
        wrong = httpx2.get(web.url + "/trees", auth=("ops", "guess"), timeout=10)
        assert wrong.status_code == 401
        assert httpx2.get(web.url + "/trees", auth=("nobody", USERS["ops"]), timeout=10).status_code == 401
        assert httpx2.get(web.url + "/trees", auth=AUTH, timeout=10).status_code == 200


def test_a_host_header_that_is_not_loopback_is_refused_on_loopback_even_with_the_password(
    tmp_path: Path,
) -> None:
    # DNS rebinding: evil.example resolves to 127.0.0.1, so the browser sends its own name.
    with served(tmp_path) as web:
        stored_tree(web.writer, "night-1", CHAIN)
        port = web.url.rsplit(":", 1)[1]
        for host in ("evil.example", f"evil.example:{port}", "127.0.0.1.evil.example"):
            answer = httpx2.get(web.url + "/trees/night-1", auth=AUTH, headers={"Host": host}, timeout=10)
            assert answer.status_code == 421, host
            assert "night-1" not in answer.text
        for host in (f"127.0.0.1:{port}", f"localhost:{port}"):
            assert (
                httpx2.get(web.url + "/trees", auth=AUTH, headers={"Host": host}, timeout=10).status_code
                == 200
            )


def test_a_request_that_could_change_something_needs_this_hosts_origin_before_the_password(
    tmp_path: Path,
) -> None:
    with served(tmp_path) as web:
        host = web.url.removeprefix("http://")
        for headers in ({}, {"Origin": "http://evil.example"}, {"Origin": "null"}):
            answer = httpx2.post(web.url + "/trees", auth=AUTH, headers=headers, timeout=10)
            assert answer.status_code == 403, headers
        # Same origin and the password: past the guard, and no route changes anything yet.
        same = httpx2.post(web.url + "/trees", auth=AUTH, headers={"Origin": f"http://{host}"}, timeout=10)
        assert same.status_code == 405


def test_beyond_loopback_any_host_name_is_served_but_only_with_the_password(tmp_path: Path) -> None:
    with served(tmp_path, address="0.0.0.0") as web:
        url = web.url.replace("0.0.0.0", "127.0.0.1")
        headers = {"Host": "vancetope.internal"}
        assert httpx2.get(url + "/trees", headers=headers, timeout=10).status_code == 401
        assert httpx2.get(url + "/trees", auth=AUTH, headers=headers, timeout=10).status_code == 200


def test_trees_lists_running_and_finished_trees_with_counts_duration_and_what_they_wait_for(
    tmp_path: Path,
) -> None:
    with served(tmp_path) as web:
        stored_tree(
            web.writer,
            "night-1",
            CHAIN,
            {"fetch": S.DONE, "parse": S.DONE, "upload": S.PENDING_CLIENT, "notify": S.BLOCKED},
            upload={"client_id": "laptop"},
            notify={"client_id": "laptop"},
        )
        stored_tree(web.writer, "day-2", CHAIN[:1], {"fetch": S.DONE}, user="bob", status=TreeStatus.DONE)
        page = httpx2.get(web.url + "/trees", auth=AUTH, timeout=10).text
        running = _row(page, "night-1")
        assert 'data-status="running"' in running
        assert "2 tasks waiting for client laptop (parked since" in running
        assert ">done 2<" in running and ">pending_client 1<" in running and ">blocked 1<" in running
        finished = _row(page, "day-2")
        assert 'data-status="done"' in finished and "1m00s" in finished  # submitted T0, finished T0+60
        only_bob = httpx2.get(web.url + "/trees", params={"user": "bob"}, auth=AUTH, timeout=10).text
        assert "day-2" in only_bob and "night-1" not in only_bob
        only_running = httpx2.get(web.url + "/trees?status=running", auth=AUTH, timeout=10).text
        assert "night-1" in only_running and 'data-tree-id="day-2"' not in only_running
        assert httpx2.get(web.url + "/trees?status=bogus", auth=AUTH, timeout=10).status_code == 400


def test_trees_filter_by_schedule_and_by_submission_time_through_the_store(tmp_path: Path) -> None:
    hour = 3600.0
    with served(tmp_path) as web:
        for tree_id, at, schedule in [
            ("nightly-1", T0 - 30 * hour, "nightly"),
            ("nightly-2", T0 - 6 * hour, "nightly"),
            ("weekly-1", T0 - 5 * hour, "weekly"),
            ("hand-1", T0 - 1 * hour, None),
            ("recent-1", time.time() - hour, None),  # ?last= counts back from the web view's clock
        ]:
            stored_tree(
                web.writer, tree_id, CHAIN[:1], {"fetch": S.DONE}, status=TreeStatus.DONE,
                submitted_at=at, schedule=schedule,
            )  # fmt: skip

        def listed(**params: str) -> list[str]:
            answer = httpx2.get(web.url + "/trees", params=params, auth=AUTH, timeout=10)
            assert answer.status_code == 200, answer.text
            return re.findall(r'<tr data-tree-id="([^"]+)"', answer.text)

        assert listed() == ["recent-1", "hand-1", "weekly-1", "nightly-2", "nightly-1"]
        assert listed(schedule="nightly") == ["nightly-2", "nightly-1"]
        assert listed(schedule="nobody") == []
        assert listed(last="12h") == ["recent-1"]
        assert listed(last="12h", schedule="nightly") == []
        assert listed(since=str(T0 - 12 * hour), until=str(T0)) == ["hand-1", "weekly-1", "nightly-2"]
        assert listed(since=str(T0 - 12 * hour), until=str(T0 - 1 * hour)) == ["weekly-1", "nightly-2"]
        assert listed(schedule="nightly", until=str(T0 - 6 * hour)) == ["nightly-1"]
        assert listed(schedule="nightly", status="running") == []
        page = httpx2.get(web.url + "/trees", params={"schedule": "nightly"}, auth=AUTH, timeout=10).text
        assert '<option value="nightly" selected>' in page
        assert 'schedule <a href="/trees?schedule=nightly">nightly</a>' in page
        for params, says in [
            ({"last": "12"}, "?last='12': give a number and a unit"),
            ({"since": "yesterday"}, "?since='yesterday' is no time"),
            ({"since": "2026-12-06", "last": "1h"}, "not both"),
        ]:
            bad = httpx2.get(web.url + "/trees", params=params, auth=AUTH, timeout=10)
            assert bad.status_code == 400 and says in bad.text, params


def test_a_scheduled_runs_page_has_its_morning_summary_and_the_trees_page_links_to_it(tmp_path: Path) -> None:
    from brain.core.summary import SummaryKind, summarise

    night = [
        *CHAIN,
        {"id": "report", "tool": "echo", "args": {"value": "z"}, "depends_on": ["notify"]},
        {"id": "mail", "tool": "echo", "args": {"value": "m"}, "depends_on": ["report"]},
    ]
    with served(tmp_path) as web:
        # parse fails first (fetch's index 0: times T0+i), upload after it is skipped; report
        # fails later (its finish set later still) and skips mail; notify waits for the laptop.
        record = stored_tree(
            web.writer,
            "nightly-1",
            night,
            {"fetch": S.DONE, "parse": S.FAILED, "upload": S.SKIPPED, "notify": S.PENDING_CLIENT,
             "report": S.FAILED, "mail": S.SKIPPED},
            schedule="nightly",
            parse={"error": {"type": "Timeout", "message": "no answer in 30s"}},
            upload={"reason": "upstream task 'parse' failed"},
            notify={"client_id": "laptop"},
            report={"finished_at": T0 + 50},
        )  # fmt: skip
        stored_tree(web.writer, "hand-1", CHAIN[:1], {"fetch": S.DONE})

        def section(tree_id: str) -> str | None:
            page = httpx2.get(web.url + f"/trees/{tree_id}", auth=AUTH, timeout=10).text
            found = re.search(r'<section id="summary".*?</section>', page)
            return found.group(0) if found else None

        now = section("nightly-1")
        assert now is not None and 'data-kind="now"' in now and "as the tasks stand now" in now
        assert "Morning summary of schedule nightly" in now
        counts = dict(re.findall(r'<td data-count="(\w+)">(\d+)</td>', now))
        assert counts == {
            "done": "1", "failed": "2", "expired": "0", "skipped": "2", "not_triggered": "0",
            "waiting": "1", "in_flight": "0", "retrying": "0", "pending": "0", "total": "6",
        }  # fmt: skip
        first = re.search(r'<p id="first-failure">.*?</p>', now)
        assert first is not None
        assert ">parse</a> (echo, failed, at " in first.group(0)
        assert "Timeout: no answer in 30s; it skipped 1 task: " in first.group(0)
        assert ">upload</a>" in first.group(0) and ">mail<" not in first.group(0)
        assert "client <code>laptop</code> of user <code>ada</code>: 1 task (" in now
        assert "running for " in now
        assert section("hand-1") is None  # not a scheduled run
        # The run ends and the schedule sweep stores its final summary: the page shows that one.
        web.writer.finish_tree("nightly-1", TreeStatus.FAILED, T0 + 60)
        ended = web.writer.get_tree("nightly-1")
        assert ended is not None
        web.writer.put_summary(
            summarise(ended, web.writer.get_tasks("nightly-1"), SummaryKind.FINAL, at=T0 + 61)
        )
        final = section("nightly-1")
        assert (
            final is not None
            and 'data-kind="final"' in final
            and "the final summary the brain stored at " in final
        )
        assert "took 1m00s" in final and "<b>failed</b>" in final
        trees = httpx2.get(web.url + "/trees", auth=AUTH, timeout=10).text
        assert 'href="/trees/nightly-1#summary">morning summary</a>' in _row(trees, "nightly-1")
        assert "morning summary" not in _row(trees, "hand-1")
        assert record.schedule == "nightly"


def _row(page: str, tree_id: str) -> str:
    found = re.search(rf'<tr data-tree-id="{re.escape(tree_id)}".*?</tr>', page)
    assert found, f"no row for {tree_id}"
    return found.group(0)


def test_a_tree_page_has_one_node_per_task_with_its_state_and_route_and_never_argument_values(
    tmp_path: Path,
) -> None:
    with served(tmp_path) as web:
        stored_tree(
            web.writer,
            "night-1",
            CHAIN,
            {"fetch": S.DONE, "parse": S.RUNNING, "upload": S.PENDING, "notify": S.PENDING_CLIENT},
            notify={"client_id": "laptop", "route": "client:laptop", "reason": "client laptop is offline"},
        )
        answer = httpx2.get(web.url + "/trees/night-1", auth=AUTH, timeout=10)
        assert answer.status_code == 200
        page = answer.text
        nodes = dict(re.findall(r'<g class="node" data-task-id="([^"]+)" data-state="([^"]+)"', page))
        assert nodes == {"fetch": "done", "parse": "running", "upload": "pending", "notify": "pending_client"}
        # Columns by dependency depth: fetch, then parse and notify, then upload.
        xs = dict(re.findall(r'data-task-id="([^"]+)" data-state="[^"]+" transform="translate\((\d+),', page))
        assert xs["fetch"] < xs["parse"] == xs["notify"] < xs["upload"]
        assert page.count('class="edge"') == 3
        assert "client:laptop" in page and "client laptop is offline" in page
        assert "planted-secret-value" not in page
        assert 'id="timeline"' in page
        # The task list's rows are data for its script: every task, and never an argument value.
        data = json.loads(
            re.search(r'<script type="application/json" id="task-data">(.*?)</script>', page).group(1)
        )
        assert [r[0] for r in data["rows"]] == ["fetch", "parse", "upload", "notify"]
        assert [r[9] for r in data["rows"]] == [1, 1, 0, 0]  # the critical path: fetch, then parse (running)
        assert "Critical path (2 tasks, " in page
        details = httpx2.get(web.url + "/trees/night-1/tasks/fetch", auth=AUTH, timeout=10).text
        assert "echo(value)" in details and "planted-secret-value" not in details
        assert httpx2.get(web.url + "/trees/nope", auth=AUTH, timeout=10).status_code == 404
        assert httpx2.get(web.url + "/trees/night-1/tasks/nope", auth=AUTH, timeout=10).status_code == 404


LOGINS = {"ops": "ops-password", "viewer": "viewer-password"}


def _seen_by(web: Any, login: str) -> dict[str, str]:
    """What ``login`` gets of tree night-1: its pages, task fetch's details, its first event."""
    auth = (login, LOGINS[login])
    pages = {
        path: httpx2.get(web.url + path, auth=auth, timeout=10).text
        for path in (
            "/trees", "/trees/night-1", "/trees/night-1/tasks/fetch", "/trees/night-1/tasks/fetch?fragment=1",
        )
    }  # fmt: skip
    with httpx2.stream("GET", web.url + "/trees/night-1/events", auth=auth, timeout=30) as stream:
        pages["events"] = next(line for line in stream.iter_lines() if line.startswith("data: "))
    return pages


def test_a_result_value_is_shown_in_a_tasks_details_to_the_logins_allowed_and_nowhere_else(
    tmp_path: Path,
) -> None:
    users = LOGINS
    planted = ("planted-result-value", "planted-secret-value")  # the result, an argument value
    seen_by = _seen_by

    with served(tmp_path, users=users, result_users=("ops",)) as web:
        stored_tree(
            web.writer, "night-1", CHAIN[:2], {"fetch": S.DONE, "parse": S.RUNNING},
            fetch={"result": {"headline": "planted-result-value", "n": 3}},
        )  # fmt: skip
        for path, text in seen_by(web, "viewer").items():
            assert not any(value in text for value in planted), path
        assert (
            "shown to the logins of <code>web_result_users</code>"
            in seen_by(web, "viewer")["/trees/night-1/tasks/fetch?fragment=1"]
        )
        shown = seen_by(web, "ops")
        for path in ("/trees/night-1/tasks/fetch", "/trees/night-1/tasks/fetch?fragment=1"):
            result = re.search(r'<pre class="result">(.*?)</pre>', shown[path], re.DOTALL)
            assert result is not None, path
            assert json.loads(html.unescape(result.group(1))) == {"headline": "planted-result-value", "n": 3}
        # Only in a done task's details: not on the tree's pages, not in its events, never an argument.
        for path in ("/trees", "/trees/night-1", "events"):
            assert "planted-result-value" not in shown[path], path
        assert not any("planted-secret-value" in text for text in shown.values())
        running = httpx2.get(
            web.url + "/trees/night-1/tasks/parse?fragment=1", auth=("ops", users["ops"]), timeout=10
        )
        assert 'class="result"' not in running.text
    for given, everyone_sees in ((("*",), True), (("none",), False)):
        (tmp_path / given[0]).mkdir()
        with served(tmp_path / given[0], users=users, result_users=given) as web:
            stored_tree(
                web.writer, "night-1", CHAIN[:1], {"fetch": S.DONE}, fetch={"result": "planted-result-value"}
            )
            for login in users:
                fragment = seen_by(web, login)["/trees/night-1/tasks/fetch?fragment=1"]
                assert ("planted-result-value" in fragment) is everyone_sees, (given, login)


def test_argument_values_are_shown_in_a_tasks_details_to_the_logins_allowed_with_secrets_masked(
    tmp_path: Path,
) -> None:
    secret = "planted-vault-secret-9f3a2c"  # a secret value this process resolved: always masked
    args = {"value": "planted-argument-value", "token": "${vault:API_TOKEN}", "header": f"Bearer {secret}"}
    masking.remember(secret)
    try:
        with served(tmp_path, users=LOGINS, argument_users=("ops",)) as web:
            stored_tree(
                web.writer, "night-1", [{"id": "fetch", "tool": "echo", "args": args}], {"fetch": S.DONE}
            )
            for path, text in _seen_by(web, "viewer").items():
                assert "planted-argument-value" not in text and "API_TOKEN" not in text, path
            assert "<code>web_argument_users</code>" in _seen_by(web, "viewer")["/trees/night-1/tasks/fetch"]
            shown = _seen_by(web, "ops")
            for path in ("/trees/night-1/tasks/fetch", "/trees/night-1/tasks/fetch?fragment=1"):
                given = re.search(r'<pre class="args">(.*?)</pre>', shown[path], re.DOTALL)
                assert given is not None, path
                assert json.loads(html.unescape(given.group(1))) == {
                    "value": "planted-argument-value",
                    "token": "${vault:API_TOKEN}",  # the reference, never resolved here
                    "header": "Bearer ***",
                }
            # Only in a task's details: not on the tree's pages nor in its events.
            for path in ("/trees", "/trees/night-1", "events"):
                assert "planted-argument-value" not in shown[path], path
            assert not any(secret in text for text in shown.values())
        for given_logins, everyone_sees in ((("*",), True), (("none",), False)):
            (tmp_path / given_logins[0]).mkdir()
            with served(tmp_path / given_logins[0], users=LOGINS, argument_users=given_logins) as web:
                stored_tree(web.writer, "night-1", CHAIN[:1], {"fetch": S.DONE})
                for login in LOGINS:
                    fragment = _seen_by(web, login)["/trees/night-1/tasks/fetch?fragment=1"]
                    assert ("planted-secret-value" in fragment) is everyone_sees, (given_logins, login)
    finally:
        masking.forget_all()


def test_a_tasks_details_link_each_of_its_celery_task_ids_to_flowers_task_page(tmp_path: Path) -> None:
    with served(tmp_path, flower_url="http://flower.example:5555/") as web:
        attempt = {
            "number": 1,
            "run_id": "run-1",
            "route": "server",
            "error": {"type": "Boom", "message": "no"},
        }
        stored_tree(
            web.writer,
            "night-1",
            CHAIN[:2],
            {"fetch": S.RUNNING},
            fetch={"run_id": "run-2", "attempt": 2, "attempts": [attempt]},
        )
        details = httpx2.get(web.url + "/trees/night-1/tasks/fetch?fragment=1", auth=AUTH, timeout=10).text
        links = re.findall(r'<a class="flower" href="([^"]+)">([^<]+)</a>', details)
        assert links == [
            ("http://flower.example:5555/task/run-1", "run-1"),
            ("http://flower.example:5555/task/run-2", "run-2"),
        ]
        assert "attempt 1 " in details and "current " in details
        # Never sent yet: no Celery task, no link.
        pending = httpx2.get(web.url + "/trees/night-1/tasks/parse?fragment=1", auth=AUTH, timeout=10).text
        assert 'class="flower"' not in pending


def test_a_trees_events_send_every_state_then_each_change_and_end_with_the_tree(tmp_path: Path) -> None:
    with served(tmp_path) as web:
        stored_tree(web.writer, "night-1", CHAIN[:2], {"fetch": S.RUNNING})
        seen: list[dict[str, object]] = []
        with httpx2.stream("GET", web.url + "/trees/night-1/events", auth=AUTH, timeout=30) as stream:
            assert stream.headers["content-type"].startswith("text/event-stream")
            for line in stream.iter_lines():
                if not line.startswith("data: "):
                    continue
                seen.append(json.loads(line[6:]))
                if len(seen) == 1:
                    web.writer.transition(
                        "night-1", "fetch", from_states=[S.RUNNING], state=S.DONE, finished_at=T0 + 7
                    )
                elif len(seen) == 2:
                    web.writer.transition("night-1", "parse", from_states=[S.PENDING], state=S.DONE)
                    web.writer.finish_tree("night-1", TreeStatus.DONE, 1.0)
                if seen[-1].get("final"):
                    break
        assert seen[0]["states"] == {"fetch": "running", "parse": "pending"}
        assert seen[1]["states"] == {"fetch": "done"}
        # The changed task's bar (first queued, started, finished) for the timeline, and now.
        assert seen[0]["times"] == {} and isinstance(seen[1]["now"], float)
        assert seen[1]["times"] == {"fetch": [T0, T0 + 0.5, T0 + 7]}
        assert seen[-1]["states"] in ({"parse": "done"}, {}) and seen[-1]["status"] == "done"


@pytest.mark.parametrize("given", ["ops", "ops:", ":pw", ""])
def test_malformed_credentials_are_refused(given: str) -> None:
    from brain.stack.webauth import BASIC_AUTH_VARIABLE, WebUnprotected, decide_web_access

    with pytest.raises(WebUnprotected, match=BASIC_AUTH_VARIABLE):
        decide_web_access("127.0.0.1", {BASIC_AUTH_VARIABLE: given}, Path("/nonexistent/web.secret"))


def test_the_vendored_layout_library_is_served_behind_the_password_and_nothing_else_under_static(
    tmp_path: Path,
) -> None:
    with served(tmp_path) as web:
        stored_tree(web.writer, "night-1", CHAIN)
        page = httpx2.get(web.url + "/trees/night-1", auth=AUTH, timeout=10)
        assert '<script src="/static/vendor/dagre.min.js"></script>' in page.text
        assert "script-src 'self' 'nonce-" in page.headers["content-security-policy"]
        url = web.url + "/static/vendor/dagre.min.js"
        assert httpx2.get(url, timeout=10).status_code == 401
        library = httpx2.get(url, auth=AUTH, timeout=10)
        assert library.status_code == 200 and library.headers["content-type"].startswith("text/javascript")
        assert "dagre" in library.text[:200]
        for other in ("dagre.LICENSE", "README.md", "..%2Fapp.py", "%2E%2E%2F%2E%2E%2Fapp.py"):
            assert httpx2.get(web.url + "/static/vendor/" + other, auth=AUTH, timeout=10).status_code == 404
