"""KVState's apply of records (raftlog/kvstate.py): what each record leaves in the map, the change feed, the
listeners and the digest, with and without the digest kept entry by entry."""

from __future__ import annotations

import pytest

from raftlog.digest import digest_hex, digest_of
from raftlog.kvstate import Change, KVState
from raftlog.pb import entry_pb2


def entry(*records: tuple[int, int, str, bytes]) -> entry_pb2.Entry:
    """One batch of (type, op, key, value) records."""
    batch = entry_pb2.Batch()
    for rtype, op, key, value in records:
        batch.records.add(type=rtype, op=op, key=key, value=value)
    return entry_pb2.Entry(batches=[batch])


PUT, DELETE = entry_pb2.OP_PUT, entry_pb2.OP_DELETE


@pytest.mark.parametrize("digests", [True, False])
def test_each_record_leaves_its_value_version_and_type_and_reports_its_change(digests: bool) -> None:
    kv = KVState(digests=digests)
    heard: list[tuple[int, str, bytes | None, bytes | None]] = []
    kv.listeners.append(lambda rtype, key, old, new: heard.append((rtype, key, old, new)))

    changes: list[Change] = []
    kv.apply_entry(1, entry((3, PUT, "topic/T/b", b"q1"), (2, PUT, "live/a", b"l1")), changes)
    assert sorted(kv.items()) == [("live/a", b"l1", 1, 2), ("topic/T/b", b"q1", 1, 3)]
    assert changes == [Change(1, 3, "topic/T/b", None, b"q1"), Change(1, 2, "live/a", None, b"l1")]
    assert changes[0].type == 3 and changes[0].key == "topic/T/b"

    changes = []
    # the same value again: the version moves, nothing changes; a new value; a delete; a delete of nothing
    kv.apply_entry(2, entry((3, PUT, "topic/T/b", b"q1"), (2, PUT, "live/a", b"l2"), (3, DELETE, "topic/T/b", b""),
                            (3, DELETE, "topic/U/b", b"")), changes)
    assert sorted(kv.items()) == [("live/a", b"l2", 2, 2)]
    assert changes == [Change(2, 2, "live/a", b"l1", b"l2"), Change(2, 3, "topic/T/b", b"q1", None)]
    assert heard == [(3, "topic/T/b", None, b"q1"), (2, "live/a", None, b"l1"), (2, "live/a", b"l1", b"l2"),
                     (3, "topic/T/b", b"q1", None)]
    assert kv.offset == 2
    if digests:
        assert kv.digest_hex == digest_hex(digest_of([("live/a", b"l2")]))
    else:
        with pytest.raises(RuntimeError):
            _ = kv.digest_hex  # none kept past the last restore
