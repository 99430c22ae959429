"""Raft's pre-vote (Ongaro's thesis, section 9.6), added around pysyncobj, which has none.

Without it, any follower whose timer fires starts a real election at term + 1, and the leader
steps down on seeing that term. On a 2-core machine a follower starved of the GIL by a large
apply, or a node coming back from a partition, deposed a healthy leader this way (measured:
four elections in 30 s while loading a million records).

With it, a node whose election timer is about to fire first asks its peers "would you vote for
me at term + 1?" without changing any term. A peer says yes only if it has not heard from a
leader within the minimum election timeout (it is not the leader itself) and the asker's log is
at least as up to date as its own. Only with a majority of yeses does the node let pysyncobj's
timer fire and run the real election; otherwise the timer is pushed back by a fresh random
timeout. The leader itself says yes to a log strictly newer than its own: that happens only when
the leadership lacks entries (an operator's single-survivor recovery).
Leadership transfer (TimeoutNow) skips the pre-vote, as in etcd.

Split votes. Two followers whose timers fire close together both won their pre-votes (each granted the
other's) and both campaigned: a split vote, and a second election timeout (one failover in 20 took
1.3 s). Now a node that won its pre-vote campaigns at once (it wakes its tick loop instead of waiting
out the 50 ms poll), refuses pre-votes while it is about to campaign, and a node that grants a pre-vote
drops its own round and pushes its timer back: the asker will campaign first.

A leader whose process died closes its links at once (the kernel ends the TCP connections of a process
that exits), long before any election timer. A follower whose link to its leader goes down brings its
timer forward to the minimum election timeout after the leader's last append, plus LINK_LOST_MARGIN_S and
a jitter of up to LINK_LOST_JITTER_S, and wakes the tick thread for it (a dead leader sends nothing that
would wake it before pysyncobj's 50 ms poll). It is only ever earlier: a leader that is alive reconnects
within the 0.1 s retry and its next append pushes the timer back, and a pre-vote asked meanwhile is refused
by every follower still hearing it, so nothing is disrupted. A follower whose own link to that leader is
down too grants it even inside the minimum: another follower may have heard the dead leader's last
heartbeat a little later (until session 24 the asker waited one more heartbeat period for that, and a
refused round cost a retry: failover's p99 sat at 0.57-0.75 s; the real vote's rules are unchanged). A leader cut off
by the network, or a dead machine, closes no link: its followers wait out their timers. While the link
stays down, a round that fails is retried within one to two heartbeat periods rather than a whole
election timeout (a pre-vote changes no term, so retrying disturbs no one). Two followers that start
rounds at the same moment (within COLLISION_WINDOW_S): a node in a round of its own grants a pre-vote to
an asker with an equal log only if the asker's address is the greater, so the greater wins at once
instead of both giving way and waiting out a second timeout.

A node that joins a cluster with data (`[cluster] initial_state = "existing"`, an empty log) never
campaigns before it has heard a leader: beside one survivor of a lost majority, two empty nodes are a
majority and would otherwise elect one of themselves, whose appends then cut the survivor's log back
(found by test_operations.py's recovery from a single survivor). It still votes: for a candidate whose
log is at least as new as its own, the survivor's.

The gate is airtight: the binding makes pysyncobj's election timer attribute a property that
reads as "never" unless `may_campaign()`, so pysyncobj cannot start an election behind our back
however late a tick runs. Everything here runs on pysyncobj's tick thread: messages arrive
through the transport callback the binding wraps, and `on_tick` runs at the end of every tick.
Peers running code without pre-vote ignore the extra message types (so such a node never
campaigns until they are upgraded).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from raftlog.raftview import RaftView
from raftlog.roles import Role

log = logging.getLogger("raftlog.prevote")

REQUEST = "ns_pre_vote"
RESPONSE = "ns_pre_vote_response"
FOLLOWER, CANDIDATE, LEADER = Role.FOLLOWER, Role.CANDIDATE, Role.LEADER
LINK_LOST_MARGIN_S = 0.02
LINK_LOST_JITTER_S = 0.05
COLLISION_WINDOW_S = 0.05  # rounds started this close together are simultaneous (a few round trips)
NEVER = -1e18  # no leader heard yet


def _timer(delay_s: float, fn: Callable[[], None]) -> None:
    """Call fn once after delay_s on a timer thread of its own (rare: a leader's link lost, a retry)."""
    timer = threading.Timer(delay_s, fn)
    timer.daemon = True
    timer.start()


def _address(node: Any) -> str:
    """A node's "host:port" (pysyncobj's TCPNode), for the tie-break between simultaneous rounds."""
    return str(getattr(node, "address", node))


class PreVote:
    def __init__(self, raft: RaftView, election_min_s: float, election_max_s: float,
                 clock: Callable[[], float] = time.monotonic,
                 promised: Callable[[], bool] = lambda: False, heartbeat_s: float = 0.1,
                 await_leader: bool = False,
                 wake_after: Callable[[float, Callable[[], None]], None] | None = None) -> None:
        self.raft = raft
        # pysyncobj's tick thread looks at the election timer only when it wakes, every 50 ms at most when
        # nothing arrives (a dead leader sends nothing): a deadline we set is woken for, not polled for
        self.wake_after = wake_after or _timer
        self.heartbeat_s = heartbeat_s
        self.promised = promised  # a lease promise to a leader holds now: no campaign
        self.election_min_s = election_min_s
        self.election_max_s = election_max_s
        self.clock = clock
        self.last_leader_contact = NEVER
        self.round = 0
        self.votes: set[Any] = set()
        self.allowed_term: int | None = None  # a majority pre-voted: pysyncobj may campaign from this term
        self.allowed_until = 0.0
        self.transfer_term = -1  # the term of the election a TimeoutNow started
        self.rounds_started = 0
        self.rounds_won = 0
        self.round_open_until = 0.0  # our own round holds out against equal askers until then
        self.expedited_for: float | None = None  # the leader contact whose link loss brought the timer forward
        self.leader_links_lost = 0
        self.await_leader = await_leader  # an empty node joining a cluster with data: no round before a leader

    # ---- the Raft node's state (raftlog/raftview.py) -----------------------------------------

    def _deadline(self) -> float:
        return self.raft.real_election_deadline

    def _set_deadline(self, value: float) -> None:
        self.raft.real_election_deadline = value

    def _last_log(self) -> tuple[int, int]:
        return self.raft.last_log()

    def _send(self, node: Any, message: dict[str, Any]) -> None:
        self.raft.send(node, message)

    # ---- hooks ---------------------------------------------------------------------------------

    def on_message(self, node: Any, message: Any) -> bool:
        """Handle pre-vote messages (True: consumed); note the leader's appends on the way."""
        if not isinstance(message, dict):
            return False
        kind = message.get("type")
        if kind == "append_entries" and message.get("term", -1) >= self.raft.current_term():
            self.last_leader_contact = self.clock()
            return False
        if kind == REQUEST:
            granted = self._would_vote(message, _address(node))
            if granted and self.raft.role() != LEADER:
                # the asker campaigns first: drop our own round, and let its election run its course
                self.round += 1
                self.votes = set()
                self.round_open_until = 0.0
                self._set_deadline(self.clock() + random.uniform(self.election_min_s, self.election_max_s))
            log.debug("pre-vote asked by %s for term %s: %s", _address(node), message.get("term"),
                      "granted" if granted else "refused")
            self._send(node, {"type": RESPONSE, "round": message.get("round"), "granted": granted})
            return True
        if kind == RESPONSE:
            if message.get("round") == self.round and message.get("granted"):
                self.votes.add(node)
                self._maybe_won()
            return True
        return False

    def on_link_lost(self, node: Any) -> None:
        """A Raft link went down: if it was our leader's, bring the election timer forward."""
        if self.raft.role() != FOLLOWER or node is None or node != self.raft.leader_peer() \
                or self.expedited_for == self.last_leader_contact:
            return
        self.expedited_for = self.last_leader_contact
        self.leader_links_lost += 1
        at = self.last_leader_contact + self.election_min_s + LINK_LOST_MARGIN_S \
            + random.uniform(0, LINK_LOST_JITTER_S)
        if at < self._deadline():
            self._set_deadline(max(at, self.clock()))
            self.wake_after(max(0.0, at - self.clock()), self.raft.wake)
            log.info("raft link to leader %s is down: a pre-vote in %.3f s unless it comes back", _address(node),
                     max(0.0, at - self.clock()))

    def _would_vote(self, request: dict[str, Any], asker: str) -> bool:
        if request.get("term", -1) <= self.raft.current_term():
            return False
        if self.allowed_term is not None:
            return False  # this node won its own pre-vote and campaigns now
        index, term = self._last_log()
        their_index, their_term = request.get("last_log_index", -1), request.get("last_log_term", -1)
        newer = their_term > term or (their_term == term and their_index > index)
        if self.raft.role() == LEADER:
            # Only a log strictly newer than the leader's own: the asker holds entries this
            # leadership lacks, which normal operation never produces but an operator's
            # single-survivor recovery does (operations.md). Without this it could never campaign.
            return newer
        if self.raft.leader_peer() is not None and self.expedited_for != self.last_leader_contact and \
                self.clock() - self.last_leader_contact < self.election_min_s:
            return False  # a live leader: the asker is starved or cut off, not the cluster
        if newer:
            return True
        if their_term != term or their_index != index:
            return False
        # Equal logs. In a round of our own, the greater address wins (module docstring).
        return self.clock() >= self.round_open_until or asker > self._self_address()

    def _self_address(self) -> str:
        return _address(self.raft.self_peer())

    def _majority(self) -> int:
        return (len(self.raft.other_peers()) + 1) // 2 + 1

    def _maybe_won(self) -> None:
        if len(self.votes) >= self._majority() and self.allowed_term is None:
            log.debug("pre-vote round %d won", self.round)
            self.rounds_won += 1
            self.round_open_until = 0.0
            self.allowed_term = self.raft.current_term()
            self.allowed_until = self.clock() + self.election_max_s
            self._set_deadline(0)  # campaign at the next tick: now, not after the 50 ms poll
            self.raft.wake()

    def may_campaign(self) -> bool:
        """Whether pysyncobj may see its election timer (the binding hides it otherwise)."""
        if self._deadline() == 0 and self.raft.transfer_in_progress():
            # TimeoutNow from the leader: campaign at once, with vote requests the binding tags as a
            # transfer's (raftlog/leadership.py: the leader gave up its lease before sending it)
            self.transfer_term = self.raft.current_term() + 1
            return True
        # A node that promised a leader its lease votes for no one, itself included, until the promise
        # ends (raftlog/leadership.py); the pre-vote won stays good until allowed_until meanwhile.
        return self.allowed_term is not None and self.raft.current_term() == self.allowed_term \
            and self.clock() < self.allowed_until and not self.promised()

    def on_tick(self) -> None:
        if self.raft.self_peer() is None or self.raft.role() == LEADER:
            self.allowed_term = None
            return
        now = self.clock()
        if self.allowed_term is not None:
            if self.raft.current_term() == self.allowed_term and now < self.allowed_until:
                return  # the real election is about to start
            self.allowed_term = None  # it ran (the term moved on) or never did
        deadline = self._deadline()
        if deadline == 0 and self.raft.transfer_in_progress():
            return
        if deadline > now:
            return
        if self.await_leader:
            if self.last_leader_contact == NEVER:
                self._set_deadline(now + random.uniform(self.election_min_s, self.election_max_s))
                return
            self.await_leader = False
        self.round += 1
        self.rounds_started += 1
        self.votes = {self.raft.self_peer()}
        self.round_open_until = now + COLLISION_WINDOW_S
        if self.expedited_for == self.last_leader_contact:  # our leader's link is down: retry soon
            retry = random.uniform(self.heartbeat_s, 2 * self.heartbeat_s)
            self._set_deadline(now + retry)
            self.wake_after(retry, self.raft.wake)
        else:
            self._set_deadline(now + random.uniform(self.election_min_s, self.election_max_s))
        index, term = self._last_log()
        request = {"type": REQUEST, "round": self.round, "term": self.raft.current_term() + 1,
                   "last_log_index": index, "last_log_term": term}
        log.debug("pre-vote round %d for term %d", self.round, request["term"])
        for node in list(self.raft.other_peers()):
            self._send(node, request)
        self._maybe_won()  # a single-node cluster needs no one else


__all__ = ["PreVote"]
