"""The shared deadline watch that bounds streamed registrations (one thread for every stream)."""

from __future__ import annotations

import threading
import time

from nameserver.api.deadlines import DeadlineWatch


def wait_until(pred, timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.005)
    return pred()


def test_due_deadlines_fire_in_deadline_order_and_cancelled_ones_never() -> None:
    watch = DeadlineWatch()
    fired: list[str] = []
    watch.after(0.15, lambda: fired.append("late"))
    cancelled = watch.after(0.05, lambda: fired.append("cancelled"))
    watch.after(0.08, lambda: fired.append("early"))
    cancelled.cancel()
    assert wait_until(lambda: len(fired) == 2)
    time.sleep(0.1)
    assert fired == ["early", "late"] and watch.pending() == 0 and watch.fired == 2


def test_a_deadline_used_as_a_context_is_cancelled_when_the_call_finishes_in_time() -> None:
    watch = DeadlineWatch()
    fired = threading.Event()
    with watch.after(0.05, fired.set):
        pass
    assert not fired.wait(0.2) and watch.pending() == 0


def test_one_thread_serves_every_deadline_and_a_failing_action_does_not_stop_it() -> None:
    before = {t.name for t in threading.enumerate()}
    watch = DeadlineWatch(name="test-deadlines")
    fired: list[int] = []

    def boom() -> None:
        raise RuntimeError("a cancel that failed")

    watch.after(0.01, boom)
    handles = [watch.after(0.02 + i / 1000, lambda i=i: fired.append(i)) for i in range(50)]
    names = [t.name for t in threading.enumerate() if t.name not in before]
    assert names.count("test-deadlines") == 1 and len(names) == 1
    assert wait_until(lambda: len(fired) == 50)
    assert fired == sorted(fired) and handles[0].action is not None


def test_later_bounds_do_not_wake_the_thread_and_an_earlier_one_still_fires_on_time() -> None:
    """The call guard sets a bound of one length per gRPC call: each is later than those pending, so the
    thread sleeps on; only one earlier than all of them needs it awake."""
    watch = DeadlineWatch()
    watch.after(60, lambda: None)
    deadline = time.monotonic() + 5
    while watch.wakeups == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)
    woken = watch.wakeups
    for _ in range(200):  # calls that finish in time
        with watch.after(60, lambda: None):
            pass
    time.sleep(0.1)
    assert watch.wakeups == woken, f"woken {watch.wakeups - woken} times by 200 later bounds"
    fired = threading.Event()
    watch.after(0.05, fired.set)
    assert fired.wait(5)


def test_equal_bounds_fire_in_arrival_order_and_disarmed_ones_never() -> None:
    from nameserver.api.deadlines import EqualBounds

    bounds = EqualBounds(0.1, name="test-equal-bounds")
    fired: list[int] = []
    armed = [bounds.arm(lambda i=i: fired.append(i)) for i in range(20)]
    for b in armed[::2]:
        b.disarm()
    assert wait_until(lambda: len(fired) == 10)
    time.sleep(0.15)
    assert fired == list(range(1, 20, 2)) and bounds.fired == 10 and bounds.armed() == 0


def test_an_equal_bound_armed_after_an_idle_spell_fires_within_its_slack() -> None:
    """The watch thread sleeps while nothing is armed: a bound armed then is still seen in time."""
    from nameserver.api.deadlines import EqualBounds

    bounds = EqualBounds(0.2, name="test-equal-idle")
    for _ in range(3):
        bounds.arm(lambda: None).disarm()
        time.sleep(0.3)  # everything dropped: the thread is idle
        fired = threading.Event()
        start = time.monotonic()
        bounds.arm(fired.set)
        assert fired.wait(2)
        assert 0.19 <= time.monotonic() - start < 0.2 + 0.05 + 0.2  # its length, at most its slack late (+ noise)
    names = [t.name for t in threading.enumerate() if t.name == "test-equal-idle"]
    assert len(names) == 1
