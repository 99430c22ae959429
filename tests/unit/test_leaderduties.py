"""LeaderDuties (nameserver/core/leaderduties.py): the node's periodic work on one thread."""

from __future__ import annotations

import threading
import time

import pytest

from nameserver.core.leaderduties import LeaderDuties


def _wait(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


def test_leader_only_duties_run_while_leading_and_the_others_always() -> None:
    leading = threading.Event()
    ran: list[str] = []
    duties = LeaderDuties(leading.is_set)
    duties.add("expiry", 0.02, lambda: ran.append("expiry"))
    duties.add("heartbeats", 0.02, lambda: ran.append("heartbeats"), leader_only=False)
    duties.start()
    try:
        assert _wait(lambda: ran.count("heartbeats") >= 3)
        assert "expiry" not in ran  # a follower never ran a leader duty
        leading.set()
        assert _wait(lambda: ran.count("expiry") >= 3)
    finally:
        duties.stop()


def test_duties_never_overlap() -> None:
    inside = threading.Lock()
    overlaps = []

    def work() -> None:
        if not inside.acquire(blocking=False):
            overlaps.append(1)
            return
        time.sleep(0.01)
        inside.release()

    duties = LeaderDuties(lambda: True)
    for name in ("a", "b", "c"):
        duties.add(name, 0.005, work)
    duties.start()
    try:
        assert _wait(lambda: min(duties.runs(n) for n in "abc") >= 5)
    finally:
        duties.stop()
    assert overlaps == []


def test_wake_runs_a_duty_before_its_turn() -> None:
    ran = threading.Event()
    duties = LeaderDuties(lambda: True)
    duties.add("scan", 60.0, ran.set)
    duties.start()
    try:
        time.sleep(0.1)
        assert not ran.is_set()  # its first turn is a minute away
        duties.wake("scan")
        assert ran.wait(2.0)
    finally:
        duties.stop()


def test_a_failing_duty_is_logged_and_runs_again(caplog: pytest.LogCaptureFixture) -> None:
    calls = []

    def boom() -> None:
        calls.append(1)
        raise RuntimeError("no quorum")

    duties = LeaderDuties(lambda: True)
    duties.add("flaky", 0.02, boom)
    duties.start()
    try:
        assert _wait(lambda: len(calls) >= 3)
    finally:
        duties.stop()
    assert any("duty flaky failed" in r.getMessage() for r in caplog.records)


def test_names_and_intervals_are_checked() -> None:
    duties = LeaderDuties(lambda: True)
    duties.add("a", 1.0, lambda: None)
    with pytest.raises(ValueError, match="already registered"):
        duties.add("a", 1.0, lambda: None)
    with pytest.raises(ValueError, match="interval_s"):
        duties.add("b", 0.0, lambda: None)


def test_stop_ends_the_thread() -> None:
    duties = LeaderDuties(lambda: True)
    duties.add("a", 0.01, lambda: None)
    duties.start()
    duties.stop()
    assert not duties._thread.is_alive()
