"""Operators watching Flower see each client agent and its tasks, though agents send no events."""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from brain.core.models import SessionKind, TaskRecord, TaskState
from brain.flowerapp import EXIT_GRACE_S
from brain.runtime.events import RESTATE_RETRY_S
from brain.runtime.relay import Relay
from brain.runtime.service import Brain
from brain.stack.embedded import EmbeddedStack, flower_argv
from brain.stack.flowerauth import BASIC_AUTH_VARIABLE, FLOWER_SECRET_FILE, FLOWER_USER, flower_access
from brain.stack.redis_server import RedisServer, free_port
from tests.conftest import (
    CHROMIUM_FLAGS,
    EXAMPLES,
    FIXTURES,
    agent_with_servers,
    make_settings,
    tree,
    wait_for_tree,
    wait_until,
    write_mcp_config,
)
from tests.integration.test_parking import connect
from tests.integration.test_supervisor import running_up, up_log
from workers.call_stop import stopped_error
from workers.contracts import (
    KOMBU_UNACKED,
    ClientToolAwaiting,
    ClientToolResult,
    ClientToolStarted,
    ErrorInfo,
    ToolAwaiting,
    ToolProgress,
    ToolResult,
    ToolStarted,
    client_key,
    client_queue,
)

pytestmark = pytest.mark.integration


OPS = ("ops", "ops-password")  # the credentials the first test gives Flower


def get_json(url: str, auth: tuple[str, str] = OPS) -> Any:
    status, body = fetch(url, auth)
    return json.loads(body) if status == 200 else None


