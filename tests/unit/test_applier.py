"""The apply thread's ordering guarantees, on the real Applier (no Raft)."""

import threading

from raftlog import KVState, KVStateMachine
from raftlog.applier import Applier
from raftlog.codec import encode_entry
from raftlog.pb import entry_pb2


def entry(i: int) -> bytes:
    return encode_entry(entry_pb2.Entry(term=1, batches=[entry_pb2.Batch(
        records=[entry_pb2.Record(type=5, key=f"kv/ns/k{i}", value=str(i).encode())])]))


def test_an_entry_is_in_the_history_before_its_offset_is_published() -> None:
    """ReadLog and resuming watchers wake on the apply offset, then read the history: never a gap."""
    applier = Applier(KVStateMachine(KVState()), threading.RLock())
    applier.start()
    try:
        for i in range(1, 501):
            applier.enqueue_entry(i, entry(i))
            assert applier.wait_applied(i, 5)
            got = applier.history.after(i - 1, limit=1)
            assert got and got[0].offset == i, f"offset {i} published before it reached the history"
    finally:
        applier.stop()


def test_a_malformed_entry_applies_as_a_noop_and_apply_goes_on() -> None:
    kv = KVState()
    applier = Applier(KVStateMachine(kv), threading.RLock())
    applier.start()
    try:
        applier.enqueue_entry(1, b"\xff\xfe not protobuf")
        applier.enqueue_entry(2, entry(2))
        assert applier.wait_applied(2, 5)
        assert kv.get("kv/ns/k2") == b"2" and not applier.failed
    finally:
        applier.stop()


def test_listeners_have_an_entry_before_its_offset_is_published() -> None:
    """A watch stream's progress message says "nothing up to this offset is still owed": it reads the apply
    offset, then finds its queue empty. That holds only if every listener got the entry before the offset
    moved to it (before this order, a progress offset could pass an event still on its way)."""
    applier = Applier(KVStateMachine(KVState()), threading.RLock())
    seen: list[tuple[int, int]] = []
    applier.entry_listeners.append(lambda e: seen.append((e.offset, applier.apply_offset)))
    applier.start()
    try:
        for i in range(1, 201):
            applier.enqueue_entry(i, entry(i))
        assert applier.wait_applied(200, 5)
        assert [o for o, _ in seen] == list(range(1, 201))
        assert all(published < offset for offset, published in seen), "an offset was published before a listener"
    finally:
        applier.stop()
