"""``collector_held``: no cyclic collection meanwhile, and the collector as it was afterwards."""

from __future__ import annotations

import gc
import threading

import pytest

from brain.hot.collector import collector_held


def test_the_collector_is_off_meanwhile_and_on_again_after_even_when_the_burst_fails() -> None:
    assert gc.isenabled()
    with pytest.raises(RuntimeError), collector_held():
        assert not gc.isenabled()
        raise RuntimeError("the burst failed")
    assert gc.isenabled()


def test_a_collector_that_was_off_stays_off_and_a_hold_inside_a_hold_keeps_it_off() -> None:
    with collector_held():
        with collector_held():
            pass
        assert not gc.isenabled()  # the inner hold found it off and left it so
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_held():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_one_threads_hold_ending_does_not_switch_the_collector_on_in_anothers() -> None:
    """The first hold to begin ends first, while another thread's burst goes on."""
    inside, release = threading.Event(), threading.Event()

    def burst() -> None:
        with collector_held():
            inside.set()
            release.wait(10)

    other = threading.Thread(target=burst)
    other.start()
    assert inside.wait(10)
    with collector_held():
        release.set()
        other.join(10)
        assert not other.is_alive()
        assert not gc.isenabled()  # this burst is still on
    assert gc.isenabled()