@contextmanager
def flower_with_laptop(tmp_path: Path, redis_server: RedisServer, brain: Brain) -> Iterator[int]:
    """Flower (its port) on ``redis_server``, listing client "laptop", connected to ``brain``
    (its session "s1"; the test speaks for its agent)."""
    port = free_port()
    # Flower runs as its own Redis user, as in the stack (brain.hot.acl.COMPONENT_RULES).
    flower_url = redis_server.url_for("vt-flower")
    env = {**os.environ, "VANCETOPE_REDIS_URL": flower_url, BASIC_AUTH_VARIABLE: ":".join(OPS)}
    with open(tmp_path / "flower.log", "w") as log:
        flower = subprocess.Popen(
            flower_argv(port),  # the stack's own command line
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        brain.scheduler.presence.enroll("laptop", "ada")
        connect(brain, "laptop")

        def agent_listed() -> bool:
            # Flower subscribes to events a moment after it starts: keep the heartbeats coming.
            brain.clients.sweep_heartbeats()
            page = get_json(f"http://127.0.0.1:{port}/workers?json=1") or {}
            return any(
                w.get("hostname") == "client-agent@laptop" and w.get("status") for w in page.get("data", [])
            )

        wait_until(agent_listed, timeout=120, what="Flower's worker list to show client-agent@laptop")
        yield port
    finally:
        flower.terminate()
        flower.wait(20)


def test_flower_lists_the_client_agent_and_the_tasks_routed_to_it(
    tmp_path: Path, redis_server: RedisServer, brain_on_redis: Brain
) -> None:
    brain = brain_on_redis
    with flower_with_laptop(tmp_path, redis_server, brain) as port:
        base = f"http://127.0.0.1:{port}/api"
        rec = brain.scheduler.submit(
            tree({"id": "fl", "tasks": [{"id": "read", "tool": "read_local_file", "args": {"path": "a"}}]}),
            session=SessionKind.INTERACTIVE,
            client_id="laptop",
        )
        task = brain.store.get_task(rec.tree_id, "read")
        # Progress from the client's MCP server, as the relay hands it on: PROGRESS in Flower.
        update = ToolProgress(
            run_id=task.run_id, tree_id=rec.tree_id, task_id="read", progress=1, total=2, at=time.time(),
            client_id="laptop",
        )  # fmt: skip
        assert brain.intake.on_progress(update, from_client="laptop")
        brain.scheduler.events.task_progress(update)
        wait_until(
            lambda: (get_json(f"{base}/tasks") or {}).get(task.run_id, {}).get("state") == "PROGRESS",
            timeout=120,
            what="Flower to show the client's task in progress",
        )
        assert brain.store.get_task(rec.tree_id, "read").progress.total == 2
        brain.intake.on_result(
            ToolResult(
                run_id=task.run_id,
                tree_id=rec.tree_id,
                task_id="read",
                tool="read_local_file",
                ok=True,
                value="x",
                client_id="laptop",
                started_at=time.time() - 0.1,
                finished_at=time.time(),
            ),
            from_client="laptop",
        )
        wait_until(
            lambda: (get_json(f"{base}/tasks") or {}).get(task.run_id, {}).get("state") == "SUCCESS",
            timeout=120,
            what="Flower to show the client's task as succeeded",
        )
        tasks = get_json(f"{base}/tasks") or {}
        assert tasks[task.run_id]["state"] == "SUCCESS"
        assert tasks[task.run_id]["worker"] == "client-agent@laptop"


def laptop_begins(brain: Brain, port: int, name: str) -> TaskRecord:
    """A tree ``name`` of one client call, task "read", sent to the laptop, whose agent (the
    test speaks for it) reserves it (kombu keeps its message in the unacked hash) and says it
    began it, until Flower shows it STARTED; the task as it was sent."""
    rec = brain.scheduler.submit(
        tree({"id": name, "tasks": [{"id": "read", "tool": "read_local_file", "args": {"path": "a"}}]}),
        session=SessionKind.INTERACTIVE,
        client_id="laptop",
    )
    task = brain.store.get_task(rec.tree_id, "read")
    assert task is not None and task.run_id
    raw = brain.hot.r.rpop(client_key("laptop", client_queue("laptop")))
    assert raw is not None and json.loads(raw)["headers"]["id"] == task.run_id
    entry = json.dumps([json.loads(raw), "", client_queue("laptop")])
    brain.hot.r.hset(client_key("laptop", KOMBU_UNACKED), "tag1", entry)
    started = ToolStarted(run_id=task.run_id, tree_id=rec.tree_id, task_id="read", started_at=time.time(),
                          client_id="laptop")  # fmt: skip
    Relay(brain.intake, brain.clients).handle(
        "laptop", ClientToolStarted(client_id="laptop", started=started).model_dump_json().encode()
    )
    wait_until(
        lambda: shown_as(port, task.run_id, "STARTED"), timeout=120, what="Flower to show the call STARTED"
    )
    return task


def shown_as(port: int, run_id: str, state: str) -> dict[str, Any] | None:
    """The task of ``run_id`` as Flower's API shows it, if in ``state``."""
    seen = (get_json(f"http://127.0.0.1:{port}/api/tasks") or {}).get(run_id, {})
    return dict(seen) if seen.get("state") == state else None


def test_flower_shows_a_call_taken_back_from_an_agent_that_began_it_failed_by_worker_lost(
    tmp_path: Path, redis_server: RedisServer, brain_on_redis: Brain
) -> None:
    """Issue 26: the agent took the call, said it started, and went away; the brain takes it
    back and runs it again as a new run. The old run ends FAILURE (WorkerLostError), as Celery
    shows a task whose worker died, under the agent that began it; before, STARTED for ever."""
    brain = brain_on_redis
    with flower_with_laptop(tmp_path, redis_server, brain) as port:
        task = laptop_begins(brain, port, "lost")
        assert brain.clients.on_disconnected("laptop", "s1", "missed heartbeat") == 1
        # Taken back: it waits for a client to run it again, as a new run.
        assert brain.store.get_task(task.tree_id, "read").taken_back == 1
        failed = wait_until(
            lambda: shown_as(port, task.run_id, "FAILURE"),
            timeout=120,
            what="Flower to show the old run FAILURE",
        )
        assert failed["exception"].startswith("WorkerLostError('client agent laptop went away mid-call")
        assert failed["worker"] == "client-agent@laptop"


def test_flower_stops_on_sigterm_even_when_its_redis_is_gone(tmp_path: Path) -> None:
    """Seen every time before brain.flowerapp's exit timer: with Redis stopped first (or gone
    with a killed stack), Flower ignored SIGTERM for good - its exit waits on a thread that
    retries the broker without end."""
    server = RedisServer(tmp_path / "redis").start()
    log_path = tmp_path / "flower.log"
    env = {
        **os.environ,
        "VANCETOPE_REDIS_URL": server.url_for("vt-flower"),
        BASIC_AUTH_VARIABLE: ":".join(OPS),
    }
    # Flower's enable_events timer broadcasts on the control ("pidbox") exchange: a message
    # on a Redis channel, watched here with the admin's own connection.
    watcher = redis.Redis.from_url(server.url)
    broadcasts = watcher.pubsub(ignore_subscribe_messages=True)
    broadcasts.psubscribe("*pidbox*")
    with open(log_path, "w") as log:
        flower = subprocess.Popen(flower_argv(free_port()), env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: "Visit me at" in log_path.read_text(), timeout=120, what="Flower to start")
        # Flower's enable_events timer (every 5 s) fires once with Redis up, so its broker
        # connection is pooled: its next broadcast, with Redis gone, retries it for ever.

        def enable_events_broadcast() -> bool:
            message = broadcasts.get_message(timeout=0.5)
            if message is None:
                return False
            body = json.loads(message["data"])["body"]  # kombu's envelope: a base64 body
            return "enable_events" in base64.b64decode(body).decode()

        wait_until(
            enable_events_broadcast,
            timeout=120,
            what="Flower's enable_events timer to broadcast once with Redis up",
        )
        broadcasts.close()
        watcher.close()
        server.stop()
        # Twice: by then the timer has fired with Redis gone.
        wait_until(
            lambda: log_path.read_text().count("Failed to capture events") >= 2,
            timeout=120,
            what="Flower to lose Redis",
        )
        flower.terminate()
        assert flower.wait(EXIT_GRACE_S + 15) == 0, log_path.read_text()[-2000:]
    finally:
        if flower.poll() is None:
            flower.kill()
            flower.wait(10)
        server.stop()


# --- Flower as `vancetope up --flower-address` runs it: a real stack, a real client agent ---------

PLANTED = "planted-3c1f9e-value"  # an argument value that must never reach Flower
SLEEP_1_PER_S = '  - name: sleep\n    location: server\n    rate_limit: "1/s"\n'


def fetch(url: str, auth: tuple[str, str] | None = None, host: str | None = None) -> tuple[int, bytes]:
    """(status, body) of a GET, with HTTP basic auth when ``auth`` is given and ``host`` in the
    Host header when given (as a browser sends a name rebound to 127.0.0.1); status 0 when
    nothing answers."""
    request = urllib.request.Request(url, headers={"Host": host} if host else {})
    if auth is not None:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except OSError:  # not listening yet
        return 0, b""


@dataclass
class FlowerStack:
    stack: EmbeddedStack
    brain: Brain
    url: str  # Flower listening on 0.0.0.0, reached through 127.0.0.1
    auth: tuple[str, str]
    tree_id: str


@pytest.fixture(scope="module")
def flower_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FlowerStack]:
    """The whole stack (the default pool and pool "night", MCP server "rich" on the server) with
    client agent "laptop" connected, Flower on 0.0.0.0 with its generated
    password, and a finished tree whose server and client tasks got ``PLANTED`` as arguments
    (one of them from an upstream result, resolved on the way to the client). Tool ``sleep``
    has ``rate_limit: "1/s"`` (the example registry's tools besides)."""
    tmp_path = tmp_path_factory.mktemp("flower")
    agent = agent_with_servers(tmp_path, {})
    (tmp_path / "sandbox" / f"{PLANTED}.txt").write_text("notes\n")
    limited = (EXAMPLES / "registry.yaml").read_text().replace("tools:\n", f"tools:\n{SLEEP_1_PER_S}", 1)
    (tmp_path / "registry.yaml").write_text(limited)
    settings = make_settings(
        tmp_path,
        registry=tmp_path / "registry.yaml",
        agent_config=agent,
        # burst: an MCP tool that reports progress (tests/fixtures/mcp_rich_server.py)
        mcp_config=write_mcp_config(
            tmp_path / "m.json",
            {"rich": {"command": sys.executable, "args": [str(FIXTURES / "mcp_rich_server.py")]}},
        ),
        pools=[{"name": "night", "concurrency": 1}],  # a named pool beside the default one
    )
    stack = EmbeddedStack(settings)
    stack.start()
    brain = Brain.connect(settings, stack.redis_url)
    try:
        port = free_port()
        # The generated password, whatever this shell's FLOWER_BASIC_AUTH says.
        stack.start_flower(port, flower_access("0.0.0.0", settings.data_dir, env={}))
        password = (settings.data_dir / FLOWER_SECRET_FILE).read_text().strip()
        url, auth = f"http://127.0.0.1:{port}", (FLOWER_USER, password)

        def agent_listed() -> bool:
            # Flower subscribes to events a moment after it answers: wait until it has heard the
            # brain's heartbeats for the agent, so it sees every task event of the tree.
            page = json.loads(fetch(f"{url}/workers?json=1", auth)[1] or b"{}")
            return any(w.get("hostname") == "client-agent@laptop" for w in page.get("data", []))

        wait_until(agent_listed, timeout=120, what="Flower to list client-agent@laptop")
        rec = brain.scheduler.submit(
            tree(
                {
                    "id": "flower-args",
                    "tasks": [
                        {"id": "on_server", "tool": "echo", "args": {"value": PLANTED}},
                        {"id": "on_night", "tool": "echo", "pool": "night", "args": {"value": PLANTED}},
                        {"id": "on_client", "tool": "read_local_file", "args": {"path": f"{PLANTED}.txt"}},
                        {
                            "id": "from_upstream",
                            "tool": "write_local_file",
                            "depends_on": ["on_server"],
                            "args": {"path": "out.txt", "content": "${tasks.on_server.result}"},
                        },
                    ],
                }
            ),
            session=SessionKind.INTERACTIVE,
            client_id="laptop",
        )
        done = wait_for_tree(brain, rec.tree_id, timeout=120)
        assert done.status.value == "done", {t.task_id: t.state for t in brain.store.get_tasks(rec.tree_id)}
        yield FlowerStack(stack, brain, url, auth, rec.tree_id)
    finally:
        brain.close()
        stack.stop()


