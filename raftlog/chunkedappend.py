"""A large entry sent in pieces reaches pysyncobj's follower as an ordinary append (docs/faults.md, finding 15).

pysyncobj's leader sends a lone entry of `appendEntriesBatchSizeBytes` (64 KiB) or more as a chunked
transmission: the pickled entry cut into 64 KiB pieces labelled start, process..., finish, each an
append_entries carrying the same `prevLogIdx`/`prevLogTerm`. Two faults of pysyncobj's there:

1. On finish its follower deletes every entry after `prevLogIdx` and appends the one it received,
   whatever it held there. Raft (Figure 2, AppendEntries step 3) deletes only from a conflict (the
   same index, another term). The leader re-sends an entry the follower already holds whenever its
   next index for the follower is below the follower's end: an answer lost or stale (the refusals of
   a pipelined tail arrive after the one that moved the index back, raftlog/appendflow.py), a probe
   stepping back, a leader re-sending its tail after a reconnection. The follower then drops the
   entries after it, which it acknowledged and the leader counted towards their commit: if it votes
   before it has them again, a leader without them can be elected and an acknowledged write is lost.
   `raftlog/appendfilter.py` prevents this for ordinary appends, but cannot read a transmission's
   entry until its last piece.

2. The leader labels a piece finish when it reaches the end of the entry's *command*, not of its
   pickle, which is longer (tens of bytes; up to twice as long: pickle protocol 2 stores bytes as
   latin-1 text, two bytes each from 0x80). Whenever the pickle runs into one more piece than the
   command, two pieces say finish: the follower decodes the first, truncated, raises on its tick
   thread, and drops the entry; it does so again at every re-send, so the entry never reaches a
   majority and every write behind it waits forever. A 100 KB value of random bytes did that.

So when the last piece arrives (`whole_transmission`), the follower decodes what it has received:

- A whole entry: the message becomes the ordinary append of that one entry (no `transmission`), which
  the append filter then checks like any other: entries it holds with the same terms are kept, and
  only a conflict truncates, from there. pysyncobj's handling of it is the same as of a finish piece,
  minus the truncation the filter removes.
- Not decodable yet: the piece is relabelled process (a middle piece: pysyncobj keeps it and waits for
  the next; its answer to a piece claims nothing, neither success nor a hint).

Nothing changes on the wire: leaders and followers without this module still talk to ours.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

TRANSMISSION = "transmission"
LAST_PIECE = "finish"
MIDDLE_PIECE = "process"


def whole_transmission(message: Any, received: Any, decode: Callable[[bytes], Any]) -> Any:
    """The message pysyncobj's follower should see for `message` (the same object when it is not a last piece).

    `received`: the pieces of the transmission pysyncobj has kept so far (its own buffer); `decode`:
    pysyncobj's unpickler, which it would apply to `received` + this piece.
    """
    if not isinstance(message, dict) or message.get("type") != "append_entries" \
            or message.get(TRANSMISSION) != LAST_PIECE:
        return message
    data = message.get("data")
    if not isinstance(received, bytes) or not isinstance(data, bytes):
        return message  # a finish with no start before it: pysyncobj's own handling (it raises)
    if not data.endswith(b"."):  # pickle's STOP opcode ends a whole one: not decoded (and copied) for nothing
        return {**message, TRANSMISSION: MIDDLE_PIECE}
    try:
        entry = decode(received + data)
    except Exception:
        return {**message, TRANSMISSION: MIDDLE_PIECE}  # a truncated pickle: more pieces follow
    if not (isinstance(entry, tuple) and len(entry) == 3 and isinstance(entry[0], bytes)
            and isinstance(entry[1], int) and isinstance(entry[2], int)):
        return message
    plain = {k: v for k, v in message.items() if k not in (TRANSMISSION, "data")}
    plain["entries"] = [entry]
    return plain


__all__ = ["whole_transmission"]
