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
    assert Change(*changes[0]).type == 3 and Change(*changes[0]).key == "topic/T/b"  # Change's layout

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


def test_a_restore_shares_equal_values_and_equal_items_and_reads_each_key_back() -> None:
    """A broker's topics registered by one entry have equal (value, version, type): a restore holds one tuple
    for all of them (64 bytes a key at a million), and one bytes object per equal value whatever its version."""
    kv = KVState()
    value = b"queue data"

    def copy() -> bytes:  # an equal value in another object, as each entry read from a file is
        return bytes(bytearray(value))

    kv.restore(9, [("topic/A/b", copy(), 5, 3), ("topic/B/b", copy(), 5, 3), ("topic/C/b", copy(), 7, 3),
                   ("topic/D/b", copy(), 5, 4), ("topic/E/b", b"other", 5, 3)])
    frozen = kv.freeze()
    assert frozen["topic/A/b"] is frozen["topic/B/b"]  # equal value, version and type: one item
    assert frozen["topic/C/b"] is not frozen["topic/A/b"] and frozen["topic/D/b"] is not frozen["topic/A/b"]
    assert len({id(item[0]) for key, item in frozen.items() if key != "topic/E/b"}) == 1  # one value object
    assert sorted(kv.items()) == [("topic/A/b", value, 5, 3), ("topic/B/b", value, 5, 3), ("topic/C/b", value, 7, 3),
                                  ("topic/D/b", value, 5, 4), ("topic/E/b", b"other", 5, 3)]
    assert kv.digest_hex == digest_hex(digest_of((k, v) for k, v, _, _ in kv.items()))


def test_records_applied_by_one_entry_with_equal_values_share_one_item() -> None:
    """The same sharing when the state is built by applying entries (a node that never restarted)."""
    kv = KVState()
    kv.apply_entry(3, entry((3, PUT, "topic/A/b", b"qd"), (3, PUT, "topic/B/b", b"qd"), (4, PUT, "topic/C/b", b"qd")))
    kv.apply_entry(4, entry((3, PUT, "topic/D/b", b"qd")))
    frozen = kv.freeze()
    assert frozen["topic/A/b"] is frozen["topic/B/b"]
    assert frozen["topic/C/b"] is not frozen["topic/A/b"] and frozen["topic/D/b"] is not frozen["topic/A/b"]
    assert sorted(kv.items()) == [("topic/A/b", b"qd", 3, 3), ("topic/B/b", b"qd", 3, 3), ("topic/C/b", b"qd", 3, 4),
                                  ("topic/D/b", b"qd", 4, 3)]


