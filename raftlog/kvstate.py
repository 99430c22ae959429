"""The generic, deterministic core of the replicated state: key -> (value, version).

Records in, state out: no clocks, no threads, no I/O. A record is an upsert or a delete of exactly
its key; a key's version is the offset of the entry that last wrote it. A batch is atomic: if any
precondition fails, none of its records apply and the result says which key failed. Applying the
same entries in the same order gives the same map and the same digest on every replica.

Applications (the nameserver) add derived indexes through `listeners`, called once per changed key.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

from raftlog.digest import digest_hex, digest_of, key_prefix, new_pair_hasher, pair_hash, prefixed_hash
from raftlog.pb import entry_pb2

# A listener sees (record type, key, old value or None, new value or None) for every change.
ChangeListener = Callable[[int, str, bytes | None, bytes | None], None]


class Change(NamedTuple):
    """One applied key change: the layout of the change feed's tuples, (offset, type, key, old, new).

    The feed (apply_entry's `changes`, AppliedEntry.changes) carries plain tuples of this layout, read by
    position: one is made for every changed record on every replica's apply thread, and a Change cost three
    times a plain tuple to make (0.19 against 0.05 us: tuple.__new__'s call and a second object; a frozen
    dataclass's __init__ cost twice that again). Change(*change) names the fields where that reads better."""

    offset: int
    type: int
    key: str
    old: bytes | None
    new: bytes | None


ChangeTuple = tuple[int, int, str, bytes | None, bytes | None]  # a change as the feed carries it (Change's layout)

# Equal values share one bytes object: a broker's thousands of topics mostly carry byte-identical queue
# datas (~60 bytes each, a million times over: ~60 MiB of each copy of the state, and a node with two
# worker processes holds three). And equal items, (value, version, type), share one tuple: a broker's topics
# registered by one entry have all three equal (64 bytes a key, another ~60 MiB a copy at a million). The
# pool of values to share is bounded: emptied when it holds this many.
SHARED_VALUES = 4096

Item = tuple[bytes, int, int]  # a key's (value, version, type)


class ValuePool:
    """Hands out one object per distinct value among those seen recently, and the last item made with each.

    The rule is `item`'s; the loops that make items by the thousand (apply_batch, shared_items) run it as two
    steps: `get(value)`, the last item made with an equal value, taken as it is when its version and type are
    the asked ones (most of a registration's records: a broker's topics carry equal queue datas), else
    `make(value, version, type, got)`. A call a record was ~2 % of a replica's apply, and a restart's
    million calls a tenth of it."""

    def __init__(self) -> None:
        self._pool: dict[bytes, Item] = {}  # a value -> the last item made with it (which holds the shared value)
        self.get = self._pool.get  # the dict is only ever cleared, never replaced: its get stays bound

    def item(self, value: bytes, version: int, rtype: int) -> Item:
        """The item (value, version, type), the one made last with this value if it is equal."""
        got = self._pool.get(value)
        if got is not None and got[1] == version and got[2] == rtype:
            return got
        return self.make(value, version, rtype, got)

    def make(self, value: bytes, version: int, rtype: int, got: Item | None) -> Item:
        """A new item (value, version, type), given `got`, what get(value) gave (not an equal item): it holds the
        pool's equal value when there is one, and is the one given for the value from now on. The pool is
        emptied when it holds SHARED_VALUES."""
        pool = self._pool
        if got is None:
            if len(pool) >= SHARED_VALUES:
                pool.clear()
        else:
            value = got[0]
        pool[value] = item = (value, version, rtype)
        return item

    def shared_items(self, items: Iterable[tuple[str, bytes, int, int]]) -> dict[str, Item]:
        """A restore's map, key -> item, each made as item() makes it (sharing the items cut 61 MiB of a copy
        and a few % of the time, docs/benchmarks.md)."""
        get, make = self.get, self.make
        values: dict[str, Item] = {}
        for key, value, version, rtype in items:
            item = get(value)
            if item is None or item[1] != version or item[2] != rtype:
                item = make(value, version, rtype, item)
            values[key] = item
        return values


DIGEST_HISTORY = 50_000  # entries whose digest a node can still give (an audit's cut must be newer)
# The pair hashes kept of the pairs last written, key -> (value, pair_hash(key, value), key_prefix(key)): a key
# changed again XORs its old pair out with the hash made when that pair went in, instead of hashing it again,
# and hashes its new pair without encoding the key again (one blake2b a changed record instead of two: a
# registration rewrites the same keys each time). Bounded: emptied when it holds this many (a hash not kept is
# made again, the same value: the digest does not depend on what is kept). ~200 bytes a key kept.
PAIR_HASHES_KEPT = 8192
_Kept = tuple[bytes, int, bytes]


class KVState:
    """The replicated map. Not thread-safe: one apply thread writes, readers hold the owner's lock.

    `digests`: keep the digest up to date entry by entry. A copy that only serves reads and is never
    audited (a node's worker processes' replicas) passes False: its digest is right as a restore left it
    (a snapshot's is still checked) and asking for it after an entry raises."""

    def __init__(self, digests: bool = True) -> None:
        self._values: dict[str, tuple[bytes, int, int]] = {}  # key -> (value, version, type)
        self._digest = 0
        self._keeps_digest = digests
        self._digest_offset = 0  # the offset the digest is right at, when not kept entry by entry
        self.offset = 0  # the last offset applied (the apply offset)
        self.listeners: list[ChangeListener] = []
        self._values_pool = ValuePool()
        self._pair_hashes: dict[str, _Kept] = {}  # see PAIR_HASHES_KEPT
        # (offset, digest) after each recent entry: the digest at a past offset, for auditing a live
        # node at the offset an exported log ends (a consistent cut). Not part of the state.
        self._digests: deque[tuple[int, int]] = deque([(0, 0)], maxlen=DIGEST_HISTORY)

    # ---- reads -------------------------------------------------------------------------------

    def get(self, key: str) -> bytes | None:
        item = self._values.get(key)
        return item[0] if item else None

    def version(self, key: str) -> int:
        item = self._values.get(key)
        return item[1] if item else 0

    def __contains__(self, key: str) -> bool:
        return key in self._values

    def __len__(self) -> int:
        return len(self._values)

    @property
    def digest(self) -> int:
        self._digest_is_kept(self.offset)
        return self._digest

    def _digest_is_kept(self, offset: int) -> None:
        if not self._keeps_digest and offset != self._digest_offset:
            raise RuntimeError(f"this state keeps no digest past offset {self._digest_offset} (digests=False)")

    @property
    def digest_hex(self) -> str:
        return digest_hex(self.digest)

    def digest_at(self, offset: int) -> str | None:
        """The digest right after applying `offset`, or None when that is older than the ring. The
        caller checks that `offset` is applied (offsets without entries of ours, pysyncobj's own, take
        the digest of the last entry before them)."""
        digests = self._digests
        if not digests or offset < digests[0][0]:
            return None
        self._digest_is_kept(offset)
        i = bisect.bisect_right(digests, offset, key=lambda item: item[0])
        return digest_hex(digests[i - 1][1])

    @property
    def first_digest_offset(self) -> int:
        """The oldest offset digest_at() answers for."""
        return self._digests[0][0] if self._digests else self.offset

    def items(self) -> Iterator[tuple[str, bytes, int, int]]:
        """(key, value, version, type) for every live key, in no particular order."""
        for key, (value, version, rtype) in self._values.items():
            yield key, value, version, rtype

    def freeze(self) -> dict[str, tuple[bytes, int, int]]:
        """A point-in-time copy for a snapshot writer (values are immutable, so a shallow copy)."""
        return dict(self._values)

    # ---- writes ------------------------------------------------------------------------------

    def apply_entry(self, offset: int, entry: entry_pb2.Entry, changes: list[ChangeTuple] | None = None
                    ) -> list[entry_pb2.BatchResult]:
        """Apply one log entry at `offset`; never raises on well-formed protobuf input. `changes`: each change
        is added to it, (offset, type, key, old, new) (Change's layout)."""
        results = self.apply_records(offset, entry, changes)
        self.entry_applied(offset)
        return results

    def apply_records(self, offset: int, entry: entry_pb2.Entry, changes: list[ChangeTuple] | None = None
                      ) -> list[entry_pb2.BatchResult]:
        """apply_entry's records, the offset left where it was: entry_applied(offset) moves it (an owner that
        updates what it derives from the changes in between: readers that read the offset first, then what is
        derived, without the lock, find the derived state as new as the offset; nameserver/core/routecache.py)."""
        # Repeated fields are sliced, not iterated: a upb container's iteration ends in an IndexError made
        # with a formatted message (~700 instructions a loop, four loops an entry on every replica).
        return [self.apply_batch(offset, batch, changes) for batch in entry.batches[:]]

    def entry_applied(self, offset: int) -> None:
        """The entry at `offset` is in (apply_records): the offset moves to it, and its digest is kept."""
        self.offset = offset
        if self._keeps_digest:
            self._digests.append((offset, self._digest))

    def apply_batch(self, offset: int, batch: entry_pb2.Batch, changes: list[ChangeTuple] | None = None
                    ) -> entry_pb2.BatchResult:
        values = self._values
        preconditions = batch.preconditions  # read once: each read makes a new container object
        for pre in preconditions[:] if preconditions else ():
            key = pre.key
            item = values.get(key)  # version(key), its call inlined (two a registration)
            current = item[1] if item else 0
            if current != pre.version:
                return entry_pb2.BatchResult(applied=False, failed_key=key, failed_key_version=current)
        # One loop over the records, each record's work inline (a method call per record was ~2% of a
        # replica's apply), each field read once: reading a protobuf field makes a new object every time. The
        # digest is summed in a local and stored once the records are in (finally: as far as they went).
        listeners, hashes = self.listeners, self._pair_hashes
        pooled, make = self._values_pool.get, self._values_pool.make
        keeps_digest, delete = self._keeps_digest, entry_pb2.OP_DELETE
        append = None if changes is None else changes.append
        new_hasher, from_bytes = new_pair_hasher, int.from_bytes
        digest = self._digest
        try:
            for rec in batch.records[:]:
                key = rec.key
                old_item = values.get(key)
                if rec.op == delete:
                    if old_item is None:
                        continue  # its type not even read (a registration's delete of filter servers it never had)
                    rtype = rec.type
                    del values[key]
                    old = old_item[0]
                    if keeps_digest:
                        held = hashes.pop(key, None)
                        digest ^= held[1] if held is not None and held[0] == old else pair_hash(key, old)
                    new = None
                else:
                    # the pool's item (ValuePool.item in its two steps): the one made last with an equal value
                    # when its version and type are these, else a new one holding the shared value
                    new, rtype = rec.value, rec.type
                    item = pooled(new)
                    if item is None or item[1] != offset or item[2] != rtype:
                        item = make(new, offset, rtype, item)
                    new = item[0]
                    values[key] = item
                    if old_item is None:
                        old = None
                    else:
                        old = old_item[0]
                        if old == new:
                            continue  # version moves (it was written), the digest and indexes do not
                    if keeps_digest:
                        held = hashes.get(key)
                        if held is None:
                            prefix = key_prefix(key)
                            if old is not None:
                                digest ^= prefixed_hash(prefix, old)
                        else:  # the old pair's hash as kept when it went in (an equal value: the same hash)
                            prefix = held[2]
                            if old is not None:
                                digest ^= held[1] if held[0] == old else prefixed_hash(prefix, old)
                        hasher = new_hasher()  # prefixed_hash(prefix, new), its call inlined
                        hasher.update(prefix + new)
                        hashed = from_bytes(hasher.digest())
                        digest ^= hashed
                        if len(hashes) >= PAIR_HASHES_KEPT:
                            hashes.clear()
                        hashes[key] = (new, hashed, prefix)
                for listener in listeners:
                    listener(rtype, key, old, new)
                if append is not None:
                    append((offset, rtype, key, old, new))
        finally:
            self._digest = digest
        return entry_pb2.BatchResult(applied=True)

    def restore(self, offset: int, items: Iterable[tuple[str, bytes, int, int]], digest: int | None = None
                ) -> None:
        """Replace the whole state with a snapshot's (key, value, version, type) items.

        `digest`: the digest stamped in a snapshot whose checksums held, taken as is instead of hashing
        every pair (a million pairs cost a second; the caller checks it off the critical path).
        Items that can read themselves into the map (`into_map(item)`: a snapshot file's entries,
        snapshot/format.py Entries) do, with this state's items."""
        into_map = getattr(items, "into_map", None)
        values = self._values_pool.shared_items(items) if into_map is None else into_map(self._values_pool.item)
        self._digest = digest_of((k, v[0]) for k, v in values.items()) if digest is None else digest
        self._values = values
        self._pair_hashes.clear()  # right still (a hash is of its pair), but the replaced values go
        self.offset = self._digest_offset = offset
        self._digests.clear()
        self._digests.append((offset, self._digest))


class KVStateMachine:
    """A KVState seen as the apply thread's state machine (apply / freeze / restore).

    Applications with derived indexes override `restore` to rebuild them.
    """

    def __init__(self, kv: KVState) -> None:
        self.kv = kv

    def apply_entry(self, offset: int, entry: entry_pb2.Entry, changes: list[ChangeTuple]
                    ) -> list[entry_pb2.BatchResult]:
        return self.kv.apply_entry(offset, entry, changes)

    def freeze(self) -> dict[str, tuple[bytes, int, int]]:
        return self.kv.freeze()

    def snapshot_items(self, frozen: dict[str, tuple[bytes, int, int]]
                       ) -> Iterator[tuple[str, bytes, int, int]]:
        # Sorted (code point order = UTF-8 byte order): the LMDB writer appends sorted input directly,
        # measured 2.5x faster than unsorted. This runs on the snapshot writer thread.
        for k in sorted(frozen):
            v, ver, t = frozen[k]
            yield k, v, ver, t

    def restore(self, offset: int, items: Iterable[tuple[str, bytes, int, int]], digest_hex: str | None = None
                ) -> None:
        self.kv.restore(offset, items, None if digest_hex is None else int(digest_hex, 16))

    def set_offset(self, offset: int) -> None:
        self.kv.offset = offset

    @property
    def digest_hex(self) -> str:
        return self.kv.digest_hex
