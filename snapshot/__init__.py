"""LMDB snapshot store: write, list, load, prune, verify (knows nothing of routes).

A snapshot is a whole key -> (value, version, type) map at one log offset, in ONE self-contained LMDB
file `snap-<offset:020d>-<term>.mdb`, stamped with offset, term, the caller's state digest and an opaque
meta blob. See store.py (directory, atomicity, threads), format.py (file layout, reading) and
writer.py (bounded-memory, compact writing).
"""

from snapshot.format import FORMAT_VERSION, SnapshotCorrupt, SnapshotInfo
from snapshot.store import SnapshotStore, parse_snapshot_name, snapshot_name

__all__ = [
    "FORMAT_VERSION",
    "SnapshotCorrupt",
    "SnapshotInfo",
    "SnapshotStore",
    "parse_snapshot_name",
    "snapshot_name",
]
