"""Issue 11 item 4: programs submit trees — the Python API (``import vancetope``) and the
``vancetope.submit_tree`` Celery task another Celery app sends on queue ``submit``."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

import vancetope
from brain.stack.embedded import EmbeddedStack
from tests.conftest import make_settings, wait_until

pytestmark = pytest.mark.integration

ECHO_TREE: dict[str, Any] = {
    "id": "api",
    "tasks": [
        {"id": "hello", "tool": "echo", "args": {"value": "hi"}},
        {
            "id": "loud",
            "tool": "text_transform",
            "depends_on": ["hello"],
            "args": {"op": "upper", "text": "${tasks.hello.result}"},
        },
    ],
}


@pytest.fixture(scope="module")
def stack(module_stack_factory: Any) -> EmbeddedStack:
    """One stack for the module: each test reads only its own trees (or counts before and
    after), so what the others left does not matter to it."""
    return module_stack_factory(services=("brain", "server-pool"))


@pytest.fixture
def vt(stack: EmbeddedStack) -> Any:
    with vancetope.connect(stack.settings, redis_url=stack.redis_url) as client:
        yield client


@pytest.fixture
def fresh_stack(stack_factory: Any) -> EmbeddedStack:
    """A stack of the test's own, for a test that counts every tree of an id."""
    return stack_factory(services=("brain", "server-pool"))


@pytest.fixture
def fresh_vt(fresh_stack: EmbeddedStack) -> Any:
    with vancetope.connect(fresh_stack.settings, redis_url=fresh_stack.redis_url) as client:
        yield client


def test_a_program_submits_a_dict_waits_and_reads_the_results(vt: vancetope.Vancetope) -> None:
    run = vt.submit(ECHO_TREE, user="demo")
    report = run.wait(timeout=120)
    assert report.done and report.status is vancetope.TreeStatus.DONE
    assert report.counts == {"done": 2}
    assert report.result("loud") == "HI"
    assert report.tree.user == "demo" and report.tree.session is vancetope.SessionKind.AUTONOMOUS
    # the same object `vancetope status ID --json` prints
    assert report.as_json()["tasks"][1]["result"] == "HI"
    assert vt.tree(run.tree_id).status() == report


def test_a_tree_file_and_a_chosen_tree_id(vt: vancetope.Vancetope, tmp_path: Path) -> None:
    tree_file = tmp_path / "t.yaml"
    tree_file.write_text("id: from-file\ntasks:\n  - {id: a, tool: echo, args: {value: 1}}\n")
    report = vt.run(tree_file, tree_id="nightly-42", timeout=120)
    assert report.tree_id == "nightly-42" and report.result("a") == 1
    with pytest.raises(vancetope.StoreError, match="already exists"):
        vt.submit(tree_file, tree_id="nightly-42")


def test_an_invalid_tree_is_refused_with_every_problem_and_nothing_is_recorded(
    vt: vancetope.Vancetope,
) -> None:
    bad = {
        "id": "bad",
        "tasks": [{"id": "a", "tool": "echo", "depends_on": ["ghost"]}, {"id": "a", "tool": "echo"}],
    }
    before = len(vt.trees())
    with pytest.raises(vancetope.InvalidTaskTree) as refused:
        vt.submit(bad)
    assert len(refused.value.problems) >= 2, refused.value.problems
    assert "ghost" in str(refused.value)
    with pytest.raises(vancetope.InvalidTaskTree, match="tree_id 'no:colons'"):
        vt.submit(ECHO_TREE, tree_id="no:colons")
    # a pool nobody configured is refused here, as `vancetope run` refuses it
    with pytest.raises(vancetope.InvalidTaskTree, match=r"task 'a': .*'gpu'"):
        vt.submit(
            {"id": "pooled", "tasks": [{"id": "a", "tool": "echo", "pool": "gpu", "args": {"value": 1}}]}
        )
    assert len(vt.trees()) == before


def test_a_tool_name_typo_raises_with_did_you_mean_and_nothing_is_recorded(vt: vancetope.Vancetope) -> None:
    """Issue 22 item 6: submit() only warned on stderr, and the typo was recorded as a failed task."""
    before = len(vt.trees())
    typo = {"id": "typo", "tasks": [{"id": "now", "tool": "get_curent_time", "args": {"timezone": "UTC"}}]}
    with pytest.raises(vancetope.InvalidTaskTree, match=r"did you mean `get_current_time`"):
        vt.submit(typo, user="demo")
    assert len(vt.trees()) == before


