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
- A message bringing nothing new (a heartbeat, a resend) moves to our last entry when that entry has
  the sender's term: only the leader of a term creates its entries and never deletes them, so our
  whole log is the leader's and the acknowledgement (next index = last + 1) is true.

Any conflict (same index, another term), an unverifiable tail, a snapshot or a piece of a chunked
transfer goes through unchanged, to pysyncobj's own handling (a transfer's last piece arrives here as
the ordinary append of its entry: raftlog/chunkedappend.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def skip_known_entries(message: Any, last_index: int, last_term: int,
                       term_at: Callable[[int], int | None]) -> Any:
    """The message pysyncobj should see (the same object when nothing needs changing).

    `term_at(index)`: the term of this follower's entry at `index`, None when it holds none there.
    """
    if not isinstance(message, dict) or message.get("type") != "append_entries":
        return message
    if "prevLogIdx" not in message or message.get("transmission") is not None:
        return message
    prev = message["prevLogIdx"]
    if prev >= last_index or term_at(prev) != message.get("prevLogTerm"):
        return message  # nothing of ours past prev to protect, or pysyncobj must refuse it
    entries = message.get("entries") or []
    for entry in entries:
        if entry[1] > last_index:
            break
        if term_at(entry[1]) != entry[2]:
            return message  # a conflict: pysyncobj truncates from there, as Raft says
    new = [e for e in entries if e[1] > last_index]
    if not new and last_term != message.get("term"):
        return message  # our tail past the message is of another term: not known to be the leader's
    rewritten = dict(message)
    rewritten["prevLogIdx"] = last_index
    rewritten["prevLogTerm"] = last_term
    rewritten["entries"] = new
    return rewritten


__all__ = ["skip_known_entries"]
