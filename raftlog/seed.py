"""Seed a stopped node's Raft directory from a snapshot, so it starts at the snapshot's term and offset.

A node started with only a snapshot (no journal) would start at term 0 while its log ends with entries
of the snapshot's term T; the next leader would append entries of lower terms after them, and the
election rule (the higher last log term wins) would let a node holding only the snapshot beat nodes
holding newer entries and overwrite committed writes. So the journal's metadata is written too:
current term = T, commit index = the snapshot's offset. The file names are ReplicatedLog's own.
"""

from __future__ import annotations

import os
from typing import Any

from raftlog.journal import DurableJournal

DUMP_NAME = "raft.dump"        # the snapshot pysyncobj loads at start-up (ReplicatedLog.dump_path)
JOURNAL_NAME = "raft.journal"  # the journal and its .meta (ReplicatedLog.journal_path)


def seed_from_snapshot(raft_dir: str, store: Any, info: Any) -> None:
    """Link the imported snapshot `info` (held by `store`, a SnapshotStoreLike) as the Raft snapshot of
    `raft_dir`, and write the journal's term and commit index from it."""
    os.makedirs(raft_dir, exist_ok=True)
    store.link_to(info, os.path.join(raft_dir, DUMP_NAME))
    journal = DurableJournal(os.path.join(raft_dir, JOURNAL_NAME))
    try:
        journal.setRaftCommitIndex(info.offset)
        journal.setCurrentTerm(info.term, None)  # stores both, synchronously
    finally:
        journal.close()
