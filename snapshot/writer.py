"""Writing one snapshot file from a stream of items, in bounded memory, into a compact LMDB file.

LMDB files stay compact only when keys are appended in order: random inserts committed in batches
leave a file ~3.5x the data and dirty most of the B-tree in every batch (a second in-memory copy of
the state). So items are read in chunks of `chunk_items`:
  - while the input arrives sorted, chunks are appended straight into the output (one pass);
  - otherwise each chunk is sorted and written as a run to a plain scratch file, and the runs are
    merged (heapq.merge over an mmap of the scratch file) into the output, again by appends.
Either way the data checksum is computed on the ordered stream as it goes into the output, and memory
holds one chunk at a time.
"""

from __future__ import annotations

import heapq
import mmap
import os
import struct
import time
from collections.abc import Iterable, Iterator
from operator import itemgetter
from pathlib import Path
from typing import BinaryIO

import lmdb

from snapshot.format import DATA_DB, ITEM_HEADER, META_DB, Header, StreamHash, append_trailer, header_checksum

Item = tuple[str, bytes, int, int]
Pair = tuple[bytes, bytes]  # (key utf-8, ITEM_HEADER + value) as stored
_U64_LIMIT = 1 << 64
_U32_LIMIT = 1 << 32
_RECORD = struct.Struct(">II")  # scratch run record: key length, value length
_ITEM_ERRORS = (TypeError, ValueError, AttributeError, struct.error, UnicodeError)
_first = itemgetter(0)


# ---- input validation (the slow explanations run only after the fast path failed) ------------------


