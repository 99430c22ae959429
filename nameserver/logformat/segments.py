"""The exported log's on-disk format: Parquet segments of records, and state dumps.

This module is plain pyarrow (no Spark): the node's archiver, `nsctl log export`, `nsctl state dump` and
the synthetic generator write with it; the Spark jobs read what it writes.

Log segment `log-<first>-<last>.parquet` (offsets zero-padded to 20 digits, both inclusive): every
record of every entry with first <= offset <= last, one row per record, in log order. The name is the
coverage claim: no entry in that range is missing (offsets without rows are pysyncobj's own entries,
leader no-ops, or entries with no records). Segments never overlap and are never rewritten, so an
export resumes by filling the ranges no segment covers.

    offset, term, leader_time_ms   the entry's Raft index, its leader's term and wall clock
    entry_id                       blake2b-128 hex of the entry's bytes as replicated (equal on every replica)
    batch_index, request_id        the batch within the entry, and its request id
    preconditions                  the batch's (key, version) checks: on the batch's first record only
    record_index, type, type_name, op, key, value, value_json
                                   the record: op PUT or DELETE, value bytes, and their JSON rendering

State dump directory: `state.parquet` (key, value, version, type, type_name, value_json) plus
`_dump.json` (node, offset, digest, keys). Spark skips files starting with '_' or '.', so a dump
directory reads as one table, and a segment being written (a dot-file) is never read half-done.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from nameserver.logformat.records import type_name, value_json
from raftlog.codec import decode_entry
from raftlog.pb import entry_pb2

FORMAT = 1
PUT, DELETE = "PUT", "DELETE"

PRECONDITION = pa.struct([("key", pa.string()), ("version", pa.int64())])
LOG_SCHEMA = pa.schema([
    ("offset", pa.int64()),
    ("term", pa.int64()),
    ("leader_time_ms", pa.int64()),
    ("entry_id", pa.string()),
    ("batch_index", pa.int32()),
    ("request_id", pa.string()),
    ("preconditions", pa.list_(PRECONDITION)),
    ("record_index", pa.int32()),
    ("type", pa.int32()),
    ("type_name", pa.string()),
    ("op", pa.string()),
    ("key", pa.string()),
    ("value", pa.binary()),
    ("value_json", pa.string()),
])
STATE_SCHEMA = pa.schema([
    ("key", pa.string()),
    ("value", pa.binary()),
    ("version", pa.int64()),
    ("type", pa.int32()),
    ("type_name", pa.string()),
    ("value_json", pa.string()),
])

_SEGMENT_RE = re.compile(r"^log-(\d{20})-(\d{20})\.parquet$")
DUMP_FILE = "state.parquet"
DUMP_META = "_dump.json"


class SegmentOverlap(Exception):
    """A segment for (part of) this range exists already: segments are never written twice."""


# ---- names and coverage ------------------------------------------------------------------------


def segment_name(first: int, last: int) -> str:
    return f"log-{first:020d}-{last:020d}.parquet"


def parse_segment_name(name: str) -> tuple[int, int] | None:
    m = _SEGMENT_RE.match(os.path.basename(name))
    return (int(m.group(1)), int(m.group(2))) if m else None


def ranges_of(names: Iterable[str]) -> list[tuple[int, int]]:
    """The (first, last) ranges the segment files among `names` cover, sorted."""
    return sorted(r for r in (parse_segment_name(n) for n in names) if r is not None)


def covered_ranges(directory: str) -> list[tuple[int, int]]:
    if not os.path.isdir(directory):
        return []
    return ranges_of(os.listdir(directory))


def merge(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Adjacent or overlapping ranges merged: [(1, 5), (6, 9)] -> [(1, 9)]."""
    out: list[tuple[int, int]] = []
    for first, last in sorted(ranges):
        if out and first <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], last))
        else:
            out.append((first, last))
    return out


