"""The `vancetope` command as a user runs it: real subprocesses, real stack."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from brain.core.models import TaskState
from brain.runtime.service import Brain
from brain.stack.embedded import EmbeddedStack
from tests.conftest import EXAMPLES, ROOT, tree, wait_until

pytestmark = pytest.mark.integration


def vancetope(
    *args: str,
    data: Path,
    timeout: float = 120,
    env: dict[str, str] | None = None,
    cwd: Path = ROOT,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: PLW1510 - callers assert on returncode
        [sys.executable, "-m", "brain", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "VANCETOPE_DATA_DIR": str(data), "COLUMNS": "250", **(env or {})},
    )


def test_malformed_yaml_is_refused_with_its_line_and_column_before_anything_starts(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("id: t\ntasks:\n  - id: a\n    tool: echo\n   args: [unclosed\n")
    proc = vancetope("run", str(bad), data=tmp_path / "data")
    assert proc.returncode == 2
    assert f"error: {bad}: YAML syntax error at line" in proc.stderr
    assert not (tmp_path / "data" / "stack.json").exists()


@pytest.mark.parametrize("command", ["run", "explain"])
def test_a_billion_laughs_tree_exits_2_quickly_with_the_reason(tmp_path: Path, command: str) -> None:
    laughs = ROOT / "tests" / "fixtures" / "billion_laughs.yaml"
    assert laughs.stat().st_size < 1024  # a few hundred bytes that expand to 10^9 nodes
    proc = vancetope(command, str(laughs), data=tmp_path / "data", timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "YAML aliases expand the document beyond" in " ".join(proc.stderr.split())
    assert "Traceback" not in proc.stderr


def test_a_tree_file_over_max_tree_bytes_exits_2_before_anything_starts(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text("id: t\ntasks:\n  - id: a\n    tool: echo\n    args: {text: " + "x" * 2000 + "}\n")
    proc = vancetope("run", str(big), data=tmp_path / "data", env={"VANCETOPE_MAX_TREE_BYTES": "1000"})
    assert proc.returncode == 2, proc.stderr
    assert "larger than the limit of 1000 bytes" in " ".join(proc.stderr.split())
    assert not (tmp_path / "data" / "vancetope.db").exists()


def test_an_invalid_tree_is_refused_naming_the_task_and_the_problem(tmp_path: Path) -> None:
    cycle = tmp_path / "cycle.yaml"
    cycle.write_text(
        "id: t\ntasks:\n  - {id: a, tool: echo, depends_on: [b]}\n  - {id: b, tool: echo, depends_on: [a]}\n"
    )
    proc = vancetope("run", str(cycle), data=tmp_path / "data")
    assert proc.returncode == 2
    assert f"error: {cycle}: invalid task tree (1 problem(s)):" in proc.stderr
    assert "dependency cycle: a -> b -> a" in proc.stderr
    enum = tmp_path / "enum.yaml"
    enum.write_text("id: t\ntasks:\n  - {id: c, tool: echo, execution_target: sideways}\n")
    proc = vancetope("run", str(enum), data=tmp_path / "data")
    assert proc.returncode == 2
    assert "task 'c': execution_target: Input should be 'auto', 'server', 'client' or 'any'" in proc.stderr


def test_run_with_a_negative_timeout_exits_2_before_anything_starts(tmp_path: Path) -> None:
    proc = vancetope("run", str(EXAMPLES / "night-batch.yaml"), "--timeout", "-1", data=tmp_path / "data")
    assert proc.returncode == 2, proc.stdout + proc.stderr  # it used to stop watching at once (exit 4)
    assert "Invalid value for '--timeout': -1.0 is not in the range x>=0" in proc.stderr
    assert not (tmp_path / "data" / "stack.json").exists()


def test_run_with_an_invalid_client_id_exits_2_before_anything_starts(tmp_path: Path) -> None:
    proc = vancetope(
        "run", str(EXAMPLES / "offline-client.yaml"), "--client", "no/such", data=tmp_path / "data"
    )
    assert proc.returncode == 2, proc.stderr
    assert "--client: invalid client id 'no/such'" in " ".join(proc.stderr.split())
    assert not (tmp_path / "data" / "vancetope.db").exists()


def test_run_with_an_unenrolled_client_and_cancel_of_an_unknown_task_say_so(
    tmp_path: Path,
    stack_factory: Callable[..., EmbeddedStack],
    brain_factory: Callable[[EmbeddedStack], Brain],
) -> None:
    stack = stack_factory(services=("brain",), mcp_config=None)
    data = stack.settings.data_dir
    proc = vancetope(
        "run", str(EXAMPLES / "offline-client.yaml"), "--client", "ghost", data=data, timeout=120
    )
    assert proc.returncode == 2, proc.stderr
    assert "client 'ghost' is not enrolled" in " ".join(proc.stderr.split())
    brain = brain_factory(stack)
    assert brain.store.list_trees() == []  # refused before anything was stored

    rec = brain.scheduler.submit(
        tree({"id": "t", "tasks": [{"id": "a", "tool": "read_local_file", "args": {"path": "x"}}]}),
        user="ada",
    )
    proc = vancetope("cancel", rec.tree_id, "nope", data=data, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert f"tree '{rec.tree_id}' has no task 'nope'; its tasks: a" in " ".join(proc.stderr.split())
    assert brain.store.get_task(rec.tree_id, "a").state is TaskState.PENDING_CLIENT


def test_run_names_every_problem_of_a_tree_at_once_as_explain_does_with_did_you_mean(tmp_path: Path) -> None:
    """Issue 22 item 6: `run` reported one of two argument errors (explain both), and a tool-name
    typo was submitted and recorded as failed with no suggestion."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "id: bad\ntasks:\n"
        "  - {id: a, tool: text_transform, args: {op: upper}}\n"
        "  - {id: b, tool: get_current_time, args: {timezone: 5}}\n"
        "  - {id: c, tool: get_curent_time, args: {timezone: UTC}}\n"
    )
    for command in (("run", "--no-agent"), ("explain",)):
        proc = vancetope(*command, str(bad), data=tmp_path / "data")
        assert proc.returncode == 2, proc.stdout + proc.stderr
        said = " ".join(proc.stderr.split())
        assert "invalid task tree (3 problem(s))" in said, said
        assert "task 'a': args: 'text' is a required property" in said
        assert "task 'b': args.timezone: 5 is not of type 'string'" in said
        assert (
            "task 'c': tool 'get_curent_time' is unknown" in said
            and "did you mean `get_current_time`" in said
        )
    assert not (tmp_path / "data" / "stack.json").exists()


