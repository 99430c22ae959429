"""The node's own single-process replay of an exported log (the benchmark's baseline and the tests' oracle).

Entries are rebuilt from the segment rows (batches without records are dropped: they change nothing)
and applied with raftlog's KVState, the very code a node's apply thread runs. This module is the one
place the pipeline uses raftlog.kvstate; the Spark jobs use only the codec and the digest.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow.parquet as pq

from nameserver.logformat.segments import DELETE, covered_ranges, segment_name
from raftlog.codec import decode_entry, encode_entry
from raftlog.kvstate import KVState
from raftlog.pb import entry_pb2

_COLUMNS = ["offset", "term", "leader_time_ms", "batch_index", "request_id", "preconditions", "type", "op",
            "key", "value"]


def entries_of_segment(path: str) -> Iterator[tuple[int, bytes, int]]:
    """(offset, Entry bytes, records) for every entry with records in one segment, in order."""
    cols = pq.read_table(path, columns=_COLUMNS).to_pydict()
    n = len(cols["offset"])
    i = 0
    while i < n:
        offset = cols["offset"][i]
        start = i
        entry = entry_pb2.Entry(term=cols["term"][i], leader_time_ms=cols["leader_time_ms"][i])
        batch_index = -1
        batch = None
        while i < n and cols["offset"][i] == offset:
            if cols["batch_index"][i] != batch_index:
                batch_index = cols["batch_index"][i]
                batch = entry.batches.add(request_id=cols["request_id"][i])
                for p in cols["preconditions"][i] or ():
                    batch.preconditions.add(key=p["key"], version=p["version"])
            assert batch is not None
            batch.records.add(type=cols["type"][i], key=cols["key"][i], value=cols["value"][i],
                              op=entry_pb2.OP_DELETE if cols["op"][i] == DELETE else entry_pb2.OP_PUT)
            i += 1
        yield offset, encode_entry(entry), i - start


@dataclass
class Replay:
    offset: int
    digest: str
    keys: int
    records: int
    entries: int
    read_s: float    # reading Parquet and rebuilding entry bytes
    apply_s: float   # decode + apply, as the apply thread does


def replay(directory: str, upto: int | None = None) -> tuple[KVState, Replay]:
    kv = KVState()
    read_s = apply_s = 0.0
    entries = records = 0
    for first, last in covered_ranges(directory):
        if upto is not None and first > upto:
            break
        t0 = time.perf_counter()
        batch = [e for e in entries_of_segment(os.path.join(directory, segment_name(first, last)))
                 if upto is None or e[0] <= upto]
        t1 = time.perf_counter()
        for offset, data, _ in batch:
            kv.apply_entry(offset, decode_entry(data))
        t2 = time.perf_counter()
        read_s += t1 - t0
        apply_s += t2 - t1
        entries += len(batch)
        records += sum(e[2] for e in batch)
        kv.offset = min(last, upto) if upto is not None else last
    return kv, Replay(kv.offset, kv.digest_hex, len(kv), records, entries, read_s, apply_s)