def uncovered(ranges: Iterable[tuple[int, int]], start: int, end: int | None) -> list[tuple[int, int | None]]:
    """The parts of [start, end] (end None: unbounded) that no range covers, in order."""
    gaps: list[tuple[int, int | None]] = []
    cursor = start
    for first, last in merge(ranges):
        if end is not None and cursor > end:
            break
        if last < cursor:
            continue
        if first > cursor:
            gaps.append((cursor, first - 1 if end is None else min(first - 1, end)))
        cursor = max(cursor, last + 1)
    if end is None:
        gaps.append((cursor, None))
    elif cursor <= end:
        gaps.append((cursor, end))
    return gaps


def overlaps(ranges: Iterable[tuple[int, int]], first: int, last: int) -> bool:
    return any(a <= last and first <= b for a, b in ranges)


# ---- log rows -----------------------------------------------------------------------------------


def entry_id(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


class LogRows:
    """Column buffers for log rows; entries go in whole, in offset order."""

    def __init__(self) -> None:
        self.columns: dict[str, list[Any]] = {name: [] for name in LOG_SCHEMA.names}
        self.entries = 0
        self.last_offset = 0

    def __len__(self) -> int:
        return len(self.columns["offset"])

    def add_entry(self, offset: int, term: int, data: bytes, entry: entry_pb2.Entry | None = None) -> int:
        """Add one entry's records (decoding `data` unless `entry` is given); returns rows added."""
        if offset <= self.last_offset:
            raise ValueError(f"entry {offset} is not after {self.last_offset}")
        if entry is None:
            entry = decode_entry(data)
        eid = entry_id(data)
        c = self.columns
        added = 0
        for b, batch in enumerate(entry.batches):
            pre = [{"key": p.key, "version": p.version} for p in batch.preconditions] or None
            for r, rec in enumerate(batch.records):
                put = rec.op != entry_pb2.OP_DELETE
                value = bytes(rec.value)
                c["offset"].append(offset)
                c["term"].append(term)
                c["leader_time_ms"].append(entry.leader_time_ms)
                c["entry_id"].append(eid)
                c["batch_index"].append(b)
                c["request_id"].append(batch.request_id)
                c["preconditions"].append(pre if r == 0 else None)
                c["record_index"].append(r)
                c["type"].append(rec.type)
                c["type_name"].append(type_name(rec.type))
                c["op"].append(PUT if put else DELETE)
                c["key"].append(rec.key)
                c["value"].append(value)
                c["value_json"].append(value_json(rec.type, value) if put else None)
                added += 1
        self.entries += 1
        self.last_offset = offset
        return added

    def table(self) -> pa.Table:
        return pa.table(self.columns, schema=LOG_SCHEMA)


def write_segment(directory: str, first: int, last: int, rows: LogRows) -> str:
    """Write rows as the segment covering [first, last]; SegmentOverlap if any segment covers part of it.

    Written to a dot-file, fsynced, then hard-linked to its name (which fails if the name exists), so a
    reader never sees half a segment and two writers never both succeed.
    """
    if last < first:
        raise ValueError(f"empty range {first}..{last}")
    if rows.entries and not first <= rows.last_offset <= last:
        raise ValueError(f"rows up to {rows.last_offset} are outside {first}..{last}")
    os.makedirs(directory, exist_ok=True)
    if overlaps(covered_ranges(directory), first, last):
        raise SegmentOverlap(f"{directory} already has a segment covering part of {first}..{last}")
    final = os.path.join(directory, segment_name(first, last))
    tmp = os.path.join(directory, f".{segment_name(first, last)}.{uuid.uuid4().hex[:8]}.tmp")
    meta = {"rip18.log.format": str(FORMAT), "rip18.log.first": str(first), "rip18.log.last": str(last),
            "rip18.log.entries": str(rows.entries)}
    table = rows.table().replace_schema_metadata(meta)
    try:
        pq.write_table(table, tmp, compression="zstd")
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        try:
            os.link(tmp, final)
        except FileExistsError:
            raise SegmentOverlap(f"{final} exists already") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return final


class SegmentWriter:
    """Cuts a stream of entries into segments: [start, ...] contiguous, each closed at an entry boundary.

    `flush(upto)` closes the current segment as covering up to `upto` (every entry <= upto must have
    been added); it writes nothing when no offset is left to claim.
    """

    def __init__(self, directory: str, start: int, rows_per_segment: int = 500_000) -> None:
        self.directory = directory
        self.next_first = start
        self.rows_per_segment = rows_per_segment
        self.rows = LogRows()
        self.written: list[str] = []
        self.entries = 0
        self.records = 0

    def add(self, offset: int, term: int, data: bytes, entry: entry_pb2.Entry | None = None) -> None:
        if offset < self.next_first:
            raise ValueError(f"entry {offset} is before {self.next_first}, already written")
        self.records += self.rows.add_entry(offset, term, data, entry)
        self.entries += 1
        if len(self.rows) >= self.rows_per_segment:
            self.flush(offset)

    def flush(self, upto: int) -> str | None:
        if upto < self.next_first:
            return None
        path = write_segment(self.directory, self.next_first, upto, self.rows)
        self.written.append(path)
        self.next_first = upto + 1
        self.rows = LogRows()
        return path


def read_segment_meta(path: str) -> dict[str, str]:
    meta = pq.read_metadata(path).metadata or {}
    return {k.decode(): v.decode() for k, v in meta.items() if k.startswith(b"rip18.")}


# ---- state dumps --------------------------------------------------------------------------------


@dataclass(frozen=True)
class DumpInfo:
    node: str
    offset: int
    digest: str
    keys: int


def write_dump(directory: str, items: Iterable[tuple[str, bytes, int, int]], offset: int, digest: str,
               node: str, batch_rows: int = 100_000) -> DumpInfo:
    """Write (key, value, version, type) items as a state dump; refuses a directory holding one."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, DUMP_FILE)
    if os.path.exists(path):
        raise FileExistsError(f"{path} exists already")
    count = 0
    with pq.ParquetWriter(path, STATE_SCHEMA, compression="zstd") as writer:
        cols: dict[str, list[Any]] = {name: [] for name in STATE_SCHEMA.names}
        for key, value, version, rtype in items:
            cols["key"].append(key)
            cols["value"].append(bytes(value))
            cols["version"].append(version)
            cols["type"].append(rtype)
            cols["type_name"].append(type_name(rtype))
            cols["value_json"].append(value_json(rtype, bytes(value)))
            count += 1
            if len(cols["key"]) >= batch_rows:
                writer.write_table(pa.table(cols, schema=STATE_SCHEMA))
                cols = {name: [] for name in STATE_SCHEMA.names}
        writer.write_table(pa.table(cols, schema=STATE_SCHEMA))
    info = DumpInfo(node=node, offset=offset, digest=digest, keys=count)
    with open(os.path.join(directory, DUMP_META), "w") as f:
        json.dump({"format": FORMAT, **info.__dict__}, f, indent=1)
    return info


def read_dump_info(text: str) -> DumpInfo:
    doc = json.loads(text)
    return DumpInfo(node=str(doc["node"]), offset=int(doc["offset"]), digest=str(doc["digest"]),
                    keys=int(doc["keys"]))


def write_dump_stream(directory: str, chunks: Iterable[Any], node: str) -> DumpInfo:
    """Write a node's Log.DumpState stream (StateChunk messages: the first carries the apply offset and
    digest of the copy) as a state dump."""
    stream = iter(chunks)
    first = next(stream)
    items = ((i.key, i.value, i.version, i.type) for chunk in itertools.chain([first], stream) for i in chunk.items)
    return write_dump(directory, items, first.apply_offset, first.digest, node)