def run_ids(fs: FlowerStack) -> set[str]:
    return {t.run_id for t in fs.brain.store.get_tasks(fs.tree_id) if t.run_id}


def test_flower_beyond_loopback_asks_for_the_generated_password_on_the_dashboard_and_the_api(
    flower_stack: FlowerStack,
) -> None:
    fs = flower_stack
    secret = fs.stack.settings.data_dir / FLOWER_SECRET_FILE
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    for path in ("/", "/tasks", "/api/workers", "/api/tasks"):
        assert fetch(fs.url + path)[0] == 401, f"{path} without credentials"
        assert fetch(fs.url + path, (FLOWER_USER, "wrong"))[0] == 401, f"{path} with a wrong password"
        assert fetch(fs.url + path, fs.auth)[0] == 200, f"{path} with the password"
    flower_log = fs.stack.service("flower").log_path
    assert flower_log is not None and fs.auth[1] not in flower_log.read_text()


def test_flower_api_workers_lists_the_server_pools_and_the_client_agent(flower_stack: FlowerStack) -> None:
    fs = flower_stack

    def both_listed() -> dict[str, Any] | None:
        workers = json.loads(fetch(f"{fs.url}/api/workers", fs.auth)[1])
        names = set(workers)
        # Flower lists a pool from its first inspect broadcast, which it sends as it starts and
        # which may still be out when the first request comes: wait for the pools' answers.
        pools = any(n.startswith("server@") and "stats" in workers[n] for n in names) and any(
            n.startswith("server-night@") and "stats" in workers[n] for n in names
        )
        if "client-agent@laptop" in names and pools:
            return dict(workers)
        return None

    workers = wait_until(
        both_listed, timeout=120, what="/api/workers to list server@…, server-night@… and client-agent@laptop"
    )
    agent = workers["client-agent@laptop"]
    assert agent["source"] == "events" and agent["status"] is True
    assert agent["sw_ident"] == "vancetope-agent"
    server = next(v for k, v in workers.items() if k.startswith("server@"))
    assert "stats" in server and "source" not in server  # answered inspect: as Flower lists it
    one = json.loads(fetch(f"{fs.url}/api/workers?workername=client-agent@laptop", fs.auth)[1])
    assert one["client-agent@laptop"]["source"] == "events"
    status = json.loads(fetch(f"{fs.url}/api/workers?status=1", fs.auth)[1])
    assert status["client-agent@laptop"] is True


