"""What ``vancetope.run_tool`` returns: Flower shows it as the task's result, so Celery writes it
out with its ``saferepr`` after every task. It reads as the dict it always was, and is written
out as one ``repr``, not walked key by key (Celery's walk was a twentieth of a pool child's time
per no-op task). Run eagerly with Celery's own tracer."""

from __future__ import annotations

from typing import Any

import pytest
from celery.utils import saferepr as celery_saferepr

from workers.app import make_app
from workers.contracts import ToolCall, ToolResult, ToolType
from workers.tasks import register


def test_a_run_tools_result_reads_as_its_dict_and_is_written_out_in_one_repr(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    walked: list[Any] = []
    real = celery_saferepr._chaindict

    def counted(mapping: Any, *args: Any, **kwargs: Any) -> Any:
        walked.append(mapping)
        return real(mapping, *args, **kwargs)

    monkeypatch.setattr(celery_saferepr, "_chaindict", counted)
    app = make_app("redis://127.0.0.1:1/0")  # eager: no broker is reached
    app.conf.task_always_eager = True
    recorded: list[ToolResult] = []
    run_tool = register(app, sink=recorded.append, begin=lambda call, worker, started: 1, task_events=False)
    call = ToolCall(
        run_id="t.k.1", tree_id="t", task_id="k", tool="echo", tool_type=ToolType.BUILT_IN,
        args={"value": 1}, timeout_s=5, max_result_bytes=1000,
    )  # fmt: skip
    outcome = run_tool.apply(args=[call.model_dump(mode="json")]).get()
    assert [r.value for r in recorded] == [1]
    assert outcome == {"ok": True, "tool": "echo", "task": "k"}
    assert celery_saferepr.saferepr(outcome, 1024) == repr({"ok": True, "tool": "echo", "task": "k"})
    assert walked == []  # Celery's tracer wrote it out without walking it
    app.close()


def test_a_run_asks_whether_to_stop_where_its_worker_says_not_on_a_connection_of_its_own() -> None:
    """A client agent asks on its channel's connections (``register(stop_asked=...)``): the
    check's own connection stayed open after the agent's first call longer than ``STOP_POLL_S``,
    a connection more per workstation (two with both threads busy). The answer it gets decides:
    here the call is stopped at the second ask."""
    app = make_app("redis://127.0.0.1:1/0")  # eager; a connection of the check's own would fail
    app.conf.task_always_eager = True
    recorded: list[ToolResult] = []
    asked: list[str] = []

    def stop_asked(run_id: str) -> bool:
        asked.append(run_id)
        return len(asked) >= 2

    run_tool = register(
        app,
        sink=recorded.append,
        begin=lambda call, worker, started: 1,
        task_events=False,
        client_id="laptop",
        stop_asked=stop_asked,
    )
    call = ToolCall(
        run_id="t.k.1", tree_id="t", task_id="k", tool="sleep", tool_type=ToolType.BUILT_IN,
        args={"seconds": 30}, timeout_s=60, max_result_bytes=1000, client_id="laptop",
    )  # fmt: skip
    run_tool.apply(args=[call.model_dump(mode="json")])
    assert asked == ["t.k.1", "t.k.1"]
    assert [(r.ok, r.error and r.error.type) for r in recorded] == [(False, "Cancelled")]
    app.close()