def test_a_changed_key_hashes_its_new_pair_only_and_the_digest_is_the_pairs_digest(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The old pair of a key changed again is XORed out with the hash kept when it went in (one blake2b a
    changed record, not two); a delete likewise. The digest stays the XOR of every live pair's hash."""
    import raftlog.kvstate as kvstate
    from raftlog.digest import key_prefix
    hashed: list[tuple[str, bytes]] = []
    keys = {key_prefix(k): k for k in ("topic/T/b", "live/a")}
    real_pair, real_prefixed, real_hasher = kvstate.pair_hash, kvstate.prefixed_hash, kvstate.new_pair_hasher

    def pair(key: str, value: bytes) -> int:
        hashed.append((key, value))
        return real_pair(key, value)

    def prefixed(prefix: bytes, value: bytes) -> int:
        hashed.append((keys[prefix], value))
        return real_prefixed(prefix, value)

    class Hasher:  # the apply loop's inlined prefixed_hash: a hasher given prefix + value at once
        def __init__(self) -> None:
            self.h = real_hasher()

        def update(self, data: bytes) -> None:
            prefix = next(p for p in keys if data.startswith(p))
            hashed.append((keys[prefix], data[len(prefix):]))
            self.h.update(data)

        def digest(self) -> bytes:
            return self.h.digest()

    monkeypatch.setattr(kvstate, "pair_hash", pair)
    monkeypatch.setattr(kvstate, "prefixed_hash", prefixed)
    monkeypatch.setattr(kvstate, "new_pair_hasher", Hasher)
    kv = KVState()
    kv.apply_entry(1, entry((3, PUT, "topic/T/b", b"q1"), (2, PUT, "live/a", b"l1")))
    assert hashed == [("topic/T/b", b"q1"), ("live/a", b"l1")]
    hashed.clear()
    kv.apply_entry(2, entry((3, PUT, "topic/T/b", b"q2"), (2, DELETE, "live/a", b"")))
    assert hashed == [("topic/T/b", b"q2")]  # q1's and l1's hashes were kept
    assert kv.digest_hex == digest_hex(digest_of([("topic/T/b", b"q2")]))


def test_the_digest_does_not_depend_on_which_pair_hashes_were_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever the kept hashes hold (emptied when full, replaced by a restore, a key rewritten with an equal
    value in another object), every entry's digest is the digest of the live pairs, as a state keeping none."""
    import random

    import raftlog.kvstate as kvstate
    monkeypatch.setattr(kvstate, "PAIR_HASHES_KEPT", 3)
    rng = random.Random(7)
    kv, plain = KVState(), {}
    for offset in range(1, 400):
        records = []
        for _ in range(rng.randint(1, 4)):
            key = f"topic/T{rng.randint(0, 6)}/b"
            if rng.random() < 0.25:
                records.append((3, DELETE, key, b""))
                plain.pop(key, None)
            else:
                value = bytes(bytearray(b"q%d" % rng.randint(0, 3)))  # equal values in other objects too
                records.append((3, PUT, key, value))
                plain[key] = value
        kv.apply_entry(offset, entry(*records))
        assert kv.digest == digest_of(plain.items()), offset
        if offset % 97 == 0:  # a restore of the same pairs, its digest recomputed
            kv.restore(offset, [(k, v, offset, 3) for k, v in plain.items()])
            assert kv.digest == digest_of(plain.items())


def test_a_pair_hash_is_blake2b_128_of_the_key_length_key_and_value() -> None:
    """The digest's definition (module docstring, and the Spark audit's): however the hash is made (one hasher
    copied for each, the apply loop's own hashing), it is blake2b-128 of len(key) || key || value, big-endian."""
    import hashlib

    from raftlog.digest import key_prefix, new_pair_hasher, pair_hash, prefixed_hash

    def defined(key: str, value: bytes) -> int:
        k = key.encode()
        return int.from_bytes(hashlib.blake2b(len(k).to_bytes(4, "big") + k + value, digest_size=16).digest(), "big")

    pairs = [("topic/T/b", b"q1"), ("live/10.0.0.1:10911", b"\x00" * 300), ("kv/ns/\u00e9", b""), ("k", b"v")]
    for _ in range(2):  # the hasher each starts from is never changed by one
        for key, value in pairs:
            hasher = new_pair_hasher()
            hasher.update(key_prefix(key) + value)
            assert pair_hash(key, value) == prefixed_hash(key_prefix(key), value) == defined(key, value) \
                == int.from_bytes(hasher.digest())
    want = 0
    for key, value in pairs:
        want ^= defined(key, value)
    assert digest_of(pairs) == want
    kv = KVState()
    kv.apply_entry(1, entry(*((3, PUT, key, value) for key, value in pairs)))
    kv.apply_entry(2, entry((3, PUT, "k", b"w"), (3, DELETE, "topic/T/b", b"")))
    assert kv.digest == want ^ defined("k", b"v") ^ defined("k", b"w") ^ defined("topic/T/b", b"q1")


def test_the_value_pool_makes_the_same_items_one_at_a_time_and_by_the_map(monkeypatch: pytest.MonkeyPatch) -> None:
    """ValuePool's rule is one: item() per value (a snapshot file's map), shared_items (a restore's stream) and
    the apply's two steps (get, then make) share the same values and items, and the pool is emptied when full."""
    import raftlog.kvstate as kvstate
    from raftlog.kvstate import ValuePool
    monkeypatch.setattr(kvstate, "SHARED_VALUES", 3)
    # two values written in turn at each of five versions (items and values shared), then five values in turn
    # (the pool emptied before a value comes back: from the fourth on, nothing shared)
    stream = [(f"k{i}", bytes(bytearray(b"v%d" % (i % 2 if i < 20 else i % 5))), 1 + i // 4, 3) for i in range(40)]

    def shape(items: list[tuple[bytes, int, int]]) -> list[tuple[int, int, bytes, int, int]]:
        """Each item as (index of the first item it is, of the first value object it holds, its fields)."""
        firsts = [next(j for j, other in enumerate(items) if other is item) for item in items]
        values = [next(j for j, other in enumerate(items) if other[0] is item[0]) for item in items]
        return [(f, v, *item) for f, v, item in zip(firsts, values, items, strict=True)]

    one = ValuePool()
    by_item = [one.item(value, version, rtype) for _, value, version, rtype in stream]
    by_map = list(ValuePool().shared_items(stream).values())
    two = ValuePool()
    by_steps = []
    for _, value, version, rtype in stream:
        got = two.get(value)
        equal = got is not None and got[1:] == (version, rtype)
        by_steps.append(got if equal else two.make(value, version, rtype, got))
    assert shape(by_item) == shape(by_map) == shape(by_steps)
    assert [item[1:] for item in by_item] == [(version, rtype) for _, _, version, rtype in stream]
    made = shape(by_item)
    assert made[2][:2] == (0, 0) and made[4][:2] == (4, 0)  # an equal item; an equal value at another version
    assert all(made[i][:2] == (i, i) for i in range(23, 40))  # gone from the pool before they came back
    assert len(one._pool) <= 3
