"""Encoding of log entries and of the Raft bookkeeping stored inside a snapshot."""

from __future__ import annotations

import base64
import json
import logging

from raftlog.pb import entry_pb2

log = logging.getLogger("raftlog.apply")

# Bump when the Entry layout changes incompatibly; a node refuses entries newer than it knows.
ENTRY_FORMAT = 1


class UnknownEntryFormat(Exception):
    pass


def encode_entry(entry: entry_pb2.Entry) -> bytes:
    entry.format = ENTRY_FORMAT
    return entry.SerializeToString(deterministic=True)


def decode_entry(data: bytes) -> entry_pb2.Entry:
    entry = entry_pb2.Entry.FromString(data)
    if entry.format > ENTRY_FORMAT:
        raise UnknownEntryFormat(f"entry format {entry.format} is newer than this node's {ENTRY_FORMAT}")
    return entry


def decode_for_apply(index: int, data: bytes) -> entry_pb2.Entry:
    """The entry at `index` as every replica applies it: a malformed one is an empty entry (a no-op, so
    replicas agree), a newer format raises UnknownEntryFormat (stop rather than diverge)."""
    try:
        return decode_entry(data)
    except UnknownEntryFormat:
        raise
    except Exception:
        log.error("entry %d is not a valid Entry (%d bytes); applied as a no-op", index, len(data))
        return entry_pb2.Entry()


# pysyncobj log entries are (command bytes, index, term) tuples; a snapshot must give back the
# last two entries it covers and the cluster membership, so they travel inside the snapshot file.
RaftEntry = tuple[bytes, int, int]


def encode_raft_meta(last: RaftEntry, prev: RaftEntry, cluster: list[str]) -> bytes:
    def enc(e: RaftEntry) -> list:
        return [base64.b64encode(e[0]).decode(), e[1], e[2]]

    return json.dumps({"last": enc(last), "prev": enc(prev), "cluster": sorted(cluster)}).encode()


def decode_raft_meta(blob: bytes) -> tuple[RaftEntry, RaftEntry, list[str]]:
    doc = json.loads(blob)

    def dec(v: list) -> RaftEntry:
        return (base64.b64decode(v[0]), int(v[1]), int(v[2]))

    return dec(doc["last"]), dec(doc["prev"]), list(doc["cluster"])
