"""One snapshot file: a single self-contained LMDB file (no lock file, no sub-directory).

Layout (format 1):
  sub-db "data": key utf-8 bytes -> ITEM_HEADER (version u64, type u32, big-endian) + value bytes
  sub-db "meta": format, offset, term, digest, count, created_ms (ASCII decimal / text),
                 checksum (blake2b-256 hex over the data stream in LMDB key order),
                 meta (the caller's opaque blob),
                 header_checksum (blake2b-256 hex over all the fields above, so meta damage is caught
                 by a cheap read_info too).
The data stream hashed by `checksum` is, for every entry in key order:
  u32 len(key) || key || u32 len(value) || value   (value includes ITEM_HEADER; big-endian lengths).
After LMDB's last page comes a 56-byte trailer: magic "RIP18SNP", format u32, reserved u32, the LMDB
byte count u64 and blake2b-256 of those bytes. LMDB ignores it (it reads only the pages its meta names);
verify checks it before LMDB walks any page, because LMDB aborts the process on some damaged pages.

This module reads files; writer.py writes them; store.py picks names, renames and prunes.
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from io import BufferedIOBase
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import lmdb

FORMAT_VERSION = 1
DATA_DB = b"data"
META_DB = b"meta"
ITEM_HEADER = struct.Struct(">QI")  # version u64, record type u32
_LEN = struct.Struct(">I")
T = TypeVar("T")
_META_FIELDS = (b"format", b"offset", b"term", b"digest", b"count", b"created_ms", b"checksum", b"meta")


class SnapshotCorrupt(Exception):
    """A snapshot file that cannot be trusted; `reason` says why in words."""

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        super().__init__(f"corrupt snapshot {os.fspath(path)}: {reason}")
        self.path = Path(path)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class SnapshotInfo:
    """What a snapshot file says about itself (its meta, never its data)."""

    path: Path
    offset: int
    term: int
    digest: str
    count: int
    created_ms: int
    size_bytes: int
    meta: bytes


@dataclass(frozen=True, slots=True)
class Header:
    """The meta sub-db's contents (the file's own checksum included)."""

    offset: int
    term: int
    digest: str
    count: int
    created_ms: int
    checksum: str
    meta: bytes

    def info(self, path: Path, size: int) -> SnapshotInfo:
        return SnapshotInfo(path=path, offset=self.offset, term=self.term, digest=self.digest,
                            count=self.count, created_ms=self.created_ms, size_bytes=size, meta=self.meta)

    def fields(self) -> dict[bytes, bytes]:
        return {
            b"format": str(FORMAT_VERSION).encode(),
            b"offset": str(self.offset).encode(),
            b"term": str(self.term).encode(),
            b"digest": self.digest.encode("ascii"),
            b"count": str(self.count).encode(),
            b"created_ms": str(self.created_ms).encode(),
            b"checksum": self.checksum.encode("ascii"),
            b"meta": self.meta,
        }


def header_checksum(fields: dict[bytes, bytes]) -> str:
    h = hashlib.blake2b(digest_size=32)
    for name in _META_FIELDS:
        value = fields[name]
        h.update(_LEN.pack(len(name)) + name + _LEN.pack(len(value)))
        h.update(value)
    return h.hexdigest()


class StreamHash:
    """The data checksum: fed entries in key order."""

    def __init__(self) -> None:
        self.h = hashlib.blake2b(digest_size=32)
        self.count = 0

    def add(self, key: bytes | memoryview, value: bytes | memoryview) -> None:
        pack = _LEN.pack
        self.h.update(pack(len(key)) + key + pack(len(value)) + value)  # one call: cheaper than four
        self.count += 1

    def hexdigest(self) -> str:
        return self.h.hexdigest()


# ---- reading ---------------------------------------------------------------------------------------

# A trailer after LMDB's last page. LMDB never reads past the last page its meta names, so the file
# stays a valid LMDB file, and verify can hash every byte before LMDB walks a single page: LMDB trusts
# its pages and aborts the whole process on some damage (a zeroed B-tree page trips an assert).
_TRAILER = struct.Struct(">8sIIQ32s")  # magic, format, reserved, LMDB byte count, blake2b-256 of them
_TRAILER_MAGIC = b"RIP18SNP"
_CHUNK = 1 << 20

# LMDB 0.9 meta pages (pages 0 and 1), 64-bit layout: a 16-byte page header (flags at +10), then
# magic u32 @16, version u32 @20, page size (free-db md_pad) u32 @40, last page u64 @136, txnid u64 @144.
_LMDB_MAGIC = 0xBEEFC0DE
_LMDB_DATA_VERSION = 1
_P_META = 0x08
_META_STRUCT = struct.Struct("<10xH4xII16xI92xQQ")  # flags, magic, version, psize, last_pg, txnid


def _hash_prefix(f: BufferedIOBase, length: int) -> bytes:
    """blake2b-256 of the first `length` bytes of an open file."""
    h = hashlib.blake2b(digest_size=32)
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    f.seek(0)
    left = length
    while left > 0:
        n = f.readinto(view[: min(left, _CHUNK)])
        if not n:
            break
        h.update(view[:n])
        left -= n
    return h.digest()


def append_trailer(path: Path) -> None:
    """Seal a finished LMDB file (closed by every writer) with its length and hash."""
    with open(path, "r+b") as f:
        size = os.fstat(f.fileno()).st_size
        digest = _hash_prefix(f, size)
        f.seek(size)
        f.write(_TRAILER.pack(_TRAILER_MAGIC, FORMAT_VERSION, 0, size, digest))


@dataclass(frozen=True, slots=True)
class _Layout:
    size: int  # the whole file
    lmdb_bytes: int  # the LMDB part, before the trailer


def inspect_file(path: Path, hash_bytes: bool) -> _Layout:
    """Check what can be checked without LMDB: meta pages, trailer, length (and every byte's hash).

    Runs before any lmdb.open: LMDB mmaps the file, so a truncated one would SIGBUS the process.
    """
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            layout = _check_structure(path, f, size)
            if hash_bytes:
                _check_hash(path, f, layout.lmdb_bytes)
            return layout
    except (FileNotFoundError, IsADirectoryError, PermissionError):
        raise  # a missing or unreadable path is not a damaged snapshot
    except OSError as exc:
        raise SnapshotCorrupt(path, f"cannot read file: {exc.strerror or exc}") from exc


def _check_structure(path: Path, f: BufferedIOBase, size: int) -> _Layout:
    first = f.read(_META_STRUCT.size)
    if len(first) < _META_STRUCT.size:
        raise SnapshotCorrupt(path, f"not an LMDB file: only {size} bytes")
    psize, _, _ = meta0 = _meta_page(path, first, 0)
    lmdb_bytes = _read_trailer(path, f, size)
    f.seek(psize)
    meta1 = _meta_page(path, f.read(_META_STRUCT.size), 1)
    _, last_pg, _ = max(meta0, meta1, key=lambda m: m[2])  # LMDB uses the meta with the newest txnid
    need = (last_pg + 1) * psize
    if need > lmdb_bytes:
        raise SnapshotCorrupt(path, f"LMDB meta needs {need} bytes but the trailer says {lmdb_bytes}")
    return _Layout(size=size, lmdb_bytes=lmdb_bytes)


def _read_trailer(path: Path, f: BufferedIOBase, size: int) -> int:
    if size < _TRAILER.size:
        raise SnapshotCorrupt(path, f"truncated: only {size} bytes")
    f.seek(size - _TRAILER.size)
    magic, fmt, _, lmdb_bytes, _ = _TRAILER.unpack(f.read(_TRAILER.size))
    if magic != _TRAILER_MAGIC:
        raise SnapshotCorrupt(path, "no snapshot trailer at the end (truncated, or not a snapshot file)")
    if fmt != FORMAT_VERSION:
        raise SnapshotCorrupt(path, f"unsupported snapshot format {fmt} (this code reads {FORMAT_VERSION})")
    if lmdb_bytes + _TRAILER.size != size:
        raise SnapshotCorrupt(path, f"truncated or extended: trailer says {lmdb_bytes + _TRAILER.size} "
                                    f"bytes, file has {size}")
    return lmdb_bytes


def _check_hash(path: Path, f: BufferedIOBase, lmdb_bytes: int) -> None:
    f.seek(lmdb_bytes)
    expected = _TRAILER.unpack(f.read(_TRAILER.size))[4]
    if _hash_prefix(f, lmdb_bytes) != expected:
        raise SnapshotCorrupt(path, "file checksum mismatch (bytes damaged)")


def _meta_page(path: Path, raw: bytes, which: int) -> tuple[int, int, int]:
    if len(raw) < _META_STRUCT.size:
        raise SnapshotCorrupt(path, f"truncated: no room for LMDB meta page {which}")
    flags, magic, version, psize, last_pg, txnid = _META_STRUCT.unpack(raw)
    if magic != _LMDB_MAGIC or not flags & _P_META:
        raise SnapshotCorrupt(path, f"not an LMDB file (bad magic in meta page {which})")
    if version != _LMDB_DATA_VERSION:
        raise SnapshotCorrupt(path, f"unsupported LMDB data version {version} in meta page {which}")
    if psize < 512 or psize > 65536 or psize & (psize - 1):
        raise SnapshotCorrupt(path, f"invalid LMDB page size {psize} in meta page {which}")
    return psize, last_pg, txnid


class SnapshotFile:
    """A read-only open snapshot file (lock=False: no lock file is created). Use as a context manager.

    full_check hashes every byte against the trailer before LMDB touches the file (what verify needs);
    without it only the cheap structural checks run (enough for reading the meta).
    """

    def __init__(self, path: str | os.PathLike[str], *, full_check: bool = False) -> None:
        self.path = Path(path)
        self.size = inspect_file(self.path, hash_bytes=full_check).size
        try:
            self.env = lmdb.open(os.fspath(self.path), subdir=False, readonly=True, lock=False, max_dbs=2,
                                 map_size=self.size)
        except lmdb.Error as exc:
            raise SnapshotCorrupt(self.path, f"LMDB cannot open it: {exc}") from exc
        try:
            self.data_db = self._sub_db(DATA_DB)
            self.meta_db = self._sub_db(META_DB)
            self.header = self._read_header()
        except BaseException:
            self.env.close()
            raise

    def __enter__(self) -> SnapshotFile:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self.env.close()

    def info(self) -> SnapshotInfo:
        return self.header.info(self.path, self.size)

    def _sub_db(self, name: bytes) -> Any:  # lmdb's _Database (private in its stubs)
        try:
            return self.env.open_db(name, create=False)
        except lmdb.NotFoundError as exc:
            raise SnapshotCorrupt(self.path, f"no {name.decode()!r} sub-db (not a snapshot file?)") from exc
        except lmdb.Error as exc:
            raise SnapshotCorrupt(self.path, f"cannot open sub-db {name.decode()!r}: {exc}") from exc

    def _read_header(self) -> Header:
        try:
            with self.env.begin(db=self.meta_db) as txn:
                fields = {name: txn.get(name) for name in (*_META_FIELDS, b"header_checksum")}
        except lmdb.Error as exc:
            raise SnapshotCorrupt(self.path, f"cannot read the meta sub-db: {exc}") from exc
        missing = [n.decode() for n, v in fields.items() if v is None]
        if missing:
            raise SnapshotCorrupt(self.path, f"meta is missing {', '.join(missing)}")
        present = {n: v for n, v in fields.items() if v is not None}
        if present[b"format"] != str(FORMAT_VERSION).encode():
            raise SnapshotCorrupt(self.path, f"unsupported snapshot format {present[b'format'][:20]!r} "
                                             f"(this code reads {FORMAT_VERSION})")
        stored = present.pop(b"header_checksum")
        if header_checksum(present).encode("ascii") != stored:
            raise SnapshotCorrupt(self.path, "meta checksum mismatch (meta damaged)")
        return self._parse_header(present)

    def _parse_header(self, f: dict[bytes, bytes]) -> Header:
        try:
            return Header(offset=int(f[b"offset"]), term=int(f[b"term"]),
                           digest=f[b"digest"].decode("ascii"), count=int(f[b"count"]),
                           created_ms=int(f[b"created_ms"]), checksum=f[b"checksum"].decode("ascii"),
                           meta=f[b"meta"])
        except ValueError as exc:
            raise SnapshotCorrupt(self.path, f"meta has a malformed field: {exc}") from exc

    def verify(self) -> SnapshotInfo:
        """Recompute the data checksum and count; raise SnapshotCorrupt on any difference."""
        stream = StreamHash()
        try:
            with self.env.begin(db=self.data_db, buffers=True) as txn:
                entries = txn.stat(self.data_db)["entries"]
                for key, value in txn.cursor():
                    self._add(stream, key, value)
        except lmdb.Error as exc:
            raise SnapshotCorrupt(self.path, f"LMDB error while reading data: {exc}") from exc
        self._check(stream, entries)
        return self.info()

    def _add(self, stream: StreamHash, key: bytes | memoryview, value: bytes | memoryview) -> None:
        if len(value) < ITEM_HEADER.size:
            reason = f"entry {stream.count} is {len(value)} bytes, shorter than its item header"
            raise SnapshotCorrupt(self.path, reason)
        stream.add(key, value)

    def _check(self, stream: StreamHash, entries: int) -> None:
        h = self.header
        if stream.count != h.count or entries != h.count:
            raise SnapshotCorrupt(self.path, f"count mismatch: meta says {h.count}, "
                                             f"data has {stream.count} (LMDB stat {entries})")
        if stream.hexdigest() != h.checksum:
            raise SnapshotCorrupt(self.path, "data checksum mismatch (data damaged)")

    def items(self, check: bool = False) -> Entries:
        """The entries, read once: streamed as (key, value, version, type) in key order, or read into a map
        (Entries.into_map); the file is closed when they are exhausted or closed.

        With `check`, the entries' count and checksum are computed as they are read and compared with
        the meta at the end: one pass instead of verify() and then a second one. A mismatch raises
        SnapshotCorrupt after the last item, so a caller that built state from the stream must drop it."""
        return Entries(self, check)

    def _stream(self, check: bool) -> Generator[tuple[str, bytes, int, int], None, None]:
        stream = StreamHash() if check else None
        try:
            # buffers=False: LMDB hands out bytes, which decode and slice with no memoryview in between
            # (measured at a million entries: 0.98 -> 0.55 s checked, 0.51 -> 0.27 s unchecked)
            with self.env.begin(db=self.data_db, buffers=False) as txn:
                entries = txn.stat(self.data_db)["entries"] if check else 0
                unpack, hsize = ITEM_HEADER.unpack_from, ITEM_HEADER.size
                if stream is None:
                    for key, value in txn.cursor():
                        version, rtype = unpack(value)
                        yield key.decode(), value[hsize:], version, rtype
                else:
                    update, pack = stream.h.update, _LEN.pack  # StreamHash.add, inlined: the hot loop
                    for key, value in txn.cursor():
                        if len(value) < hsize:
                            self._add(stream, key, value)  # raises, naming the entry
                        update(pack(len(key)) + key + pack(len(value)) + value)
                        stream.count += 1
                        version, rtype = unpack(value)
                        yield key.decode(), value[hsize:], version, rtype
            if stream is not None:
                self._check(stream, entries)
        except (lmdb.Error, struct.error, UnicodeDecodeError) as exc:
            raise SnapshotCorrupt(self.path, f"unreadable data entry: {exc}") from exc
        finally:
            self.close()


# Distinct stored entries Entries.into_map remembers the item of (emptied when full): a broker's thousands of
# topics registered by one entry are stored as equal bytes, and follow each other in key order.
_RECENT_ENTRIES = 4096


class Entries:
    """A snapshot file's entries (SnapshotFile.items): an iterator of (key, value, version, type), or, read
    at once, a key -> item map (into_map)."""

    def __init__(self, file: SnapshotFile, check: bool) -> None:
        self._file, self._check = file, check
        self._stream: Generator[tuple[str, bytes, int, int], None, None] | None = None

    def __iter__(self) -> Iterator[tuple[str, bytes, int, int]]:
        return self

    def __next__(self) -> tuple[str, bytes, int, int]:
        if self._stream is None:
            self._stream = self._file._stream(self._check)
        return next(self._stream)

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()  # closes the file
        else:
            self._file.close()

    def into_map(self, item: Callable[[bytes, int, int], T]) -> dict[str, T]:
        """key -> item(value, version, type) for every entry, in key order, the file closed after. An entry
        stored as the same bytes as a recent one takes that one's item: it is neither sliced nor unpacked, and
        item() runs once per distinct entry (a restore's map with equal items shared, built with a third less
        CPU than from the stream at a million entries: docs/benchmarks.md, session 21). Checked entries are
        read through the stream (its checksum)."""
        if self._check or self._stream is not None:
            return {key: item(value, version, rtype) for key, value, version, rtype in self}
        f = self._file
        recent: dict[bytes, T] = {}
        out: dict[str, T] = {}
        try:
            with f.env.begin(db=f.data_db, buffers=False) as txn:
                unpack, hsize, get = ITEM_HEADER.unpack_from, ITEM_HEADER.size, recent.get
                for key, stored in txn.cursor():
                    found = get(stored)
                    if found is None:
                        if len(recent) >= _RECENT_ENTRIES:
                            recent.clear()
                        version, rtype = unpack(stored)
                        recent[stored] = found = item(stored[hsize:], version, rtype)
                    out[key.decode()] = found
        except (lmdb.Error, struct.error, UnicodeDecodeError) as exc:
            raise SnapshotCorrupt(f.path, f"unreadable data entry: {exc}") from exc
        finally:
            f.close()
        return out
