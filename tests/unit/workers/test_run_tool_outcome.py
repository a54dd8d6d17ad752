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
