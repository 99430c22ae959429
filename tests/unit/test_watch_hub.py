"""The watch hub: what a node that loads a snapshot does to its watchers."""

from nameserver.core.watch import WatchHub, resumable
from raftlog.history import AppliedEntry, EntryHistory
from raftlog.kvstate import Change


def applied(offset: int, key: str) -> AppliedEntry:
    return AppliedEntry(offset, 1, b"", (Change(offset=offset, type=5, key=key, old=None, new=b"v"),))


def test_a_snapshot_load_cuts_every_watcher_off_after_what_it_was_owed() -> None:
    hub = WatchHub()
    a, b = hub.subscribe(("kv/a/",)), hub.subscribe(("kv/",))
    assert a is not None and b is not None
    hub.on_entry(applied(5, "kv/a/x"))
    hub.on_reset(900)  # the entries between 5 and 900 never passed through this node one by one
    hub.on_entry(applied(901, "kv/a/y"))
    for w in (a, b):
        assert w.cut_off and w.reset_at == 900
        assert w.pending.qsize() == 1 and w.pending.get().offset == 5  # owed before the reset: still sent
    assert len(hub) == 0 and hub.cut_off_total == 2


def test_a_watch_is_resumable_from_a_history_while_it_holds_the_start() -> None:
    """What a worker asks before serving a watch from its replica's history (nameserver/worker.py): a
    start older than the ring goes to the core; near the oldest kept, only while the ring drops entries."""
    history = EntryHistory(max_entries=3)
    history.reset(10)  # a replica that loaded a snapshot at offset 10
    for offset in (11, 12):
        history.append(applied(offset, "kv/a/x"))
    assert resumable(history, 0) and resumable(history, 10, margin=2) and not resumable(history, 9)
    for offset in (13, 14, 15):  # the ring is full: each append drops the oldest (kept: 13..15)
        history.append(applied(offset, "kv/a/x"))
    assert resumable(history, 12) and not resumable(history, 11)
    assert not resumable(history, 12, margin=2) and resumable(history, 14, margin=2)