def test_wait_times_out_with_how_the_tree_stands_and_cancel_ends_it(vt: vancetope.Vancetope) -> None:
    run = vt.submit({"id": "slow", "tasks": [{"id": "nap", "tool": "sleep", "args": {"seconds": 30}}]})
    with pytest.raises(vancetope.TimedOut, match="still running after 0.5s") as timed_out:
        run.wait(timeout=0.5)
    assert timed_out.value.report.status is vancetope.TreeStatus.RUNNING
    assert run.cancel() == ["nap"]
    final = run.wait(timeout=120)
    assert final.task("nap").state is vancetope.TaskState.SKIPPED and not final.done


def test_unknown_trees_and_no_stack_are_clear_errors(vt: vancetope.Vancetope, tmp_path: Path) -> None:
    with pytest.raises(vancetope.TreeNotFound, match="no task tree with id 'nope'"):
        vt.tree("nope")
    with pytest.raises(vancetope.StackNotRunning, match="vancetope up"):
        vancetope.connect(make_settings(tmp_path / "elsewhere"))


# --- the Celery task, sent by another Celery app ----------------------------------------


def submit_url(stack: EmbeddedStack, user: str) -> str:
    """What `vancetope submit-url --user U` prints the URL of: a credential for ``user`` only."""
    from brain.runtime import submitters
    from brain.store import open_store
    from workers.urls import with_credentials

    assert stack.redis is not None
    store, r = open_store(stack.settings.store), redis.Redis.from_url(stack.redis.url)
    try:
        secret = submitters.issue(store, r, user)
    finally:
        store.close()
        r.close()
    return with_credentials(stack.redis.url, submitters.submit_username(user), secret)


def other_app(stack: EmbeddedStack, user: str | None = None, *, url: str | None = None) -> Celery:
    """A plain Celery app of someone else's: with a submit credential of ``user`` (demo), or the
    stack's component user ``user`` when it starts with vt-."""
    assert stack.redis is not None
    if url is None:
        url = (
            stack.redis.url_for(user)
            if user and user.startswith("vt-")
            else submit_url(stack, user or "demo")
        )
    app = Celery("someone-elses-app", broker=url, set_as_current=False)
    app.conf.broker_connection_retry_on_startup = True
    return app


DEMO_QUEUE = "submit.demo"


def test_another_celery_app_submits_a_tree_through_the_submit_queue(
    fresh_stack: EmbeddedStack, fresh_vt: vancetope.Vancetope
) -> None:
    # Every tree "api" of the stack is counted below: not the module's shared stack.
    stack, vt = fresh_stack, fresh_vt
    app = other_app(stack)
    try:
        app.send_task(
            vancetope.SUBMIT_TREE_TASK,
            kwargs={"tree": ECHO_TREE, "user": "demo", "tree_id": "from-celery"},
            queue=DEMO_QUEUE,
        )
        # the same message delivered twice (at-least-once) makes one run
        message_id = str(uuid.uuid4())
        for _ in range(2):
            app.send_task(
                vancetope.SUBMIT_TREE_TASK,
                kwargs={"tree": ECHO_TREE},
                queue=DEMO_QUEUE,
                task_id=message_id,
            )
        # a refused tree: logged by the brain with its problem, never recorded
        app.send_task(
            vancetope.SUBMIT_TREE_TASK,
            kwargs={
                "tree": {"id": "broken", "tasks": [{"id": "a", "tool": "echo", "depends_on": ["ghost"]}]}
            },
            queue=DEMO_QUEUE,
        )
    finally:
        app.close()
    wait_until(lambda: vt.brain.store.get_tree("from-celery"), timeout=120, what="the submitted run")
    report = vt.tree("from-celery").wait(timeout=120)
    assert report.done and report.result("loud") == "HI" and report.tree.user == "demo"
    brain_log = stack.settings.data_dir / "logs" / "brain.log"
    wait_until(lambda: "refused a submitted tree" in brain_log.read_text(), timeout=120, what="the refusal")
    assert "ghost" in brain_log.read_text()
    runs = [t for t in vt.trees(100) if t.tree.id == "api" and t.tree_id != "from-celery"]
    assert len(runs) == 1, [t.tree_id for t in runs]
    assert runs[0].tree_id == f"api-{message_id.replace('-', '')[:16]}"
    assert not [t for t in vt.trees(100) if t.tree.id == "broken"]


