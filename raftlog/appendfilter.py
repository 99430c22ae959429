"""Keep pysyncobj from truncating log entries that match its leader's.

Raft (Figure 2, AppendEntries rule 3) deletes a follower's entries only on a conflict: the same
index with a different term. pysyncobj deletes every entry after `prevLogIdx` whenever the log
goes past it, even when those entries are the leader's own. A heartbeat or a resend with an older
`prevLogIdx` (after the leader's next index for this follower moved back, e.g. around a restart)
then drops entries the follower already acknowledged, and even applied: pysyncobj logs CRITICAL
"truncating already-applied log entries", seen often in the kill/pause fault runs. An acknowledged
entry dropped on one node can be lost if the leader then dies.

The filter rewrites such a message before pysyncobj reads it, where that is provably safe, using
Log Matching (two logs holding an entry with the same index and term are identical up to it):

- The message's entries that this follower already holds with the same terms are dropped, and
  `prevLogIdx` moves to the last of them (or to our last entry, when the message extends past it).
  Nothing is truncated; the new entries are appended after ours.
- A message bringing nothing new (a heartbeat, a resend) moves to our last entry too. When that entry
  has the sender's term, our whole log is the leader's (only the leader of a term creates its entries
  and never deletes them), and pysyncobj's acknowledgement (next index = last + 1) and commit index
  (min(leaderCommit, last)) are true.
- When it has another term, the tail past the message's end is not known to be the leader's, but it
  conflicts with nothing the message says: Raft keeps it. pysyncobj cut it (docs/faults.md, finding
  16), and a tail acknowledged to this leader earlier (the message a stale or re-sent one, its next
  index for us moved back) could then lose a committed entry. The tail is kept, and `acked_through`
  (the message's end) caps what the binding lets pysyncobj claim for it: the answer (next index =
  end + 1, not last + 1) and the commit index (Figure 2: min(leaderCommit, index of the last new
  entry)); committing past it would apply an entry of ours the leader may not have.

Any conflict (same index, another term), a snapshot or a piece of a chunked transfer goes through
unchanged, to pysyncobj's own handling (a transfer's last piece arrives here as the ordinary append of
its entry: raftlog/chunkedappend.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple


class Filtered(NamedTuple):
    """The message pysyncobj should see, and how far its answer and commit index may go."""

    message: Any
    acked_through: int | None  # None: as far as pysyncobj takes them (the log it then holds is the leader's)


def skip_known_entries(message: Any, last_index: int, last_term: int,
                       term_at: Callable[[int], int | None]) -> Filtered:
    """What pysyncobj should see for `message` (the same object when nothing needs changing).

    `term_at(index)`: the term of this follower's entry at `index`, None when it holds none there.
    """
    unchanged = Filtered(message, None)
    if not isinstance(message, dict) or message.get("type") != "append_entries":
        return unchanged
    if "prevLogIdx" not in message or message.get("transmission") is not None:
        return unchanged
    prev = message["prevLogIdx"]
    if prev >= last_index or term_at(prev) != message.get("prevLogTerm"):
        return unchanged  # nothing of ours past prev to protect, or pysyncobj must refuse it
    entries = message.get("entries") or []
    for entry in entries:
        if entry[1] > last_index:
            break
        if term_at(entry[1]) != entry[2]:
            return unchanged  # a conflict: pysyncobj truncates from there, as Raft says
    new = [e for e in entries if e[1] > last_index]
    rewritten = {**message, "prevLogIdx": last_index, "prevLogTerm": last_term, "entries": new}
    if new or last_term == message.get("term"):
        return Filtered(rewritten, None)
    # our tail past the message is of another term: kept, but not known to be the leader's
    return Filtered(rewritten, entries[-1][1] if entries else prev)


__all__ = ["Filtered", "skip_known_entries"]
