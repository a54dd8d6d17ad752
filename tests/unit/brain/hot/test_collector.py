"""``collector_held``: no cyclic collection meanwhile, and the collector as it was afterwards."""

from __future__ import annotations

import gc

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
