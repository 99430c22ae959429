"""A leader sends one probe at a time to a follower whose log it has not matched yet (etcd's probe state).

pysyncobj's leader pipelines: each tick it sends every entry from a follower's next index to its
own end and moves the next index to the end at once. A follower that refuses an append answers
with a hint (its own last index + 1 when the message starts past its log, the message's previous
index when the terms there differ), and the leader sets the next index to that hint, up or down.
After a pause or a partition a follower has thousands of pipelined appends queued, and refuses
each: the leader resets to the last hint, sends the whole tail again from there, and the answers to
that tail (all "past my log": hint = last + 1) arrive after the one that stepped back, so the next
index jumps up again. The leader never steps back past the follower's stale entries: found by
tests/faults/test_membership_faults.py (a leader paused across an election never caught up; its
new leader saw it connected with match index 0 for minutes; docs/faults.md).

Raft only needs the leader to retry with a lower index until the logs match. etcd's raft does it
with two states per follower: *replicate* (pipeline, as pysyncobj does) and *probe* (one append per
heartbeat interval until one is accepted). This gate adds probe to pysyncobj from outside: a
refusal puts the follower in probe; there the leader's appends to it pass at most one per
interval (the rest are dropped, as a lossy network would, which Raft tolerates), so every answer
is to the latest probe and the next index walks back one refusal at a time. The first accepted
append puts the follower back in replicate.

A large entry travels as a chunked transmission (start, process..., finish): its chunks pass or
drop as one, so a follower never joins a partial transfer. pysyncobj may label more than its last
piece finish (raftlog/chunkedappend.py), so every piece up to the next start passes or drops with
the start before it. Snapshot transfers are not gated.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from typing import Any


class ProbeGate:
    """Decides, on the leader, which append_entries messages go out to each follower."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self.clock = clock
        self._probing: dict[Hashable, float] = {}  # follower -> when its last probe went out
        self._transferring: set[Hashable] = set()  # followers whose latest chunked transfer passed its start
        self.dropped = 0  # appends held back in probe state, ever (tests and status read it)

    def probing(self, node: Hashable) -> bool:
        return node in self._probing

    def on_reply(self, node: Hashable, message: Any) -> None:
        """A message from `node` (the binding passes every one; only append answers count)."""
        if not isinstance(message, dict) or message.get("type") != "next_node_idx":
            return
        if message.get("success"):
            self._probing.pop(node, None)
        elif message.get("reset"):
            self._probing.setdefault(node, float("-inf"))  # the first probe may go at once

    def may_send(self, node: Hashable, message: Any) -> bool:
        """Whether this outgoing message to `node` goes on the wire."""
        if not isinstance(message, dict) or message.get("type") != "append_entries" or "prevLogIdx" not in message:
            return True  # not an append (votes, answers, our own messages) or a snapshot transfer
        transmission = message.get("transmission")
        if transmission in ("process", "finish"):
            return node in self._transferring  # not forgotten at a finish: another finish may follow
        passes = True
        last = self._probing.get(node)
        if last is not None:
            now = self.clock()
            passes = now - last >= self.interval_s
            if passes:
                self._probing[node] = now
            else:
                self.dropped += 1
        if transmission == "start":
            if passes:
                self._transferring.add(node)
            else:
                self._transferring.discard(node)
        return passes

    def forget(self, node: Hashable) -> None:
        self._probing.pop(node, None)
        self._transferring.discard(node)


class RepeatedAnswers:
    """Decides, on a follower, which append answers go on the wire: one identical to the last answer sent to
    the same leader less than `interval_s` ago stays home.

    pysyncobj's leader sends a second append for every entry, without entries, to pass on the commit index
    once the entry committed; the follower answers it with exactly what it answered the entry (the same next
    index, success, term). That answer tells the leader nothing: pysyncobj's leader only ever raises a match
    index on a success, and the one before it already did. It cost each follower an encoded message and the
    leader a wake of its tick thread and a pass per follower per entry (session 25). Only a success repeating
    the last answer on the wire to that node is held back, and only within `interval_s` of it: the leader
    still hears from each follower at least every `interval_s` while it sends (pysyncobj's step-down timer,
    the Members status's "heard"). A lost link forgets its answers (`forget`): what was sent on it may never
    have arrived. The follower's journal is synced before the check, as for an answer that goes out
    (raftlog/binding.py).
    """

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self.clock = clock
        self._last: dict[Hashable, tuple[dict[str, Any], float]] = {}  # node -> the last answer sent, when
        self.held = 0  # answers held back, ever (tests and status read it)

    def may_send(self, node: Hashable, message: dict[str, Any]) -> bool:
        """Whether this append answer (type next_node_idx, as it would go on the wire) to `node` goes out."""
        now = self.clock()
        last = self._last.get(node)
        if last is not None and message.get("success") and now - last[1] < self.interval_s and last[0] == message:
            self.held += 1
            return False
        self._last[node] = (message, now)
        return True

    def forget(self, node: Hashable) -> None:
        self._last.pop(node, None)


__all__ = ["ProbeGate", "RepeatedAnswers"]