def test_flower_shows_tool_and_argument_names_never_argument_values(flower_stack: FlowerStack) -> None:
    fs = flower_stack
    runs = run_ids(fs)

    def all_finished() -> dict[str, Any] | None:
        tasks = json.loads(fetch(f"{fs.url}/api/tasks", fs.auth)[1])
        mine = {k: v for k, v in tasks.items() if k in runs}
        return mine if len(mine) == 4 and all(v["state"] == "SUCCESS" for v in mine.values()) else None

    tasks = wait_until(all_finished, timeout=120, what="Flower to show the tree's four tasks as succeeded")
    shown = json.dumps(tasks)
    assert PLANTED not in shown
    args = sorted(str(t["args"]) for t in tasks.values())
    assert any("echo(value)" in a for a in args), args
    assert any("write_local_file(content, path)" in a for a in args), args
    assert any("read_local_file(path)" in a for a in args), args
    query = "draw=1&start=0&length=50&order[0][column]=0&columns[0][data]=received&order[0][dir]=desc"
    page = fetch(f"{fs.url}/tasks/datatable?{query}", fs.auth)[1].decode()
    assert "echo(value)" in page and PLANTED not in page  # what the tasks page shows


def test_up_with_a_flower_address_beyond_loopback_prints_the_user_and_the_password_file_only(
    tmp_path: Path,
) -> None:
    port = free_port()
    with running_up(tmp_path, "--no-agent", "--flower-address", "0.0.0.0", "--flower-port", str(port)):
        secret = tmp_path / "data" / FLOWER_SECRET_FILE
        line = f"flower: http://0.0.0.0:{port} (user {FLOWER_USER}, password in {secret})"
        wait_until(lambda: line in up_log(tmp_path), timeout=120, what=f"`vancetope up` to print {line!r}")
        password = secret.read_text().strip()
        assert password not in (tmp_path / "up.log").read_text()
        url = f"http://127.0.0.1:{port}/api/workers"
        wait_until(
            lambda: fetch(url)[0] == 401, timeout=120, what="Flower to refuse a caller without password"
        )
        assert fetch(url, (FLOWER_USER, password))[0] == 200
        # Its navigation bar links the web view `up` serves beside it (conftest gives it a port).
        status, page = fetch(f"http://127.0.0.1:{port}/tasks", (FLOWER_USER, password))
        web = f'id="vancetope-web" href="http://127.0.0.1:{os.environ["VANCETOPE_WEB_PORT"]}/trees"'
        assert status == 200 and web in page.decode()


