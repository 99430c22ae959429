"""The node-side archiver on a real EntryHistory: segments as entries apply, resume, gaps, never blocking."""

from __future__ import annotations

import time

import pyarrow.parquet as pq

from nameserver.logformat.segments import covered_ranges
from nameserver.ops.archive import LogArchiver
from raftlog.codec import encode_entry
from raftlog.history import AppliedEntry, EntryHistory
from raftlog.log import Subscription
from raftlog.pb import entry_pb2


class FakeLog:
    """What the archiver uses of raftlog's ReplicatedLog: the history ring and subscribe()."""

    def __init__(self, max_entries: int = 1000) -> None:
        self.history = EntryHistory(max_entries=max_entries)
        self.entry_listeners: list = []

    def subscribe(self, listener) -> Subscription:
        return Subscription(self.entry_listeners, listener)

    def apply(self, offset: int, records: int = 1) -> None:
        entry = entry_pb2.Entry(term=1, leader_time_ms=offset, batches=[entry_pb2.Batch(records=[
            entry_pb2.Record(type=5, key=f"kv/ns/k{offset}-{i}", value=b"\n\x01v") for i in range(records)])])
        applied = AppliedEntry(offset, 1, encode_entry(entry), ())
        self.history.append(applied)
        for listener in self.entry_listeners:
            listener(applied)


def _wait(cond, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _offsets(directory: str) -> list[int]:
    return sorted(set(pq.read_table(directory, columns=["offset"]).column(0).to_pylist()))


def test_archiver_writes_segments_resumes_and_never_rewrites(tmp_path) -> None:
    d = str(tmp_path / "archive")
    applier = FakeLog()
    arch = LogArchiver(applier, d, rows_per_segment=10, max_age_s=0.2)
    arch.start()
    for o in range(1, 26):
        applier.apply(o if o < 20 else o + 1)  # offset 20 is a pysyncobj no-op: never seen here
    _wait(lambda: covered_ranges(d) and covered_ranges(d)[-1][1] == 26)  # size cuts, then the age flush
    arch.stop()
    assert covered_ranges(d)[0] == (1, 10)
    assert _offsets(d) == [o for o in range(1, 27) if o != 20]
    before = sorted(p.name for p in (tmp_path / "archive").iterdir())

    # A restart resumes after the last segment: the entries it already wrote are skipped, not rewritten.
    arch2 = LogArchiver(applier, d, rows_per_segment=10, max_age_s=0.2)
    arch2.start()
    applier.apply(27, records=3)
    _wait(lambda: covered_ranges(d)[-1][1] == 27)
    arch2.stop()
    after = sorted(p.name for p in (tmp_path / "archive").iterdir())
    assert set(before) < set(after) and len(after) == len(before) + 1
    assert _offsets(d) == [o for o in range(1, 28) if o != 20]
    assert applier.entry_listeners == []


def test_archiver_skips_a_gap_it_can_no_longer_read_and_says_so(tmp_path) -> None:
    d = str(tmp_path / "archive")
    applier = FakeLog(max_entries=5)
    arch = LogArchiver(applier, d, rows_per_segment=1000, max_age_s=0.1)
    for o in range(1, 21):  # applied before the archiver started: only 16..20 are still in the ring
        applier.apply(o)
    arch.start()
    _wait(lambda: bool(covered_ranges(d)))
    arch.stop()
    assert arch.gaps == [(1, 15)]
    assert covered_ranges(d) == [(16, 20)]


def test_listener_never_blocks_the_apply_thread(tmp_path) -> None:
    applier = FakeLog(max_entries=100_000)
    arch = LogArchiver(applier, str(tmp_path / "a"), rows_per_segment=1_000_000, max_age_s=60)
    arch.start()
    t0 = time.perf_counter()
    for o in range(1, 5001):
        applier.apply(o)
    elapsed = time.perf_counter() - t0
    arch.stop()  # flushes what is pending
    assert covered_ranges(str(tmp_path / "a")) == [(1, 5000)]
    assert elapsed < 5
