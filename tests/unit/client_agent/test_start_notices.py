"""client_agent.start_notices: a call still running a moment after it began is said to be
running; one that ended first is not. No timer is asserted: the delays are 0 (due at once) or an
hour (never due within the test)."""

from __future__ import annotations

import queue

from client_agent.start_notices import StartNotices
from workers.contracts import ToolStarted


def started(run: str) -> ToolStarted:
    return ToolStarted(run_id=run, tree_id="t", task_id=f"k-{run}", started_at=1.0, client_id="laptop")


def test_a_run_still_going_when_its_notice_is_due_is_said_to_have_begun_once() -> None:
    sent: queue.Queue[ToolStarted] = queue.Queue()
    notices = StartNotices(sent.put, delay_s=0.0)
    try:
        notices.begun(started("r1"))
        notices.begun(started("r2"))
        got = {sent.get(timeout=60).run_id, sent.get(timeout=60).run_id}
        assert got == {"r1", "r2"}
        notices.ended("r1")  # after its notice went: nothing more
        notices.begun(started("r3"))
        assert sent.get(timeout=60).run_id == "r3"
        assert sent.empty()
    finally:
        notices.close()


def test_a_run_that_ended_before_its_notice_was_due_is_never_said_to_have_begun() -> None:
    sent: queue.Queue[ToolStarted] = queue.Queue()
    slow = StartNotices(sent.put, delay_s=3600.0)
    try:
        slow.begun(started("quick"))
        slow.ended("quick")
        assert slow._due == {}  # nothing left to send, ever
    finally:
        slow.close()
    # The same, with a notice due at once for a second run: the thread is alive and sending,
    # and still the ended run's notice is not among what it sent.
    notices = StartNotices(sent.put, delay_s=0.0)
    try:
        notices.delay_s = 3600.0
        notices.begun(started("quick"))
        notices.ended("quick")
        notices.delay_s = 0.0
        notices.begun(started("slow"))
        assert sent.get(timeout=60).run_id == "slow"
        assert sent.empty()
    finally:
        notices.close()


def test_a_failing_send_loses_that_notice_only() -> None:
    sent: queue.Queue[ToolStarted] = queue.Queue()

    def send(notice: ToolStarted) -> None:
        if notice.run_id == "bad":
            raise ConnectionError("link cut")
        sent.put(notice)

    notices = StartNotices(send, delay_s=0.0)
    try:
        notices.begun(started("bad"))
        notices.begun(started("good"))
        assert sent.get(timeout=60).run_id == "good"
    finally:
        notices.close()


def test_closed_it_sends_nothing_more() -> None:
    sent: queue.Queue[ToolStarted] = queue.Queue()
    notices = StartNotices(sent.put, delay_s=3600.0)
    notices.begun(started("r1"))
    notices.close()
    notices.delay_s = 0.0
    notices.begun(started("r2"))
    assert notices._due == {} and sent.empty()
