"""Session idleness by the leader's monotonic clock (nameserver/core/sessionclock.py), and expiry by it."""

from __future__ import annotations

from nameserver.core.sessionclock import SessionClock
from nameserver.pb import state_pb2
from nameserver.state import MetadataState, expire_sessions, keys
from raftlog.history import AppliedEntry


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _entry(key: str, new: bytes | None) -> AppliedEntry:
    return AppliedEntry(offset=1, term=1, data=b"", changes=((1, keys.SESSION_TYPE, key, None, new),))  # as applied


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