def test_against_a_running_stack_run_binds_to_its_client_and_refuses_a_typo_before_submit(
    tmp_path: Path,
    stack_factory: Callable[..., EmbeddedStack],
    brain_factory: Callable[[EmbeddedStack], Brain],
) -> None:
    """Issue 22 items 2 and 6: `run --client laptop2`, laptop2 offline and laptop (same user)
    connected, ran on laptop; a typo was accepted. Now the work waits for laptop2 alone, and
    `clients` says so; the typo is refused (exit 2) with "did you mean" and nothing is stored."""
    from tests.integration.test_parking import connect
    from workers.contracts import client_key, client_queue

    stack = stack_factory(services=("brain",))
    data = stack.settings.data_dir
    brain = brain_factory(stack)
    for cid in ("laptop", "laptop2"):
        brain.scheduler.presence.enroll(cid, "ada")
    connect(brain, "laptop")
    typo = tmp_path / "typo.yaml"
    typo.write_text("id: typo\ntasks:\n  - {id: now, tool: get_curent_time, args: {timezone: UTC}}\n")
    proc = vancetope("run", str(typo), data=data, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "did you mean `get_current_time`" in " ".join(proc.stderr.split())
    assert brain.store.list_trees() == []

    hello = tmp_path / "hello.yaml"
    hello.write_text("id: hello\ntasks:\n  - {id: read, tool: read_local_file, args: {path: hello.txt}}\n")
    run = vancetope("run", str(hello), "--client", "laptop2", "--timeout", "2", data=data, timeout=120)
    assert run.returncode == 4, run.stdout + run.stderr  # still waiting, not failed on laptop
    assert re.search(r"read .*blocked .*Waiting for Client for Tool: read_local_file", run.stdout), run.stdout
    (rec,) = brain.store.list_trees()
    assert rec.client_id == "laptop2" and rec.user == "ada"  # the client's own user
    assert brain.hot.r.llen(client_key("laptop", client_queue("laptop"))) == 0
    rows = {
        line.split("│")[1].strip(): line
        for line in vancetope("clients", data=data, timeout=120).stdout.splitlines()
        if line.count("│") > 4
    }
    assert rows["laptop2"].split("│")[7].strip() == "1", rows
    assert rows["laptop"].split("│")[7].strip() == "", rows  # nothing of it waits for laptop

    # explain answers with who is connected (issue 22 item 5): the routes run would take now.
    said = vancetope("explain", str(hello), "--user", "ada", data=data, timeout=120)
    assert said.returncode == 0, said.stdout + said.stderr
    assert re.search(r"read .*client:laptop", said.stdout), said.stdout
    assert "no client connected" not in said.stdout
    assert "clients connected: laptop (ada)" in " ".join(said.stdout.split())
    bound = vancetope("explain", str(hello), "--client", "laptop2", data=data, timeout=120)
    assert re.search(r"read .*blocked", bound.stdout), bound.stdout


def test_explain_fails_a_tool_whose_mcp_server_is_missing_and_resolves_the_vault_with_registry(
    tmp_path: Path,
) -> None:
    """Issue 22 item 5: a registry tool naming a missing MCP server was "valid" (exit 0) and
    then failed in `run`; with --registry a vault-using server was reported failed ("this
    process has no vault")."""
    from tests.conftest import demo_server, write_mcp_config

    data = tmp_path / "data"
    stored = subprocess.run(
        [sys.executable, "-m", "brain", "secrets", "set", "DEMO_SECRET"],
        check=False,
        cwd=ROOT,
        input="s3cret\n",
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "VANCETOPE_DATA_DIR": str(data)},
    )
    assert stored.returncode == 0, stored.stderr
    server = {**demo_server(), "env": {"DEMO_TOKEN": "${vault:DEMO_SECRET}"}}
    config = write_mcp_config(tmp_path / "mcp.json", {"vaulted": server})
    registry = tmp_path / "registry.yaml"
    registry.write_text("tools:\n  - {name: jira_search, location: server, mcp_server: jira}\n")
    tree_file = tmp_path / "t.yaml"
    tree_file.write_text(
        "id: t\ntasks:\n  - {id: j, tool: jira_search}\n  - {id: add, tool: vaulted.add, args: {a: 1, b: 2}}\n"
    )
    proc = vancetope(
        "--registry", str(registry), "--mcp-config", str(config), "explain", str(tree_file), data=data
    )
    said = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 1, said
    assert "no vault" not in said and "failed to start" not in said, said
    rows = {line.split("│")[1].strip(): line for line in proc.stdout.splitlines() if line.count("│") > 4}
    assert "server" in rows["add"]
    assert "fail" in rows["j"] and "will fail" in said
    assert "tool 'jira_search' names MCP server 'jira', which is not in the brain's mcpServers" in said


