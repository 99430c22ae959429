"""Read index by a heartbeat round (Raft thesis 6.4, etcd's ReadIndex), without writing to the log.

A linearizable read needs an index covering every write acknowledged before it started. The
leader's commit index is that index, provided that (1) the leader has committed an entry of its
own term (pysyncobj appends a no-op on election), so its commit index is not behind a predecessor's,
and (2) it is still the leader: no other leader existed when the read started. For (2) the leader
sends a tagged ping to every peer after the read arrived, and a peer answers yes only while it
follows this leader in this term. A majority of yeses means no majority had moved to a newer term
when they answered, so no newer leader had committed anything.

Until this, every round of linearizable reads committed a no-op entry (an fsync on every node and
a log entry per round). Requests from any thread are queued; the tick thread sends one ping round
for all requests queued since the last one, and resolves them as the answers arrive (they are Raft
messages, handled in the binding's receive hook).
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from raftlog.roles import Role

PING = "ns_read_index"
ANSWER = "ns_read_index_ack"
LEADER = Role.LEADER


class NotConfirmed(Exception):
    """No read index: not the leader, no commit in this term yet, or no majority answered."""


@dataclass
class _Request:
    event: threading.Event = field(default_factory=threading.Event)
    index: int = 0
    error: str = ""


@dataclass
class _Round:
    term: int
    index: int
    requests: list[_Request]
    yes: set[Any]
    started: float = field(default_factory=time.monotonic)


ROUND_TTL_S = 10.0  # a cut-off leader keeps leading for a while: forget its unanswered rounds


class LeadershipConfirmer:
    def __init__(self, raft: Any) -> None:
        self.raft = raft
        self._queue: queue.SimpleQueue[_Request] = queue.SimpleQueue()
        self._rounds: dict[int, _Round] = {}
        self._ids = itertools.count(1)
        self.rounds = 0

    def _get(self, name: str) -> Any:
        return self.raft.private(name)

    # ---- any thread ----------------------------------------------------------------------------

    def read_index(self, timeout: float) -> int:
        """The confirmed commit index. Raises NotConfirmed (callers may fall back to a barrier)."""
        request = _Request()
        self._queue.put(request)
        self.raft.wake()  # wake the tick thread out of its poll
        if not request.event.wait(timeout):
            raise NotConfirmed("no majority confirmed this leader in time")
        if request.error:
            raise NotConfirmed(request.error)
        return request.index

    # ---- tick thread ---------------------------------------------------------------------------

    def on_tick(self) -> None:
        leading = self._get("raftState") == LEADER
        term = self._get("raftCurrentTerm")
        now = time.monotonic()
        for rid, rnd in list(self._rounds.items()):
            if not leading or rnd.term != term:
                self._finish(rid, "leadership lost before a majority confirmed it")
            elif now - rnd.started > ROUND_TTL_S:
                self._finish(rid, "no majority answered")
        requests: list[_Request] = []
        while True:
            try:
                requests.append(self._queue.get_nowait())
            except queue.Empty:
                break
        if not requests:
            return
        if not leading:
            return self._fail(requests, "not the leader")
        noop = self._get("noopIDx")
        commit = self.raft.raftCommitIndex
        if noop is None or commit < noop:
            return self._fail(requests, "no entry of this term committed yet")
        rid = next(self._ids)
        self.rounds += 1
        rnd = _Round(term, commit, requests, {self._get("selfNode")})
        self._rounds[rid] = rnd
        message = {"type": PING, "id": rid, "term": term}
        for node in list(self._get("otherNodes")):
            self._get("transport").send(node, message)
        self._check(rid)

    def on_message(self, node: Any, message: Any) -> bool:
        """Handle read-index messages (True: consumed)."""
        if not isinstance(message, dict):
            return False
        kind = message.get("type")
        if kind == PING:
            follows = (self._get("raftState") != LEADER and message.get("term") == self._get("raftCurrentTerm")
                       and self._get("raftLeader") == node)
            self._get("transport").send(node, {"type": ANSWER, "id": message.get("id"),
                                               "term": message.get("term"), "yes": follows})
            return True
        if kind == ANSWER:
            rid = message.get("id")
            rnd = self._rounds.get(rid) if isinstance(rid, int) else None
            if rnd is not None and message.get("yes") and message.get("term") == rnd.term:
                rnd.yes.add(node)
                self._check(message["id"])
            return True
        return False

    def _check(self, rid: int) -> None:
        rnd = self._rounds[rid]
        if len(rnd.yes) > (len(self._get("otherNodes")) + 1) // 2:
            del self._rounds[rid]
            for r in rnd.requests:
                r.index = rnd.index
                r.event.set()

    def _finish(self, rid: int, error: str) -> None:
        rnd = self._rounds.pop(rid)
        self._fail(rnd.requests, error)

    @staticmethod
    def _fail(requests: list[_Request], error: str) -> None:
        for r in requests:
            r.error = error
            r.event.set()


__all__ = ["LeadershipConfirmer", "NotConfirmed"]