def test_up_refuses_malformed_flower_credentials_before_starting_anything(tmp_path: Path) -> None:
    env = {BASIC_AUTH_VARIABLE: "ops"}
    with running_up(tmp_path, "--no-agent", "--flower-address", "0.0.0.0", env=env) as up:
        assert up.wait(60) == 2
    assert f"{BASIC_AUTH_VARIABLE} must be user:password" in up_log(tmp_path)
    assert not (tmp_path / "data" / "stack.json").exists()


def browse(chromium: str, profile: Path, url: str, *extra: str) -> str:
    """What headless Chromium shows at ``url`` after its scripts ran (the DOM), with ``extra``
    flags (a screenshot). Its own profile, nothing fetched but ``url`` and what it loads."""
    proc = subprocess.run(
        [
            chromium,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={profile}",
            # Flower fills its tables from its API once the page loaded: let those calls finish.
            "--virtual-time-budget=5000",
            *extra,
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return proc.stdout


def test_flower_dashboard_in_chromium_shows_the_server_pool_the_client_agent_and_the_tool_tasks(
    chromium: str, flower_stack: FlowerStack, tmp_path: Path
) -> None:  # chromium first: a skip comes before the stack starts
    fs = flower_stack
    # The operator's path: the password Flower asks for, given as URL credentials.
    url = fs.url.replace("http://", f"http://{fs.auth[0]}:{fs.auth[1]}@")
    workers = browse(chromium, tmp_path / "profile", url + "/", "--dump-dom")
    assert "client-agent@laptop" in workers
    assert "server@" in workers and "server-night@" in workers
    tasks = browse(chromium, tmp_path / "profile", url + "/tasks", "--dump-dom")
    for shown in (
        "echo(value)",
        "read_local_file(path)",
        "write_local_file(content, path)",
        "client-agent@laptop",
    ):
        assert shown in tasks, f"the tasks page shows {shown}"
    assert PLANTED not in tasks
    shot = tmp_path / "flower-dashboard.png"
    browse(chromium, tmp_path / "profile", url + "/", f"--screenshot={shot}", "--window-size=1400,900")
    assert shot.read_bytes().startswith(b"\x89PNG")
    assert "Access denied" not in workers + tasks


@pytest.mark.parametrize(
    "where, failing",
    [
        ("client", {"tool": "read_local_file", "args": {"path": f"no-{PLANTED}"}}),
        # A server pool's task: Celery's own events say FAILURE (before, the task returned
        # ok: false and Flower showed SUCCESS for a tool that failed).
        ("server", {"tool": "json_transform", "args": {"data": {"a": 1}, "pick": PLANTED}}),
    ],
)
def test_flower_shows_a_failed_task_by_its_error_type_not_its_message(
    flower_stack: FlowerStack, where: str, failing: dict[str, Any]
) -> None:
    fs = flower_stack
    rec = fs.brain.scheduler.submit(
        tree({"id": f"flower-fail-{where}", "tasks": [{"id": "fails", **failing}]}),
        session=SessionKind.INTERACTIVE,
        client_id="laptop",
    )
    wait_for_tree(fs.brain, rec.tree_id, timeout=120)
    task = fs.brain.store.get_task(rec.tree_id, "fails")
    assert task is not None and task.error is not None and task.state.value == "failed"
    assert (task.client_id is None) is (where == "server")
    assert PLANTED in task.error.message  # the store keeps the whole message

    def failed() -> dict[str, Any] | None:
        shown = json.loads(fetch(f"{fs.url}/api/tasks", fs.auth)[1]).get(task.run_id, {})
        return dict(shown) if shown.get("state") in ("FAILURE", "SUCCESS") else None

    shown = wait_until(failed, timeout=120, what=f"Flower to show the {where} task as finished")
    assert shown["state"] == "FAILURE", shown
    assert f"{task.error.type} (the message: vancetope status {rec.tree_id})" in shown["exception"]
    assert PLANTED not in json.dumps(shown)


@pytest.mark.parametrize(
    "where, failing",
    [
        ("client", {"tool": "read_local_file", "args": {"path": f"no-{PLANTED}"}}),
        ("server", {"tool": "json_transform", "args": {"data": {"a": 1}, "pick": PLANTED}}),
    ],
)
def test_flower_shows_an_attempt_that_will_be_tried_again_as_retry(
    flower_stack: FlowerStack, where: str, failing: dict[str, Any]
) -> None:
    """Issue 23: a failed attempt its retry policy covers is RETRY in Flower, not FAILURE.
    Issue 26: its task cancelled while it waits for its next attempt (a new run), it shows
    REVOKED, not RETRY for ever; a client's RETRY said again later does not bring it back."""
    fs = flower_stack
    retry = {"max_attempts": 2, "backoff_s": 600, "jitter": False, "on": ["tool_error"]}
    rec = fs.brain.scheduler.submit(
        tree({"id": f"flower-retry-{where}", "tasks": [{"id": "fails", "retry": retry, **failing}]}),
        session=SessionKind.INTERACTIVE,
        client_id="laptop",
    )
    try:
        task = wait_until(
            lambda: (
                (t := fs.brain.store.get_task(rec.tree_id, "fails")) and t.state.value == "retrying" and t
            ),
            60,
            "the attempt to fail and wait for its retry",
        )
        run_id = task.attempts[0].run_id

        def shown(state: str) -> dict[str, Any] | None:
            seen = json.loads(fetch(f"{fs.url}/api/tasks", fs.auth)[1]).get(run_id, {})
            return dict(seen) if seen.get("state") == state else None

        retried = wait_until(
            lambda: shown("RETRY"), timeout=120, what=f"Flower to show the {where} attempt as RETRY"
        )
        assert PLANTED not in json.dumps(retried)
    finally:
        assert fs.brain.sweeps.cancel(rec.tree_id) == ["fails"]
    wait_until(
        lambda: shown("REVOKED"), timeout=120, what=f"Flower to show the cancelled {where} attempt REVOKED"
    )
    time.sleep(RESTATE_RETRY_S + 1)  # a client's RETRY is said again this long after it failed
    assert shown("REVOKED"), json.loads(fetch(f"{fs.url}/api/tasks", fs.auth)[1]).get(run_id)


def test_flower_shows_a_call_waiting_at_the_gate_as_throttled_by_its_limit(flower_stack: FlowerStack) -> None:
    """Issue 26: a call over its tool's rate limit waits at the gate; Flower shows it THROTTLED
    with the limit (``throttled_by``), then the pool's events replace it: all SUCCESS."""
    fs = flower_stack
    calls = 8  # admitted one a second: the last waits ~7 s, shown THROTTLED for most of them
    rec = fs.brain.scheduler.submit(
        tree(
            {
                "id": "flower-throttled",
                "tasks": [{"id": f"t{i}", "tool": "sleep", "args": {"seconds": 0.1}} for i in range(calls)],
            }
        ),
        session=SessionKind.AUTONOMOUS,
    )

    def tasks_shown() -> dict[str, dict[str, Any]]:
        runs = {t.run_id for t in fs.brain.store.get_tasks(rec.tree_id) if t.run_id}
        tasks = json.loads(fetch(f"{fs.url}/api/tasks", fs.auth)[1])
        return {k: v for k, v in tasks.items() if k in runs}

    def one_throttled() -> dict[str, Any] | None:
        return next((t for t in tasks_shown().values() if t["state"] == "THROTTLED"), None)

    waiting = wait_until(one_throttled, timeout=120, what="Flower to show a call at the gate as THROTTLED")
    assert waiting["throttled_by"] == "rate_limit 1/s of tool sleep"
    assert waiting.get("worker") is None  # the brain sent it: no worker of its own in Flower

    def all_succeeded() -> dict[str, dict[str, Any]] | None:
        shown = tasks_shown()
        return shown if len(shown) == calls and all(t["state"] == "SUCCESS" for t in shown.values()) else None

    done = wait_until(all_succeeded, timeout=120, what="Flower to show every call as SUCCESS")
    # What a call waited on stays among its fields; the first went at once and waited on nothing.
    reasons = [t["throttled_by"] for t in done.values()]
    assert reasons.count("rate_limit 1/s of tool sleep") >= 2, reasons
    assert reasons.count(None) >= 1, reasons
    workers = json.loads(fetch(f"{fs.url}/api/workers", fs.auth)[1])
    # The brain sends its task events under Celery's anonymous node name (gen<pid>@host).
    assert not any(name.startswith("gen") for name in workers), sorted(workers)


def test_flower_shows_the_calls_of_a_cancelled_tree_revoked_not_throttled_for_ever(
    flower_stack: FlowerStack,
) -> None:
    """A tree cancelled while its calls wait at the gate: Flower shows each REVOKED (the brain
    sends Celery's ``task-revoked``), or SUCCESS for one that ran; none left THROTTLED or sent."""
    fs = flower_stack
    calls = 8  # admitted one a second: most are still at the gate when the tree is cancelled
    rec = fs.brain.scheduler.submit(
        tree(
            {
                "id": "flower-revoked",
                "tasks": [{"id": f"t{i}", "tool": "sleep", "args": {"seconds": 0.1}} for i in range(calls)],
            }
        ),
        session=SessionKind.AUTONOMOUS,
    )
    runs = {t.run_id for t in fs.brain.store.get_tasks(rec.tree_id) if t.run_id}
    assert len(runs) == calls

    def tasks_shown() -> dict[str, dict[str, Any]]:
        tasks = json.loads(fetch(f"{fs.url}/api/tasks", fs.auth)[1])
        return {k: v for k, v in tasks.items() if k in runs}

    wait_until(
        lambda: any(t["state"] == "THROTTLED" for t in tasks_shown().values()),
        timeout=120,
        what="Flower to show a call at the gate as THROTTLED",
    )
    fs.brain.sweeps.cancel(rec.tree_id)

    def all_ended() -> dict[str, dict[str, Any]] | None:
        shown = tasks_shown()
        ended = len(shown) == calls and all(t["state"] in ("REVOKED", "SUCCESS") for t in shown.values())
        return shown if ended else None

    try:
        shown = wait_until(all_ended, timeout=120, what="Flower to show every call REVOKED or SUCCESS")
    except AssertionError:
        raise AssertionError(sorted(t["state"] for t in tasks_shown().values())) from None
    revoked = [t for t in shown.values() if t["state"] == "REVOKED"]
    assert revoked, sorted(t["state"] for t in shown.values())
    for task in revoked:
        assert task.get("worker") is None  # the brain revoked it: no worker of its own
        assert task["throttled_by"] in ("rate_limit 1/s of tool sleep", None)
    states = {t.task_id: t.state.value for t in fs.brain.store.get_tasks(rec.tree_id)}
    assert set(states.values()) <= {"skipped", "done"}, states
    workers = json.loads(fetch(f"{fs.url}/api/workers", fs.auth)[1])
    assert not any(name.startswith("gen") for name in workers), sorted(workers)


def test_flower_shows_a_server_call_running_when_its_tree_was_cancelled_as_its_worker_stopped_it(
    flower_stack: FlowerStack,
) -> None:
    """Issue 26: a call already running when its tree is cancelled is stopped by its pool worker
    (``workers.call_stop``), and Flower shows it REVOKED, ``terminated``, as Celery shows a task
    it terminated; its result is refused (the task stays skipped). Before the stop, the call ran
    to its end and showed SUCCESS; then FAILURE ``Cancelled``, which paged whoever alerts on
    failures for a user's cancel. The call is an MCP tool that reports progress first: Flower
    shows PROGRESS (never, before: the event left the MCP loop's thread with no task id), and
    REVOKED replaces it (Celery ranks a state it does not know above REVOKED)."""
    fs = flower_stack
    burst = {"steps": [10, 20, 30], "total": 100, "then_s": 300}
    rec = fs.brain.scheduler.submit(
        tree(
            {
                "id": "flower-cancel-running",
                "tasks": [{"id": "b", "tool": "burst", "args": burst, "timeout_s": 600}],
            }
        ),
        session=SessionKind.AUTONOMOUS,
    )
    running = wait_until(
        lambda: (t := fs.brain.store.get_task(rec.tree_id, "b")) and t.state.value == "running" and t,
        60,
        "the call to start on its pool",
    )

    def shown() -> dict[str, Any]:
        return dict(json.loads(fetch(f"{fs.url}/api/tasks", fs.auth)[1]).get(running.run_id, {}))

    wait_until(
        lambda: shown().get("state") == "PROGRESS", timeout=120, what="Flower to show the call's progress"
    )
    assert fs.brain.sweeps.cancel(rec.tree_id) == ["b"]

    ended = wait_until(
        lambda: (seen := shown()).get("state") in ("SUCCESS", "FAILURE", "REVOKED") and seen,
        timeout=120,
        what="Flower to show the cancelled running call ended",
    )
    assert (ended["state"], ended["terminated"]) == ("REVOKED", True), ended
    assert ended["worker"].startswith("server@")
    assert fs.brain.store.get_task(rec.tree_id, "b").state.value == "skipped"  # its result refused


@pytest.mark.parametrize("held", ["running", "stopped", "awaiting approval"])
def test_flower_shows_a_client_call_running_when_its_tree_was_cancelled_as_its_agent_ended_it(
    tmp_path: Path, redis_server: RedisServer, brain_on_redis: Brain, held: str
) -> None:
    """Issue 26: a client's call running when its tree is cancelled has its result refused (the
    task stays skipped); Flower shows how the agent said the call ended, as a pool worker's own
    events show a server call's. Before, STARTED for ever: the brain speaks for the agent, and
    said nothing of a result it refused. A call that ended before the agent's stop check saw the
    cancel: SUCCESS. One the agent stopped (``workers.call_stop``), or ended unrun while it was
    held for approval (both ``Cancelled``): REVOKED, as the pool shows a call it stopped (before:
    FAILURE; before that, AWAITING_APPROVAL for ever)."""
    brain = brain_on_redis
    with flower_with_laptop(tmp_path, redis_server, brain) as port:
        task = laptop_begins(brain, port, "ran")
        relay = Relay(brain.intake, brain.clients)
        now = time.time()
        if held == "awaiting approval":
            awaiting = ToolAwaiting(run_id=task.run_id, tree_id=task.tree_id, task_id="read", waiting=True,
                                    approval_id="a1", at=now, client_id="laptop")  # fmt: skip
            relay.handle(
                "laptop", ClientToolAwaiting(client_id="laptop", awaiting=awaiting).model_dump_json().encode()
            )
            wait_until(
                lambda: shown_as(port, task.run_id, "AWAITING_APPROVAL"), timeout=120, what="the call held"
            )
        assert brain.sweeps.cancel(task.tree_id) == ["read"]
        ended = (
            {"ok": True, "value": "x"}
            if held == "running"
            else {
                "ok": False,
                "error": stopped_error("read_local_file").to_info()
                if held == "stopped"
                else ErrorInfo(type="Cancelled", message="cancelled while it awaited approval"),
            }
        )
        result = ToolResult(run_id=task.run_id, tree_id=task.tree_id, task_id="read", tool="read_local_file",
                            client_id="laptop", started_at=now, finished_at=time.time(), **ended)  # fmt: skip
        relay.handle("laptop", ClientToolResult(client_id="laptop", result=result).model_dump_json().encode())
        state = "SUCCESS" if held == "running" else "REVOKED"
        shown = wait_until(
            lambda: shown_as(port, task.run_id, state), timeout=120, what=f"Flower to show the call {state}"
        )
        assert shown["worker"] == "client-agent@laptop"
        assert shown["terminated"] is (None if held == "running" else True)
        assert brain.store.get_task(task.tree_id, "read").state is TaskState.SKIPPED  # its result refused
