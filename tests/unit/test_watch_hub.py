"""The watch hub: what a node that loads a snapshot does to its watchers."""

from nameserver.core.watch import WatchHub, resumable
from raftlog.history import AppliedEntry, EntryHistory


def applied(offset: int, key: str) -> AppliedEntry:
    return AppliedEntry(offset, 1, b"", ((offset, 5, key, None, b"v"),))  # a change as the apply makes it


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


def test_a_watcher_gets_the_changes_under_its_prefixes_as_events() -> None:
    """An entry's changes as the apply makes them, (offset, type, key, old, new): each one under a prefix becomes
    an event of its type, key, new value (deleted when none) and version (its offset)."""
    from nameserver.core.watch import to_events
    changes = ((7, 5, "kv/a/x", None, b"v1"), (7, 5, "kv/b/y", b"v", b"w"), (7, 3, "topic/T/b", b"q", None),
               (7, 5, "kv/a/z", b"old", None))
    events = to_events(changes, ("kv/a/", "topic/"))
    assert [(e.type, e.deleted, e.key, e.value, e.version) for e in events] == [
        (5, False, "kv/a/x", b"v1", 7), (3, True, "topic/T/b", b"", 7), (5, True, "kv/a/z", b"", 7)]
    hub = WatchHub()
    w = hub.subscribe(("kv/b/",))
    assert w is not None
    hub.on_entry(AppliedEntry(7, 1, b"", changes))
    got = w.pending.get_nowait()
    assert got.offset == 7 and [(e.key, e.value) for e in got.events] == [("kv/b/y", b"w")]