def check_position(offset: object, term: object, digest: object, meta: object) -> None:
    """Raise TypeError/ValueError naming the bad argument of a snapshot write."""
    for name, value in (("offset", offset), ("term", term)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if not 0 <= value < _U64_LIMIT:
            raise ValueError(f"{name} must be in [0, 2**64), got {value}")
    if not isinstance(digest, str):
        raise TypeError(f"digest must be a str, got {type(digest).__name__}")
    if not digest.isascii() or not digest.isprintable() or len(digest) > 1024:
        raise ValueError(f"digest must be printable ASCII of at most 1024 chars, got {digest[:80]!r}")
    if not isinstance(meta, bytes | bytearray | memoryview):
        raise TypeError(f"meta must be bytes, got {type(meta).__name__}")


def _item_error(index: int, item: object, cause: Exception | None, max_key: int) -> Exception:
    """Explain why item number `index` was rejected."""
    where = f"item {index}"
    if not isinstance(item, tuple | list) or len(item) != 4:
        return TypeError(f"{where}: expected a (key, value, version, type) tuple, got {item!r:.80}")
    key, value, version, rtype = item
    if not isinstance(key, str):
        return TypeError(f"{where}: key must be a str, got {type(key).__name__}")
    where = f"{where} (key {key[:80]!r})"
    kb = key.encode("utf-8", "surrogatepass")
    if not kb:
        return ValueError(f"{where}: key must not be empty")
    if len(kb) > max_key:
        return ValueError(f"{where}: key is {len(kb)} bytes in utf-8, the limit is {max_key}")
    if not isinstance(value, bytes | bytearray | memoryview):
        return TypeError(f"{where}: value must be bytes, got {type(value).__name__}")
    for name, v, limit in (("version", version, _U64_LIMIT), ("type", rtype, _U32_LIMIT)):
        if not isinstance(v, int) or isinstance(v, bool):
            return TypeError(f"{where}: {name} must be an int, got {type(v).__name__}")
        if not 0 <= v < limit:
            return ValueError(f"{where}: {name} must be in [0, {limit}), got {v}")
    return ValueError(f"{where}: rejected ({cause})")


def _chunks(items: Iterable[Item], size: int, max_key: int) -> Iterator[tuple[list[Pair], bool]]:
    """Encoded (key, value) chunks of up to `size` items, each with whether it arrived sorted."""
    pack = ITEM_HEADER.pack
    chunk: list[Pair] = []
    in_order, prev = True, b""
    for index, item in enumerate(items):
        try:
            key, value, version, rtype = item
            kb = key.encode()
            vb = pack(version, rtype) + value
        except _ITEM_ERRORS as exc:
            raise _item_error(index, item, exc, max_key) from exc
        if not 0 < len(kb) <= max_key:
            raise _item_error(index, item, None, max_key)
        in_order = in_order and kb > prev
        prev = kb
        chunk.append((kb, vb))
        if len(chunk) >= size:
            yield chunk, in_order
            chunk, in_order = [], True
    if chunk:
        yield chunk, in_order


def _duplicate(key: bytes) -> ValueError:
    return ValueError(f"duplicate key {key.decode(errors='replace')[:80]!r}")


# ---- scratch runs --------------------------------------------------------------------------------


class _Runs:
    """Sorted runs of pairs, back to back in one plain scratch file (length-prefixed records)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file: BinaryIO | None = None  # opened by the first run: sorted input never needs it
        self.bounds: list[tuple[int, int]] = []

    def __bool__(self) -> bool:
        return bool(self.bounds)

    def add(self, pairs: Iterable[Pair]) -> None:
        if self.file is None:
            self.file = open(self.path, "r+b")  # noqa: SIM115 (closed in close(): it spans many calls)
        start = self.file.tell()
        pack, write = _RECORD.pack, self.file.write
        for kb, vb in pairs:
            write(pack(len(kb), len(vb)) + kb + vb)
        self.bounds.append((start, self.file.tell()))

    def merged(self) -> Iterator[Pair]:
        """All pairs in key order; raises on a key present twice."""
        assert self.file is not None, "no runs to merge"
        self.file.flush()
        with mmap.mmap(self.file.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            readers = [self._read(mm, start, end) for start, end in self.bounds]
            prev = None
            for kb, vb in heapq.merge(*readers, key=_first):
                if kb == prev:
                    raise _duplicate(kb)
                prev = kb
                yield kb, vb

    @staticmethod
    def _read(mm: mmap.mmap, pos: int, end: int) -> Iterator[Pair]:
        unpack, size = _RECORD.unpack_from, _RECORD.size
        while pos < end:
            klen, vlen = unpack(mm, pos)
            pos += size
            kb = mm[pos:pos + klen]
            pos += klen
            yield kb, mm[pos:pos + vlen]
            pos += vlen

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


# ---- the writer ----------------------------------------------------------------------------------


def _open_writable(path: Path, map_size: int) -> lmdb.Environment:
    # lock=False: the temp file is private to this writer, so no lock file is needed (or left behind).
    # sync off: one fsync at the end is enough because the file only counts once renamed.
    return lmdb.open(os.fspath(path), subdir=False, map_size=map_size, max_dbs=2, lock=False,
                     sync=False, metasync=False, readahead=False, create=True)


class _Output:
    """The LMDB file being built: ordered appends only, one write transaction per chunk."""

    def __init__(self, path: Path, map_size: int) -> None:
        self.path, self.map_size = path, map_size
        self._open()

    def _open(self) -> None:
        self.env = _open_writable(self.path, self.map_size)
        self.db = self.env.open_db(DATA_DB)
        self.stream = StreamHash()

    def append(self, pairs: Iterable[Pair]) -> None:
        with self.env.begin(write=True, db=self.db) as txn:
            put, add = txn.put, self.stream.add
            for kb, vb in pairs:
                if not put(kb, vb, append=True):  # LMDB refuses (returns False) a key not above the last
                    raise AssertionError(f"snapshot writer bug: out-of-order append of {kb[:80]!r}")
                add(kb, vb)

    def read_back(self) -> Iterator[Pair]:
        with self.env.begin(db=self.db) as txn:
            yield from txn.cursor()

    def reset(self) -> None:
        """Start over with an empty file (its pages would otherwise stay as free space)."""
        self.env.close()
        os.truncate(self.path, 0)
        self._open()

    def finish(self, header: Header) -> None:
        """Write the meta sub-db last, then flush."""
        fields = header.fields()
        fields[b"header_checksum"] = header_checksum(fields).encode("ascii")
        with self.env.begin(write=True, db=self.env.open_db(META_DB)) as txn:
            for name, value in fields.items():
                txn.put(name, value)
        self.env.sync(True)

    def close(self) -> None:
        self.env.close()


class SnapshotWriter:
    """Builds one snapshot file at `out`, using `scratch` for sorted runs when the input is unordered."""

    def __init__(self, out: Path, scratch: Path, *, map_size: int, chunk_items: int) -> None:
        self.out_path, self.scratch_path = out, scratch
        self.map_size, self.chunk_items = map_size, chunk_items

    def write(self, offset: int, term: int, digest: str, items: Iterable[Item], meta: bytes) -> Header:
        """Write and seal `out` (not yet fsynced: the caller owns the file descriptor)."""
        out = _Output(self.out_path, self.map_size)
        runs = _Runs(self.scratch_path)
        try:
            self._load(out, items, runs)
            if runs:
                for chunk in _batched(runs.merged(), self.chunk_items):
                    out.append(chunk)
            header = Header(offset=offset, term=term, digest=digest, count=out.stream.count,
                            created_ms=time.time_ns() // 1_000_000, checksum=out.stream.hexdigest(),
                            meta=bytes(meta))
            out.finish(header)
        finally:
            out.close()
            runs.close()
        append_trailer(self.out_path)
        return header

    def _load(self, out: _Output, items: Iterable[Item], runs: _Runs) -> None:
        """Sorted input goes straight into `out`; from the first disorder on, into sorted runs."""
        last = b""
        for chunk, in_order in _chunks(items, self.chunk_items, out.env.max_key_size()):
            if not runs and in_order and chunk[0][0] > last:
                out.append(chunk)
                last = chunk[-1][0]
                continue
            if not runs and last:  # first disorder: what was appended so far becomes run 0
                runs.add(out.read_back())
                out.reset()
            chunk.sort(key=_first)  # duplicates end up adjacent: the merge reports them
            runs.add(chunk)


def _batched(pairs: Iterator[Pair], size: int) -> Iterator[list[Pair]]:
    chunk: list[Pair] = []
    for pair in pairs:
        chunk.append(pair)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
