"""ReadIndexBatcher (nameserver/core/readindex.py): reads share a round only if they arrived before it began."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from nameserver.core.readindex import ReadIndexBatcher


class Barrier:
    """A barrier whose calls block until released; each returns its own number (1, 2, ...)."""

    def __init__(self) -> None:
        self.calls = 0
        self.started = threading.Semaphore(0)
        self.release = threading.Event()
        self.fail: Exception | None = None

    def __call__(self, timeout: float) -> int:
        self.calls += 1
        number = self.calls
        self.started.release()
        self.release.wait(timeout)
        if self.fail is not None:
            raise self.fail
        return number


def test_reads_arriving_during_a_round_share_the_next_one_not_that_one() -> None:
    barrier = Barrier()
    batcher = ReadIndexBatcher(barrier, max_rounds=1)
    try:
        with ThreadPoolExecutor(4) as pool:
            first = pool.submit(batcher.read_index, 5.0)
            assert barrier.started.acquire(timeout=5)          # round 1 is in flight
            later = [pool.submit(batcher.read_index, 5.0) for _ in range(3)]
            time.sleep(0.1)
            assert barrier.calls == 1                          # they wait: the one round slot is busy
            barrier.release.set()
            assert first.result(timeout=5) == 1
            assert [f.result(timeout=5) for f in later] == [2, 2, 2]  # one round for the three
        assert (batcher.rounds, batcher.reads) == (2, 4) and batcher.reads_per_barrier == 2.0
    finally:
        batcher.stop()


def test_up_to_max_rounds_run_at_once() -> None:
    barrier = Barrier()
    batcher = ReadIndexBatcher(barrier, max_rounds=3)
    try:
        with ThreadPoolExecutor(4) as pool:
            futures = []
            for _ in range(3):
                futures.append(pool.submit(batcher.read_index, 5.0))
                assert barrier.started.acquire(timeout=5)      # each read starts a round of its own
            assert barrier.calls == 3
            barrier.release.set()
            assert sorted(f.result(timeout=5) for f in futures) == [1, 2, 3]
    finally:
        batcher.stop()


def test_a_failed_round_fails_each_of_its_reads_and_a_slow_one_times_out() -> None:
    barrier = Barrier()
    batcher = ReadIndexBatcher(barrier, max_rounds=1, barrier_timeout_s=5.0)
    try:
        started = time.monotonic()
        with pytest.raises(TimeoutError, match="no read index within the deadline"):
            batcher.read_index(0.2)
        assert time.monotonic() - started < 2.0
        barrier.fail = RuntimeError("leadership lost")
        barrier.release.set()
        with pytest.raises(RuntimeError, match="leadership lost"):
            batcher.read_index(5.0)
    finally:
        batcher.stop()


def test_stop_ends_every_round_thread() -> None:
    batcher = ReadIndexBatcher(Barrier(), max_rounds=4, name="stop-test")
    batcher.stop()
    deadline = time.monotonic() + 5
    while any(t.name.startswith("stop-test-") for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not any(t.name.startswith("stop-test-") for t in threading.enumerate())
