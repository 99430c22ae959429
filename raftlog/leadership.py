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

A follower asks its leader (ASK, answered by a TELL) with at most MAX_ASKS_OUT asks out at once, as etcd
keeps one ReadIndex in flight: a request that arrives while they are out waits, with no wake of the tick
thread, for the next ask, which the tick thread sends as soon as one is answered (or fails), for every
request queued by then. Each request is still served by an ask sent after it arrived; what this saves is
an ASK, a TELL and a pass of both tick threads per read when reads come faster than the round trip (one
ask per waking read before: docs/benchmarks.md, "Issue 27: the linearizable read's path (session 26)").

The leader lease (Raft thesis 6.4.1; etcd's lease-based read, which also needs check-quorum). A
follower that says yes to a ping at time t promises to grant no vote until t + promise_s, and the
leader itself, whose round started at s, grants none until s + promise_s. Pinged after s, a majority
then refuses every vote until after s + promise_s, so no other leader can be elected before then:
until s + LEASE_FRACTION * promise_s (the rest is a margin for clocks that run at different rates),
the leader answers a read index at once from its commit index, with no round trip. The tick thread
keeps the lease fresh with a ping round every RENEW_FRACTION * promise_s, reads or not.
- promise_s stays below the minimum election timeout, so when a leader dies its followers' promises
  have run out before a pre-vote can pass (which needs election_min_s without a word from it).
- A node that (re)starts makes the promise at once: it may have made one just before it crashed.
- Only promises count: a yes carries the promise its node made (0 when its lease is off, nothing from
  a node on code from before the lease, as in a rolling upgrade), and the lease lasts as long as the
  shortest promise of a majority, the leader's own included.
- Nor does a node campaign during its promise (raftlog/prevote.py holds pysyncobj's timer back), which
  timing alone would also give (a leader's pings and appends travel together), but need not.
- A refused vote request still moves the node to the asker's newer term (the binding hands pysyncobj
  the request with a log too old to vote for), as in plain Raft: dropping it instead left the asker
  alone in a term no one else had, deaf to the leader's appends (pysyncobj has no answer that tells
  a leader of a newer term), and out of the cluster for good.
- A leadership transfer (TimeoutNow) tags the target's vote request, which every node grants as
  before; the old leader gives up its lease for the rest of its term the moment it sends TimeoutNow,
  before any such vote can exist. A node that stepped down stops reading under its lease at once
  (the lease holds only while it leads in the lease's term).
- Time is time.monotonic(): the clock-step faults (tests/faults/test_clock.py) move the wall clock,
  never this one.
"""

from __future__ import annotations

import contextlib
import itertools
import queue
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from raftlog.leaseboard import LeaseBoard
from raftlog.raftview import RaftView
from raftlog.roles import Role

PING = "ns_read_index"
ANSWER = "ns_read_index_ack"
ASK = "ns_read_index_ask"    # follower -> leader: your read index, please
TELL = "ns_read_index_tell"  # leader -> follower: here it is (or why not)
TRANSFER_VOTE = "ns_transfer"  # set on a request_vote sent because of the leader's TimeoutNow
LEADER = Role.LEADER
LEASE_PROMISE_FRACTION = 0.6  # of the minimum election timeout: the promise a yes makes
LEASE_FRACTION = 0.8  # of promise_s: the lease ends before the promises it rests on
RENEW_FRACTION = 0.25  # of promise_s: a lease round this often keeps the lease from running out


class NotConfirmed(Exception):
    """No read index: not the leader, no commit in this term yet, or no majority answered."""


@dataclass
class _Request:
    event: threading.Event = field(default_factory=threading.Event)
    index: int = 0
    error: str = ""
    reply: Callable[[int, str], None] | None = None  # a follower's ASK: answer it (on the tick thread)

    def resolve(self, index: int, error: str = "") -> None:
        self.index, self.error = index, error
        if self.reply is not None:
            self.reply(index, error)
        self.event.set()


@dataclass
class _Ask:
    term: int
    leader: Any
    requests: list[_Request]
    started: float


@dataclass
class _Round:
    term: int
    index: int
    requests: list[_Request]
    yes: set[Any]
    started: float = field(default_factory=time.monotonic)
    promised: dict[Any, float] = field(default_factory=dict)  # a yes's promise (s): 0 from a node without one


_UNWATCHED = threading.Event()  # the event of a request answered by its reply alone: no thread waits on it


def _drain(q: queue.SimpleQueue[_Request]) -> list[_Request]:
    if q.empty():  # every tick, twice: no exception raised and caught when there is nothing
        return []
    out: list[_Request] = []
    while True:
        try:
            out.append(q.get_nowait())
        except queue.Empty:
            return out


MAX_ASKS_OUT = 1  # a follower's asks of its leader out at once (requests arriving meanwhile wait for the next)
ASK_SILENCE_S = 1.0  # an ask unanswered this long: a leader that never answered one is taken not to
ROUND_TTL_S = 10.0  # a cut-off leader keeps leading for a while: forget its unanswered rounds


class LeadershipConfirmer:
    def __init__(self, raft: RaftView, promise_s: float = 0.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """promise_s = 0: no lease (every read index takes a ping round)."""
        self.raft = raft
        self.clock = clock
        self._queue: queue.SimpleQueue[_Request] = queue.SimpleQueue()
        self._rounds: dict[int, _Round] = {}
        self._ask_queue: queue.SimpleQueue[_Request] = queue.SimpleQueue()
        self._asks: dict[int, _Ask] = {}  # changed under _ask_lock (the tick thread's), read by askers
        # the queue's drain and a new ask (the tick thread) against a request's put and its look at the asks
        # out (any thread): a request that finds an ask out skips the wake only if the tick thread drains the
        # queue again once that ask ends
        self._ask_lock = threading.Lock()
        self._answered_by: tuple[Any, int] | None = None  # (leader, term) that answered an ask
        self._silent: tuple[Any, int] | None = None       # (leader, term) that let an ask go unanswered
        self.asks = 0
        self._ids = itertools.count(1)
        self.rounds = 0
        self.promise_s = promise_s
        # no vote for another node before this (monotonic) time; see the module's docstring
        self.promise_until = clock() + promise_s if promise_s > 0 else 0.0
        self._lease: tuple[int, float] = (-1, 0.0)  # (term, until): one attribute, swapped whole
        self._lease_given_up_term = -1  # the term in which this leader sent TimeoutNow
        self._last_lease_round = -1e18
        self.lease_reads = 0
        self.votes_refused = 0
        self.board: LeaseBoard | None = None  # the lease for the node's workers (raftlog/leaseboard.py)
        # around the answers of one TELL or round (tick thread): their replies may go out together
        self.resolving: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext

    # ---- any thread ----------------------------------------------------------------------------

    def leased_index(self) -> int | None:
        """The commit index if this node leads under a valid lease (no round trip), else None."""
        term, until = self._lease
        if self.clock() >= until or term == self._lease_given_up_term:
            return None
        if self.raft.role() != LEADER or self.raft.current_term() != term:
            return None
        noop = self.raft.noop_index()
        commit = self.raft.commit_index()
        if noop is None or commit < noop:
            return None
        self.lease_reads += 1
        return int(commit)

    def give_up_lease(self) -> None:
        """Called before the leader sends TimeoutNow: no lease for the rest of this term."""
        self._lease_given_up_term = self.raft.current_term()
        self.publish_lease()  # the workers' page too, before TimeoutNow goes out

    def publish_lease(self) -> None:
        """The lease's end on the workers' page (tick thread): 0 unless this node leads in the lease's term
        and has not given it up (as leased_index checks; the no-op of that term committed before any round
        that made the lease)."""
        board = self.board
        if board is None:
            return
        term, until = self._lease
        if term == self._lease_given_up_term or self.raft.role() != LEADER or self.raft.current_term() != term:
            until = 0.0
        board.publish(until)

    def promises_now(self) -> bool:
        """Whether a lease promise holds now (then this node neither grants a vote nor campaigns)."""
        return self.clock() < self.promise_until

    def refuses_vote(self, message: dict[str, Any]) -> bool:
        """Whether a promise made under a lease forbids granting this request_vote."""
        if message.get(TRANSFER_VOTE) or self.clock() >= self.promise_until:
            return False
        self.votes_refused += 1
        return True

    def read_index(self, timeout: float) -> int:
        """The confirmed commit index, after a ping round (leased_index() is the one without). Raises
        NotConfirmed (callers may fall back to a barrier)."""
        return self._await(self._queue, timeout, "no majority confirmed this leader in time")

    def read_index_from_leader(self, timeout: float) -> int:
        """A follower's read index, asked of the leader over the Raft link: one ASK message, answered
        by the leader as it answers its own reads (at once under its lease, else after a ping round).
        It covers every write acknowledged before this call, as the leader's own would. Raises
        NotConfirmed (no leader known, the leader refused, or no answer in time: a leader that runs
        code without ASK never answers; callers fall back to another way)."""
        request = _Request()
        self._queue_ask(request)
        if not request.event.wait(timeout):
            raise NotConfirmed("the leader did not answer in time")
        if request.error:
            raise NotConfirmed(request.error)
        return request.index

    def read_index_later(self, done: Callable[[int, str], None]) -> None:
        """read_index without a waiting thread: done(index, "") on the tick thread once the round that
        starts after this call confirms it, or done(0, why) when it cannot (as NotConfirmed's reasons)."""
        self._queue.put(_Request(event=_UNWATCHED, reply=done))
        self.raft.wake()

    def read_index_from_leader_later(self, done: Callable[[int, str], None]) -> None:
        """read_index_from_leader without a waiting thread: done(index, "") on the tick thread from the
        ask sent after this call, or done(0, why) (no leader known, refused, or unanswered for
        ASK_SILENCE_S)."""
        self._queue_ask(_Request(event=_UNWATCHED, reply=done))

    def _queue_ask(self, request: _Request) -> None:
        """Queue a follower's request for the next ask; wake the tick thread only when it may send that ask
        now (fewer than MAX_ASKS_OUT out): else the end of an ask out sends it (_next_ask)."""
        with self._ask_lock:
            self._ask_queue.put(request)
            full = len(self._asks) >= MAX_ASKS_OUT
        if not full:
            self.raft.wake()

    def _await(self, queued: queue.SimpleQueue[_Request], timeout: float, late: str) -> int:
        """Queue a request for the tick thread, wake it out of its poll, and wait for the answer."""
        request = _Request()
        queued.put(request)
        self.raft.wake()
        if not request.event.wait(timeout):
            raise NotConfirmed(late)
        if request.error:
            raise NotConfirmed(request.error)
        return request.index

    # ---- tick thread ---------------------------------------------------------------------------

    def on_tick(self) -> None:
        leading = self.raft.role() == LEADER
        term = self.raft.current_term()
        now = self.clock()
        if self.board is not None:
            self.publish_lease()
        self._send_asks(leading, term, now)
        for rid, rnd in list(self._rounds.items()):
            if not leading or rnd.term != term:
                self._finish(rid, "leadership lost before a majority confirmed it")
            elif now - rnd.started > ROUND_TTL_S:
                self._finish(rid, "no majority answered")
        requests = _drain(self._queue)
        renew = (leading and self.promise_s > 0 and term != self._lease_given_up_term
                 and now - self._last_lease_round >= RENEW_FRACTION * self.promise_s)
        if not requests and not renew:
            return
        if not leading:
            return self._fail(requests, "not the leader")
        noop = self.raft.noop_index()
        commit = self.raft.commit_index()
        if noop is None or commit < noop:
            return self._fail(requests, "no entry of this term committed yet")
        rid = next(self._ids)
        self.rounds += 1
        rnd = _Round(term, commit, requests, {self.raft.self_peer()}, started=now)
        if self.promise_s > 0:
            self._last_lease_round = now
            self.promise_until = max(self.promise_until, now + self.promise_s)
        self._rounds[rid] = rnd
        message = {"type": PING, "id": rid, "term": term}
        for node in list(self.raft.other_peers()):
            self.raft.send(node, message)
        self._check(rid)

    def _send_asks(self, leading: bool, term: int, now: float) -> None:
        leader = self.raft.leader_peer()
        for aid, ask in list(self._asks.items()):
            if leading or ask.term != term or ask.leader != leader:
                self._fail(self._end_ask(aid).requests, "the leader changed before it answered")
            elif now - ask.started > ASK_SILENCE_S:
                if self._answered_by != (leader, term):
                    self._silent = (leader, term)  # never answered an ask: code from before them
                self._fail(self._end_ask(aid).requests, "the leader did not answer")
        self._next_ask(leading, term, leader, now)

    def _end_ask(self, aid: int) -> _Ask:
        with self._ask_lock:
            return self._asks.pop(aid)

    def _next_ask(self, leading: bool, term: int, leader: Any, now: float) -> None:
        """Send one ask for every request queued, unless MAX_ASKS_OUT are out (tick thread): those requests
        wait for the end of one (a TELL or a failure), which calls this again."""
        with self._ask_lock:
            if len(self._asks) >= MAX_ASKS_OUT:
                return
            requests = _drain(self._ask_queue)
            if not requests:
                return
            why = ("this node leads" if leading else "no leader known" if leader is None
                   # asking again would cost every read the wait: callers ask another way until the next term
                   else "the leader does not answer asks" if self._silent == (leader, term) else "")
            if not why:
                aid = next(self._ids)
                self._asks[aid] = _Ask(term, leader, requests, now)
        if why:
            return self._fail(requests, why)
        self.asks += 1
        self.raft.send(leader, {"type": ASK, "id": aid})

    def _answer_ask(self, node: Any, aid: Any) -> None:
        def reply(index: int, error: str) -> None:
            self.raft.send(node, {"type": TELL, "id": aid, "index": index, "error": error})

        leased = self.leased_index()
        if leased is not None:
            return reply(leased, "")
        if self.raft.role() != LEADER:
            return reply(0, "not the leader")
        self._queue.put(_Request(reply=reply))  # into this tick's round (on_tick runs after the messages)

    def on_message(self, node: Any, message: Any) -> bool:
        """Handle read-index messages (True: consumed)."""
        if not isinstance(message, dict):
            return False
        kind = message.get("type")
        if kind == ASK:
            self._answer_ask(node, message.get("id"))
            return True
        if kind == TELL:
            aid = message.get("id")
            ask = self._asks.get(aid) if isinstance(aid, int) else None
            if ask is None or node != ask.leader or not isinstance(aid, int):
                return True  # not an answer from the node it was asked of
            self._end_ask(ask_id := aid)
            self._answered_by = (ask.leader, ask.term)
            index, error = message.get("index"), message.get("error")
            if isinstance(index, int) and not error:
                with self.resolving():
                    for r in ask.requests:
                        r.resolve(index)
            else:
                self._fail(ask.requests, f"the leader refused ask {ask_id}: {error or 'no index'}")
            # the requests that came while it was out: their ask now, sent after each of them arrived
            self._next_ask(self.raft.role() == LEADER, self.raft.current_term(), self.raft.leader_peer(),
                           self.clock())
            return True
        if kind == PING:
            follows = (self.raft.role() != LEADER and message.get("term") == self.raft.current_term()
                       and self.raft.leader_peer() == node)
            if follows and self.promise_s > 0:
                self.promise_until = max(self.promise_until, self.clock() + self.promise_s)
            self.raft.send(node, {"type": ANSWER, "id": message.get("id"), "term": message.get("term"),
                                               "yes": follows, "promise": self.promise_s if follows else 0.0})
            return True
        if kind == ANSWER:
            rid = message.get("id")
            rnd = self._rounds.get(rid) if isinstance(rid, int) else None
            if rnd is not None and message.get("yes") and message.get("term") == rnd.term:
                rnd.yes.add(node)
                promise = message.get("promise")
                rnd.promised[node] = float(promise) if isinstance(promise, (int, float)) and promise > 0 else 0.0
                self._check(message["id"])
            return True
        return False

    def _check(self, rid: int) -> None:
        rnd = self._rounds[rid]
        majority = (len(self.raft.other_peers()) + 1) // 2 + 1
        if len(rnd.yes) >= majority:
            del self._rounds[rid]
            self._extend_lease(rnd, majority - 1)
            with self.resolving():
                for r in rnd.requests:
                    r.resolve(rnd.index)

    def _extend_lease(self, rnd: _Round, others: int) -> None:
        """A lease from a confirmed round, only as long as the promises of a majority: this node's and
        the `others` longest among the yeses. A yes without a promise (a node whose lease is off, or one
        running code from before the lease, during a rolling upgrade) confirms the read index but
        counts for no lease: that node would vote for anyone."""
        promises = sorted((p for p in rnd.promised.values() if p > 0), reverse=True)
        if self.promise_s <= 0 or len(promises) < others or rnd.term == self._lease_given_up_term:
            return
        until = rnd.started + LEASE_FRACTION * min([self.promise_s, *promises[:others]])
        if rnd.term != self._lease[0] or until > self._lease[1]:
            self._lease = (rnd.term, until)
            self.publish_lease()

    def _finish(self, rid: int, error: str) -> None:
        rnd = self._rounds.pop(rid)
        self._fail(rnd.requests, error)

    @staticmethod
    def _fail(requests: list[_Request], error: str) -> None:
        for r in requests:
            r.resolve(0, error)


__all__ = ["LEASE_PROMISE_FRACTION", "TRANSFER_VOTE", "LeadershipConfirmer", "NotConfirmed"]