def test_the_submitter_credential_reaches_only_its_users_submit_queue(stack: EmbeddedStack) -> None:
    assert stack.redis is not None
    submitter = redis.Redis.from_url(submit_url(stack, "demo"))
    try:
        assert submitter.llen("submit.demo") == 0  # its own queue: yes
        for forbidden in (
            lambda: submitter.lpush("server", b"{}"),  # no work for the server pool
            lambda: submitter.lpush("brain", b"{}"),  # no forged results
            lambda: submitter.lpush("client.laptop", b"{}"),  # no work for a workstation
            lambda: submitter.lpush("submit.demo2", b"{}"),  # no other user's queue, even one named alike
            lambda: submitter.lpop("submit.demo"),  # no reading what others submit
            lambda: submitter.get("vt:registry"),
            lambda: submitter.publish("celeryev", b"{}"),
        ):
            with pytest.raises(redis.exceptions.NoPermissionError):
                forbidden()
    finally:
        submitter.close()


def test_the_server_pool_cannot_submit_through_the_brain_queue(
    stack: EmbeddedStack, vt: vancetope.Vancetope
) -> None:
    """The pool may write queue ``brain``; a submit_tree put there is an unknown task to the brain,
    so a compromised pool cannot start work on a workstation."""
    pool = other_app(stack, user="vt-pool")
    try:
        pool.send_task(
            vancetope.SUBMIT_TREE_TASK, kwargs={"tree": ECHO_TREE, "tree_id": "forged"}, queue="brain"
        )
    finally:
        pool.close()
    brain_log = stack.settings.data_dir / "logs" / "brain.log"
    wait_until(
        lambda: "unregistered task of type 'vancetope.submit_tree'" in brain_log.read_text(),
        timeout=120,
        what="the brain to refuse the forged message",
    )
    assert vt.brain.store.get_tree("forged") is None


@pytest.mark.parametrize(
    ("body", "headers", "logged"),
    [
        (
            [[], {"tree": ECHO_TREE}, {}],
            {"task": "vancetope.run_tool", "id": "m1"},
            "expected 'vancetope.submit_tree'",
        ),
        ([[ECHO_TREE], {}, {}], {"task": "vancetope.submit_tree", "id": "m2"}, "as keyword arguments"),
        ("not a list", {"task": "vancetope.submit_tree", "id": "m3"}, "refused submit_tree message m3"),
        (
            [[], {"tree": ECHO_TREE, "tree_id": "a b"}, {}],
            {"task": "vancetope.submit_tree", "id": "m4"},
            "tree_id",
        ),
        ([[], {"tree": ECHO_TREE, "extra": 1}, {}], {"task": "vancetope.submit_tree", "id": "m5"}, "extra"),
    ],
)
def test_a_malformed_submit_message_is_refused_with_the_reason_and_records_nothing(
    vt: vancetope.Vancetope, caplog: pytest.LogCaptureFixture, body: Any, headers: dict[str, Any], logged: str
) -> None:
    from brain.runtime.submit_queue import submit_message

    before = len(vt.trees(100))
    with caplog.at_level("ERROR", logger="vancetope.brain.submit"):
        assert submit_message(vt.brain, body, headers, "demo") is None
    assert logged in caplog.text
    assert len(vt.trees(100)) == before


def test_a_program_uses_retries_trigger_rules_and_fan_out(vt: vancetope.Vancetope) -> None:
    """Issue 23 through the Python API: the tree's new fields are the file's."""
    report = vt.run(
        {
            "id": "api-night",
            "retry": {"max_attempts": 2, "backoff_s": 0.2, "on": ["tool_error"]},
            "tasks": [
                {"id": "words", "tool": "echo", "args": {"value": ["a", "b", "c"]}},
                {"id": "loud", "tool": "text_transform", "depends_on": ["words"],
                 "for_each": "${tasks.words.result}", "args": {"op": "upper", "text": "${item}"}},
                {"id": "bad", "tool": "json_transform", "args": {"data": {}, "pick": "missing"}},
                {"id": "notify", "tool": "echo", "depends_on": ["bad", "loud"], "run_if": "any_failed",
                 "args": {"value": "${tasks.bad.status}: ${tasks.loud.results}"}},
            ],
        },
        user="demo",
        timeout=120,
    )  # fmt: skip
    assert report.status.value == "failed"  # "bad" failed: honest, even though its notify ran
    assert report.result("loud") == ["A", "B", "C"]
    assert report.result("notify") == 'failed: ["A", "B", "C"]'
    bad = report.task("bad")
    assert len(bad.attempts) == 1 and bad.attempts[0].error.type == "ToolFailed"  # tried twice
