"""Request and reply bytes a node holds for its remoting clients: bounded per connection and for the node.

A reply is held from before it is built until the transport has sent it: a client that asks for large
replies (a KV namespace's list, every topic) and never reads them would otherwise grow the node
without bound, and so would many such requests being built at once. Used on the listener's one
thread only: no locks.

- Before a request is handled, its body and the bytes its reply may take while it is built are reserved:
  BUILD_FACTOR times the largest reply its code has produced (a reply being built holds about that
  many copies of itself: the state's, the JSON text, its bytes, the frame). A code never answered yet
  is learned from the process's first request of it, not each connection's: that one reserves the
  whole per-connection share, and the others of the code wait until it is answered (then reserve what
  it was seen to need; past server.py's PROBE_WAIT_S, as for a small reply). Before, thousands of fresh
  connections' first route reads (~1 KB replies) each reserved the share and filled the node's total
  with reservations, not bytes: the rest were answered SYSTEM_BUSY (the fleet simulator, 9,000
  connections). A connection with nothing held may always
  reserve (one reply larger than the share must still be deliverable); one that holds some and would
  pass its share waits: it is not read meanwhile. Past the node's total, the request is answered
  SYSTEM_BUSY at once.
- Once built, the reservation gives way to the reply's own size until it is sent. A reply larger than
  expected that passes the connection's share while it already holds unsent replies closes it (CLOSE);
  one that passes the node's total is answered SYSTEM_BUSY instead (BUSY).
- A small reply (a route read's ~1 KB) to a connection holding nothing is never refused, so a node
  full of unread replies still answers route reads.
"""

from __future__ import annotations

import enum

SMALL_REPLY = 64 << 10
BUILD_FACTOR = 4
TRIM_AFTER = 16 << 20  # a peak of held bytes after which freed memory is given back once they are sent


class Verdict(enum.Enum):
    SEND = "send"    # go ahead (reserve, or write)
    WAIT = "wait"    # the connection holds its share: wait until some is sent
    BUSY = "busy"    # the node holds its total: answer SYSTEM_BUSY
    CLOSE = "close"  # the connection does not read what it asked for: close it


class ReplyBudget:
    def __init__(self, per_connection: int, node: int) -> None:
        self.per_connection = per_connection
        self.node = node
        self.held = 0            # every connection's reserved and unsent reply bytes together
        self.peak = 0            # the most held since memory was last given back
        self.busy_total = 0      # requests answered SYSTEM_BUSY because the node had no room
        self.closed_total = 0    # connections closed for holding more than their share
        self._largest: dict[int, int] = {}  # request code -> its largest reply (served codes only)
        self._probing: set[int] = set()     # never-answered codes whose first request is being answered

    def need(self, code: int) -> int | None:
        """What a request of this code reserves while its reply is built; None: wait (the first request
        of this never-answered code is being answered). Returning the share makes the caller that
        request: it must end with `learn`, or `unprobe` if it gets no reply."""
        expected = self.expected(code)
        if expected is not None:
            return expected
        if code in self._probing:
            return None
        self._probing.add(code)
        return self.per_connection

    def expected(self, code: int) -> int | None:
        """What a request of this code reserves once one was answered; None before (no side effects)."""
        largest = self._largest.get(code)
        return None if largest is None else largest * BUILD_FACTOR

    def learn(self, code: int, size: int) -> None:
        """A reply of `code` was `size` bytes (call only for codes the node serves: they are bounded)."""
        if size > self._largest.get(code, -1):
            self._largest[code] = size
        self._probing.discard(code)

    def knows(self, code: int) -> bool:
        """A reply of `code` was seen (its requests reserve what it needed)."""
        return code in self._largest

    def unprobe(self, code: int) -> None:
        """The first request of a never-answered code got no reply to learn from: the next one probes."""
        self._probing.discard(code)

    def learned(self) -> dict[int, int]:
        """The largest reply of each code so far (a copy: a starting worker process begins with the core's)."""
        return dict(self._largest)

    def reserve(self, held: int, need: int) -> Verdict:
        """May a connection holding `held` bytes reserve `need` more for a reply being built?"""
        if held and held + need > self.per_connection:
            return Verdict.WAIT
        return self._node_room(held, need)

    def admit(self, held: int, size: int) -> Verdict:
        """May a built reply of `size` bytes be written to a connection holding `held` bytes?"""
        if held and held + size > self.per_connection:
            self.closed_total += 1
            return Verdict.CLOSE
        return self._node_room(held, size)

    def _node_room(self, held: int, size: int) -> Verdict:
        if self.held + size > self.node and (held or size > SMALL_REPLY):
            self.busy_total += 1
            return Verdict.BUSY
        return Verdict.SEND

    def charge(self, size: int) -> None:
        self.held += size
        self.peak = max(self.peak, self.held)

    def release(self, size: int) -> bool:
        """True when the node held a lot and now holds almost nothing: time to give memory back."""
        self.held -= size
        if self.peak >= TRIM_AFTER and self.held <= SMALL_REPLY:
            self.peak = self.held
            return True
        return False