def test_explain_shows_each_route_and_why_without_running_anything(tmp_path: Path) -> None:
    proc = vancetope("explain", str(EXAMPLES / "night-batch.yaml"), data=tmp_path / "data")
    assert proc.returncode == 0, proc.stderr
    rows = {line.split("│")[1].strip(): line for line in proc.stdout.splitlines() if line.count("│") > 4}
    assert "server" in rows["utc_now"]
    assert "pending_client" in rows["notes"] and "Queued for Client: read_local_file" in rows["notes"]
    assert not (tmp_path / "data" / "stack.json").exists()


def test_explain_shows_each_server_tasks_priority_and_its_users_share(tmp_path: Path) -> None:
    """Issue 26: explain names the priority each task runs at (and where it comes from) and,
    with fair share on, the user's weight and max_in_flight_per_user; off, it says they apply not."""
    tree_file = tmp_path / "tree.yaml"
    tree_file.write_text(
        "id: t\npriority: low\ntasks:\n"
        "  - {id: batch, tool: echo, args: {value: 1}}\n"
        "  - {id: urgent, tool: echo, args: {value: 2}, priority: high}\n"
    )
    off = vancetope("explain", str(tree_file), data=tmp_path / "data")
    assert off.returncode == 0, off.stderr
    assert "task batch: priority low (2), set on the tree (or by its schedule)\n" in off.stdout
    assert "task urgent: priority high (8), set on the task\n" in off.stdout
    assert "Fair share is off (queue_window 0): priorities order nothing" in off.stdout

    fair = {
        "VANCETOPE_QUEUE_WINDOW": "32",
        "VANCETOPE_MAX_IN_FLIGHT_PER_USER": "200",
        "VANCETOPE_USERS": json.dumps({"ada": {"weight": 3}}),
    }
    on = vancetope("explain", str(tree_file), "--user", "ada", data=tmp_path / "data", env=fair)
    assert on.returncode == 0, on.stderr
    assert (
        "task urgent: priority high (8), set on the task; "
        "fair share of pool default as user ada: weight 3, queue_window 32\n"
    ) in on.stdout
    assert "task urgent: limits: max_in_flight_per_user 200 of user ada on pool default\n" in on.stdout
    assert "Fair share is off" not in on.stdout
    # A tree that names no priority: an autonomous run's default, and weight 1 for bob.
    tree_file.write_text("id: t\ntasks:\n  - {id: a, tool: echo, args: {value: 1}}\n")
    bob = vancetope("explain", str(tree_file), "--user", "bob", data=tmp_path / "data", env=fair)
    assert (
        "task a: priority normal (5), the default of an autonomous run; "
        "fair share of pool default as user bob: weight 1, queue_window 32\n"
    ) in bob.stdout


