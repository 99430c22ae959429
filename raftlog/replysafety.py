"""Raft rules pysyncobj 0.3.17 breaks around acknowledgements and snapshots (docs/faults.md, finding 15).

The loss of finding 15 is rule 4; rules 1-3 are holes of the same kind found on the way.

1. Every reply carries its term; a leader ignores replies of another term (Raft, Figure 2). pysyncobj's
   append answer (`next_node_idx`) carries none, and its leader takes any success as "this follower holds
   my log up to next_node_idx - 1", whenever it arrives. A success sent to an earlier leadership (this
   node's own, or answered before an election) that is delivered late (a proxy or a healed route replays
   what it held; a closed connection's buffered bytes still go out) raises the match index of the
   current term over entries the follower may not hold: the leader then counts it towards a commit and
   acknowledges a write that a majority never had. The follower stamps its term on the answer
   (`stamp_term`); the leader drops an answer stamped with another term (`stale_reply`). An answer
   without a stamp (a node not yet upgraded) passes as before: the wire stays compatible both ways,
   pysyncobj ignores keys it does not know.

2. A follower that already holds a snapshot's last entry keeps the log after it (Raft, Figure 13,
   step 6). pysyncobj's InstallSnapshot clears the follower's whole log (`__loadDumpFile(clearJournal=
   True)`) even then: entries the follower acknowledged after that index are forgotten, and the follower
   may then vote for a candidate without them, so a committed entry is lost. A leader sends a snapshot
   to a follower that is ahead of it whenever its next index for the follower steps back below its own
   log start (a refused append's hint, a snapshot taken while the transfer ran). `keeps_log` decides;
   the binding then skips the load and answers "I hold your log up to the snapshot" (`capped_ack`),
   not up to its own last entry: entries after the snapshot may still differ from the leader's, and
   the next append sorts them out. The snapshot file the log goes with stays the node's own
   (raftlog/keptdump.py): pysyncobj renames the received one over it first, and a restart from the
   leader's older file cleared the kept journal.

3. pysyncobj swallows a failed snapshot load and answers success all the same, with the log the
   follower still has (`capped_ack(..., failed=True)` turns it into no answer at all: neither success
   nor a hint).

4. A follower advances its commit index to the leader's only over entries the leader's message
   showed it shares (Raft, Figure 2: min(leaderCommit, index of the last new entry)). pysyncobj's
   follower does it after every append_entries, a snapshot's too: each piece of a snapshot transfer
   but the last (and the empty message a leader sends when it cannot read its snapshot) moves the
   commit index to min(leaderCommit, its own last index), over a tail no leader verified. An old
   leader back from a partition is sent the new leader's snapshot (its log is behind the new
   leader's compaction), and the first piece commits and applies its own uncommitted tail, acknowledging
   those writes to their clients, before the last piece replaces the state with one without them: an
   acknowledged write lost on every node (docs/faults.md, finding 15, reproduced with snapshots every 60
   entries). While pysyncobj handles such a message the binding holds the commit index where it was,
   up to the snapshot's last index once one is installed or kept (`snapshot_message`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

REPLY = "next_node_idx"
TERM = "term"


def stamp_term(message: dict[str, Any], term: int) -> dict[str, Any]:
    """The append answer `message` with the sender's current term on it."""
    return {**message, TERM: term}


def stale_reply(message: Any, current_term: int) -> bool:
    """Whether `message` is an append answer of another term than the leader's current one."""
    return (isinstance(message, dict) and message.get("type") == REPLY and TERM in message
            and message[TERM] != current_term)


def keeps_log(snapshot_last: tuple[Any, int, int], last_applied: int,
              term_at: Callable[[int], int | None]) -> bool:
    """Whether a follower must keep its log rather than install a snapshot whose last entry is
    `snapshot_last` (command, index, term): it holds that entry, in its log with the same term or
    applied already (applied entries are committed, and committed entries are the same on every node)."""
    _command, index, term = snapshot_last
    return last_applied >= index or term_at(index) == term


def snapshot_message(message: Any) -> bool:
    """Whether `message` is an append_entries carrying (a piece of) a snapshot, or the empty one a leader
    sends when its snapshot cannot be read: one without `prevLogIdx`, which verifies none of our log."""
    return isinstance(message, dict) and message.get("type") == "append_entries" and "prevLogIdx" not in message


def capped_ack(message: Any, acked_through: int | None, failed: bool = False) -> Any:
    """pysyncobj's answer to a message that verified our log only up to `acked_through`: success up to there
    (pysyncobj would say up to the follower's own last entry, which the leader may not share). That is a
    snapshot the follower kept its log for (its last index), or an append that kept a tail of another term
    after it (its end: raftlog/appendfilter.py). For a snapshot it failed to load, no success (pysyncobj
    says success, with the log it had)."""
    if not isinstance(message, dict) or message.get("type") != REPLY or not message.get("success"):
        return message
    if failed:
        return {**message, "success": False, "reset": False}
    if acked_through is None:
        return message
    return {**message, "next_node_idx": acked_through + 1}


__all__ = ["capped_ack", "keeps_log", "snapshot_message", "stale_reply", "stamp_term"]
