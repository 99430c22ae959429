"""The watch hub: what a node that loads a snapshot does to its watchers."""

from nameserver.core.watch import WatchHub
from raftlog.history import AppliedEntry
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
