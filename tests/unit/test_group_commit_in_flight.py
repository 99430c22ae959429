"""Group commit's cap on entries in flight (raftlog/proposer.py; [raft] group_commit_in_flight): with the cap
reached, proposals wait and go out together in the next entry once an entry in flight has its result. A
stand-in append records each entry and holds its result until the test gives it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from nameserver.config import ConfigError, load
from raftlog.applier import Applied
from raftlog.binding import FAIL_REASON
from raftlog.codec import decode_entry
from raftlog.pb import entry_pb2
from raftlog.proposer import GroupCommitter


class _Waiter:
    def __init__(self) -> None:
        self.event = threading.Event()
        self.applied: Applied | None = None


class StandInApplier:
    def __init__(self) -> None:
        self.waiters: dict[str, _Waiter] = {}

    def register(self, request_id: str) -> _Waiter:
        w = self.waiters[request_id] = _Waiter()
        return w

    def unregister(self, request_id: str) -> None:
        self.waiters.pop(request_id, None)

    def apply(self, data: bytes, offset: int) -> None:
        for batch in decode_entry(data).batches:
            w = self.waiters.get(batch.request_id)
            if w is not None:
                w.applied = Applied(offset, entry_pb2.BatchResult(applied=True), 1)
                w.event.set()


class StandInLog:
    """Records the entries appended; each one's result comes when the test calls `commit`."""

    def __init__(self, applier: StandInApplier) -> None:
        self.applier = applier
        self.entries: list[tuple[bytes, Callable[[Any, int], None]]] = []
        self.appended = threading.Condition()

    def append(self, data: bytes, on_result: Callable[[Any, int], None]) -> None:
        with self.appended:
            self.entries.append((data, on_result))
            self.appended.notify_all()

    def wait_entries(self, n: int) -> None:
        with self.appended:
            assert self.appended.wait_for(lambda: len(self.entries) >= n, 10), f"{len(self.entries)} entries, not {n}"

    def commit(self, i: int) -> None:
        data, on_result = self.entries[i]
        on_result(None, FAIL_REASON.SUCCESS)
        self.applier.apply(data, i + 1)

    def batches(self, i: int) -> int:
        return len(decode_entry(self.entries[i][0]).batches)


def _propose(committer: GroupCommitter, key: str, done: list[str]) -> threading.Thread:
    def run() -> None:
        batch = entry_pb2.Batch()
        batch.records.add(key=key, value=b"v")
        committer.propose(batch, 10)
        done.append(key)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize("in_flight", [1, 2])
def test_proposals_past_the_cap_wait_and_share_the_next_entry(in_flight: int) -> None:
    applier = StandInApplier()
    log = StandInLog(applier)
    committer = GroupCommitter(applier, log.append, lambda: True, lambda: 1, linger_s=0.0,  # type: ignore[arg-type]
                               max_in_flight=in_flight)
    committer.start()
    done: list[str] = []
    try:
        threads = [_propose(committer, "k0", done)]
        log.wait_entries(1)
        for i in range(1, in_flight):  # up to the cap, each goes out at once, alone
            threads.append(_propose(committer, f"k{i}", done))
            log.wait_entries(i + 1)
        waiting = [_propose(committer, f"w{i}", done) for i in range(3)]
        time.sleep(0.3)
        assert len(log.entries) == in_flight  # the cap reached: nothing more is appended
        log.commit(0)  # one result: the waiting proposals go out, together
        log.wait_entries(in_flight + 1)
        assert log.batches(in_flight) == 3
        for i in range(1, in_flight + 1):
            log.commit(i)
        for t in threads + waiting:
            t.join(10)
        assert sorted(done) == sorted([f"k{i}" for i in range(in_flight)] + ["w0", "w1", "w2"])
        assert (committer.entries_appended, committer.batches_appended) == (in_flight + 1, in_flight + 3)
    finally:
        committer.stop()


def test_the_cap_is_read_from_the_raft_section_and_checked(tmp_path: Any) -> None:
    def config(extra: str) -> str:
        path = tmp_path / "n.toml"
        path.write_text('[node]\nraft_addr = "127.0.0.1:7001"\ngrpc_addr = "127.0.0.1:7002"\n'
                        f'data_dir = "{tmp_path}/d"\n[raft]\n{extra}\n')
        return str(path)

    assert load(config("")).group_commit_in_flight == 2
    assert load(config("group_commit_in_flight = 1")).group_commit_in_flight == 1
    with pytest.raises(ConfigError, match="raft.group_commit_in_flight"):
        load(config("group_commit_in_flight = 0"))
