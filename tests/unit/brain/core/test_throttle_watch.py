from brain.core.throttle_watch import ThrottleWatch


def test_a_run_is_reported_once_after_waiting_on_two_passes() -> None:
    watch = ThrottleWatch()
    assert watch.due({"a", "b"}) == []  # maybe admitted a moment later: not yet
    assert watch.due({"a", "b", "c"}) == ["a", "b"]
    assert watch.due({"a", "b", "c"}) == ["c"]
    assert watch.due({"a", "c"}) == []


def test_a_run_admitted_before_the_second_pass_is_never_reported() -> None:
    watch = ThrottleWatch()
    watch.due({"a"})
    assert watch.due(set()) == []
    assert watch.due({"b"}) == []
    assert watch.due({"b"}) == ["b"]


def test_a_run_gone_from_the_gate_is_forgotten_and_reset_forgets_all() -> None:
    watch = ThrottleWatch()
    watch.due({"a"})
    assert watch.due({"a"}) == ["a"]
    watch.due(set())
    watch.due({"a"})  # the same id at the gate again is a new wait
    assert watch.due({"a"}) == ["a"]
    watch.reset()
    assert watch.due({"a"}) == []
    assert watch.due({"a"}) == ["a"]
