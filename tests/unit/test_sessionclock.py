"""Session idleness by the leader's monotonic clock (nameserver/core/sessionclock.py), and expiry by it."""

from __future__ import annotations

from nameserver.core.sessionclock import SessionClock
from nameserver.pb import state_pb2
from nameserver.state import MetadataState, expire_sessions, keys
from raftlog.codec import encode_entry
from raftlog.history import AppliedEntry
from raftlog.pb import entry_pb2


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _entry(key: str, new: bytes | None) -> AppliedEntry:
    """An applied entry writing (or deleting) `key`: its bytes and its change, as the apply makes them."""
    op = entry_pb2.OP_PUT if new is not None else entry_pb2.OP_DELETE
    data = encode_entry(entry_pb2.Entry(batches=[entry_pb2.Batch(records=[
        entry_pb2.Record(type=keys.SESSION_TYPE, op=op, key=key, value=new or b"")])]))
    return AppliedEntry(offset=1, term=1, data=data, changes=((1, keys.SESSION_TYPE, key, None, new),))


def test_idle_counts_from_the_last_applied_write_or_the_last_leadership_whichever_is_later() -> None:
    clock = FakeClock()
    sc = SessionClock(clock)
    clock.now += 10
    assert sc.idle_ms("a") == 10_000  # never seen: idle since this node's start
    sc.on_entry(_entry(keys.session_key("a"), b"x"))
    clock.now += 3
    assert sc.idle_ms("a") == 3_000 and sc.idle_ms("b") == 13_000
    sc.restart()  # became leader: a full TTL for everyone
    clock.now += 1
    assert sc.idle_ms("a") == 1_000 and sc.idle_ms("b") == 1_000
    sc.on_entry(_entry(keys.session_key("a"), None))  # deleted: forgotten
    clock.now += 1
    assert sc.idle_ms("a") == 2_000


def test_expiry_uses_the_idle_measure_given_never_the_records_wall_clock() -> None:
    state = MetadataState()
    stamp = state_pb2.ClientSession(last_seq=1, last_write_ms=0).SerializeToString()  # wall clock: 1970
    state.restore(3, [(keys.session_key(cid), stamp, i + 1, keys.SESSION_TYPE)
                      for i, cid in enumerate(("mid", "new", "old"))])
    assert len(state.session_book.ids()) == 3
    idle = {"old": 90_000.0, "mid": 50_000.0, "new": 1_000.0}
    doomed = {r.key for r in expire_sessions(state, idle.__getitem__, 60_000).batch.records}
    assert doomed == {keys.session_key("old")}  # the 1970 stamps decide nothing
    most_idle = {r.key for r in expire_sessions(state, idle.__getitem__, 10_000, limit=1).batch.records}
    assert most_idle == {keys.session_key("old")}  # at most `limit`, the most idle first


def test_only_an_entry_writing_a_session_key_moves_its_clock() -> None:
    """Entries as the apply makes them (their bytes and changes): one without a session key (a registration's,
    one whose value only mentions the prefix) notes nothing; one among other records notes its session."""
    from raftlog.kvstate import KVState
    clock = FakeClock()
    sc = SessionClock(clock)
    kv = KVState()

    def applied(*records: tuple[str, bytes]) -> AppliedEntry:
        entry = entry_pb2.Entry(batches=[entry_pb2.Batch(records=[
            entry_pb2.Record(type=keys.record_type_of(k), op=entry_pb2.OP_PUT, key=k, value=v) for k, v in records])])
        changes: list = []
        kv.apply_entry(kv.offset + 1, entry, changes)
        return AppliedEntry(kv.offset, 1, encode_entry(entry), tuple(changes))

    clock.now += 10
    sc.on_entry(applied((keys.live_key("10.0.0.1:10911"), b"l"), (keys.kv_key("ns", "k"), b"session/a")))
    assert sc.idle_ms("a") == 10_000  # nothing noted
    sc.on_entry(applied((keys.kv_key("ns", "k"), b"v2"), (keys.session_key("a"), b"x")))
    clock.now += 2
    assert sc.idle_ms("a") == 2_000 and sc.idle_ms("b") == 12_000