def test_explain_reports_a_tool_name_clash_and_the_names_to_write(tmp_path: Path) -> None:
    """Issue 10 item 3: two MCP servers offering `add`; the bare name fails, saying why."""
    from tests.conftest import demo_server, write_mcp_config

    config = write_mcp_config(tmp_path / "mcp.json", {"a": demo_server(), "b": demo_server()})
    tree_file = tmp_path / "t.yaml"
    tree_file.write_text(
        "id: clash\ntasks:\n  - id: one\n    tool: a.add\n    args: {a: 1, b: 2}\n"
        "  - id: two\n    tool: add\n    args: {a: 1, b: 2}\n"
        "  - id: old\n    tool: b/add\n    args: {a: 1, b: 2}\n"  # written before the dot
    )
    proc = vancetope(
        "explain", str(tree_file), data=tmp_path / "data", env={"VANCETOPE_MCP_CONFIG": str(config)}
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "tool name 'add' is offered by a.add, b.add: 'add' alone names none of them" in proc.stderr
    rows = {line.split("│")[1].strip(): line for line in proc.stdout.splitlines() if line.count("│") > 4}
    assert "server" in rows["one"] and "fail" in rows["two"] and "server" in rows["old"]
    assert "tool name 'b/add' is the deprecated '<server>/<tool>' form; it is read as 'b.add'" in " ".join(
        proc.stderr.split()
    )


def test_without_redis_clients_and_cancel_exit_3_with_one_line_and_status_still_reads_the_store(
    tmp_path: Path,
) -> None:
    from brain.stack.redis_server import free_port

    # A narrow terminal too: the reason stays one line.
    gone = {"VANCETOPE_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0", "COLUMNS": "60"}
    for args in (("clients",), ("cancel", "some-tree"), ("clients", "enroll", "x", "--user", "u")):
        proc = vancetope(*args, data=tmp_path / "data", env=gone)
        assert proc.returncode == 3, proc.stdout + proc.stderr
        assert proc.stderr.startswith("error: cannot reach Redis at redis://127.0.0.1:"), proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    status = vancetope("status", data=tmp_path / "data", env=gone)
    assert status.returncode == 0, status.stderr
    assert "no task trees yet" in status.stdout


def test_a_store_that_fails_exits_3_with_one_line(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    for env in (
        {"VANCETOPE_STORE_URL": f"sqlite:///{not_a_dir}/vancetope.db"},
        {"VANCETOPE_MONGO_URL": "mongodb://127.0.0.1:1/vt?serverSelectionTimeoutMS=300"},
    ):
        proc = vancetope("status", data=tmp_path / "data", env=env)
        assert proc.returncode == 3, proc.stdout + proc.stderr
        assert proc.stderr.startswith("error: the store failed:"), proc.stderr
        assert "Traceback" not in proc.stderr


def test_results_and_errors_that_look_like_rich_markup_are_shown_as_written(tmp_path: Path) -> None:
    """Seen by a new user: `run` and `status` died with rich's MarkupError on a result "see [/x]"
    or a sandbox error quoting "[/tmp/...]", and the tree could never be shown again."""
    markup = tmp_path / "markup.yaml"
    markup.write_text(
        "id: markup\n"
        "tasks:\n"
        '  - {id: said, tool: echo, args: {value: "see [/x] and [bold]not bold"}}\n'
        '  - {id: missed, tool: json_transform, args: {data: {"[/k]": 1}, pick: "[/nope]"}}\n'
    )
    data = tmp_path / "data"
    run = vancetope("run", str(markup), data=data)
    assert "Traceback" not in run.stdout + run.stderr, run.stdout + run.stderr
    assert run.returncode == 1, run.stdout + run.stderr  # the tree failed (one task), and says so
    tree_id = json.loads(vancetope("status", "--json", data=data).stdout)[0]["tree_id"]
    status = vancetope("status", tree_id, data=data)
    assert status.returncode == 0, status.stdout + status.stderr
    assert "see [/x] and [bold]not bold" in status.stdout
    assert "no key '[/nope]' (keys: [/k])" in status.stdout


def test_up_run_offline_client_clients_status_and_cancel_as_a_user_would(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with open(tmp_path / "up.log", "w") as up_log:
        up = subprocess.Popen(
            # As a shell script's `vancetope up &` starts it: with SIGINT ignored (exec keeps
            # that). Ctrl-C (SIGINT to its group, below) must still stop it.
            ["sh", "-c", f"trap '' INT; exec {shlex.quote(sys.executable)} -m brain up --no-agent"],
            cwd=ROOT,
            env={**os.environ, "VANCETOPE_DATA_DIR": str(data)},
            stdout=up_log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    agent: subprocess.Popen[str] | None = None
    try:
        stack_file = data / "stack.json"
        wait_until(stack_file.exists, timeout=120, what="`vancetope up` to write stack.json")
        admin_secret = (data / "redis" / "admin.secret").read_text().strip()
        assert admin_secret not in stack_file.read_text()
        # A second `up` on the same data dir is refused, and leaves the first one findable (it
        # used to start a second redis-server on the same files, and its stop removed stack.json).
        second = vancetope("up", "--no-agent", "--no-gateway", data=data)
        assert second.returncode == 3, second.stdout + second.stderr
        assert f"a stack is already running with data in {data} (pid {up.pid})" in second.stderr
        assert "Traceback" not in second.stderr
        assert stack_file.exists()
        # explain reads a --registry named on the command line even while a stack runs (it used
        # the running brain's and said "valid" for a registry file that does not parse).
        broken = tmp_path / "broken-registry.yaml"
        broken.write_text("tools: [unclosed\n")
        explained = vancetope(
            "--registry", str(broken), "explain", str(EXAMPLES / "night-batch.yaml"), data=data
        )
        assert explained.returncode == 2, explained.stdout + explained.stderr
        assert f"{broken}: YAML syntax error at line" in explained.stderr
        # The laptop gets a credential of its own, printed as the one line the agent needs.
        enrolled = vancetope("clients", "enroll", "laptop", "--user", "demo", data=data)
        assert enrolled.returncode == 0, enrolled.stderr
        line = enrolled.stdout.strip()
        assert re.fullmatch(r"VANCETOPE_AGENT_BROKER_URL=redis://vtc-laptop:\S+@127\.0\.0\.1:\d+/0", line), (
            line
        )
        url = line.split("=", 1)[1]
        assert admin_secret not in url
        # With --output the file is the one copy: nothing secret on the terminal.
        desk_file = tmp_path / "desk.credential"
        desk = vancetope("clients", "enroll", "desk", "--user", "demo", "--output", str(desk_file), data=data)
        assert desk.returncode == 0, desk.stderr
        desk_line = desk_file.read_text().strip()
        assert stat.S_IMODE(desk_file.stat().st_mode) == 0o600
        desk_secret = re.fullmatch(r"VANCETOPE_AGENT_BROKER_URL=redis://vtc-desk:(\S+)@\S+", desk_line).group(
            1
        )
        assert desk.stdout == "" and desk_secret not in desk.stderr, desk.stdout + desk.stderr
        assert "credential_file = 'desk.credential'" in desk.stderr
        assert vancetope("clients", "revoke", "desk", data=data).returncode == 0
        # The laptop is offline: its work parks, the server part finishes.
        run = vancetope(
            "run", str(EXAMPLES / "offline-client.yaml"), "--client", "laptop", "--timeout", "10", data=data
        )
        assert run.returncode == 4, run.stdout + run.stderr  # timed out: distinct from failed (1)
        tree_id = re.search(r"tree (offline-client-\S+)", run.stdout).group(1)
        assert re.search(r"read_notes .*blocked .*Waiting for Client for Tool: read_local_file", run.stdout)
        assert re.search(r"list_sandbox .*pending_client", run.stdout)
        assert re.search(r"server_clock .*done", run.stdout)
        assert "still running after 10s" in run.stderr

        clients = vancetope("clients", data=data)
        assert re.search(r"laptop .*demo .*offline .*2", clients.stdout), clients.stdout
        as_json = json.loads(vancetope("clients", "--json", data=data).stdout)
        (laptop,) = as_json["clients"]
        assert laptop["client_id"] == "laptop" and laptop["user"] == "demo" and not laptop["connected"]
        assert laptop["waiting"]["client"] + laptop["waiting"]["user"] == 2, laptop
        assert as_json["registry"]["tools"] > 0
        # what another Celery app connects with: a credential of one user (the `user` setting,
        # demo, without --user), never the admin secret
        submit = vancetope("submit-url", data=data)
        assert re.fullmatch(
            r"VANCETOPE_SUBMIT_URL=redis://vts-demo:\S+@127\.0\.0\.1:\d+/0", submit.stdout.strip()
        ), submit.stdout + submit.stderr
        assert "queue submit.demo" in submit.stderr
        assert admin_secret not in submit.stdout

        # a second run of the same tree, cancelled while parked: it must never run
        again = vancetope(
            "run", str(EXAMPLES / "offline-client.yaml"), "--client", "laptop", "--timeout", "3", data=data
        )
        cancelled_id = re.search(r"tree (offline-client-\S+)", again.stdout).group(1)
        cancel = vancetope("cancel", cancelled_id, data=data)
        assert cancel.returncode == 0, cancel.stderr
        assert "cancelled 3 task(s): read_notes, list_sandbox, summary" in cancel.stdout

        agent = subprocess.Popen(
            [sys.executable, "-m", "client_agent", "run", "--config", str(EXAMPLES / "agent" / "agent.toml")],
            cwd=ROOT,
            env={**os.environ, "VANCETOPE_AGENT_BROKER_URL": url},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        wait_until(
            lambda: "— done" in vancetope("status", tree_id, data=data).stdout,
            timeout=120,
            what="the parked tasks to run once the agent connected",
        )
        status = vancetope("status", tree_id, data=data).stdout
        assert re.search(r"read_notes .*done .*client:laptop", status)
        assert "connected" in vancetope("clients", data=data).stdout
        (laptop,) = json.loads(vancetope("clients", "--json", data=data).stdout)["clients"]
        assert laptop["connected"] and "read_local_file" in laptop["tools"], laptop
        cancelled = vancetope("status", cancelled_id, data=data).stdout
        assert re.search(r"read_notes .*skipped .*cancelled by user", cancelled), cancelled
        assert "done" not in cancelled.split("read_notes", 1)[1].splitlines()[0]
    finally:
        for proc in (agent, up):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)
                proc.wait(120)
    assert up.returncode == 0, (tmp_path / "up.log").read_text()
    up_output = (tmp_path / "up.log").read_text()
    assert "stack up" in up_output and admin_secret not in up_output
    # Ctrl-C: it says it stops, and what it leaves unfinished (the offline-client tree finished,
    # the cancelled one ended): nothing.
    assert "stopping the stack…" in up_output
    assert "stack stopped; no tree was left unfinished." in up_output
    assert not (data / "stack.json").exists()
