"""The leader-balancing duty: each group's leadership goes back to its preferred member (docs/scaling.md,
"Sharding": leader balance), as Kafka's auto leader rebalance moves a partition's leadership back to its
preferred replica.

With [sharding] groups = G > 1 sharding spreads the write load only while the G leaders sit on different
nodes; elections alone leave them wherever the last one fell (a restarted node leads nothing until
another election). Group k's preferred leader is the (k mod N)-th of its N Raft members sorted by host,
then port number (every group shifts each member's port by the same k x raft_port_step, so the order is
the nodes' [[cluster.members]] raft_addr order in every group, and groups 0..N-1 prefer N distinct nodes).

Every group core runs this as a leader duty (nameserver/core/leaderduties.py). A leader that is not its
group's preferred member, once it has led this term for [sharding] leader_balance_s and the preferred
member is a voter whose link is up, that answered within HEARD_WITHIN_S and whose log matches the
leader's last entry (what pysyncobj's transferLeadership needs: it refuses a target behind), and whose node
is ready to lead, hands it the leadership (Raft's TimeoutNow, raftlog/log.py transfer_leadership). Off with
one group, or with leader_balance_s = 0.

Raft's catch-up is not readiness: a restarted node's log matches long before its workers have loaded the
state and opened its public gRPC port, and every other node forwards its writes to the leader's public port
(nameserver/core/forwarder.py), so a leader there would stall the cluster's writes until it opens. So the
leader first asks the preferred member's node for its Admin.Status over that port (STATUS_TIMEOUT_S; the
forwarder's channel to it: `ask`), and hands over only when the node answers ready (every group core ready
and answering its workers) with its group's apply offset within APPLY_WITHIN entries of this leader's commit
offset. A failed or negative check is tried again at the next check, its reason logged once until it changes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from nameserver.pb import api_pb2
from raftlog.binding import PeerLink
from raftlog.log import ReplicatedLog
from raftlog.proposer import ProposalError

log = logging.getLogger("nameserver.groups.leaderbalance")
CHECK_S = 2.0  # how often a leader checks (at most; a shorter settle period checks as often as it lasts)
HEARD_WITHIN_S = 2.0  # the preferred member answered the leader's appends this recently
TRANSFER_TIMEOUT_S = 2.0  # the transfer's request (pysyncobj answers at once: sent, or refused)
STATUS_TIMEOUT_S = 1.0  # the preferred member's node answers Admin.Status within this (a duty must not block long)
APPLY_WITHIN = 100  # its group's apply offset at most this many entries behind the leader's commit offset
# Asks a member's node (by the member's Raft address) for its Admin.Status; raises when it does not answer.
StatusOf = Callable[[str, float], api_pb2.NodeStatus]


def _sort_key(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host, int(port) if port.isdigit() else -1


def preferred_member(members: list[str], group: int) -> str:
    """Group `group`'s preferred leader: the (group mod N)-th of its N members sorted by host, then port."""
    if not members:
        raise ValueError("a group has at least one member")
    ordered = sorted(members, key=_sort_key)
    return ordered[group % len(ordered)]


@dataclass(frozen=True)
class Decision:
    target: str | None  # the member to hand the leadership to; None: keep it
    reason: str         # why (logged with a transfer)


def decide(self_addr: str, group: int, members: list[str], links: Mapping[str, PeerLink], last_index: int,
           led_for_s: float, settle_s: float) -> Decision:
    """What the leader `self_addr` of `group` does now: hand the leadership to its preferred member, or
    keep it (and why)."""
    if settle_s <= 0:
        return Decision(None, "leader balancing is off")
    preferred = preferred_member(members, group)
    if preferred == self_addr:
        return Decision(None, "this member is the preferred leader")
    if led_for_s < settle_s:
        return Decision(None, f"led for {led_for_s:.1f} s, under the settle period of {settle_s:g} s")
    link = links.get(preferred)
    if link is None:
        return Decision(None, f"the preferred leader {preferred} is not a voter this leader knows")
    if not link.connected:
        return Decision(None, f"the preferred leader {preferred} is not connected")
    if link.heard_s > HEARD_WITHIN_S:
        return Decision(None, f"the preferred leader {preferred} last answered {link.heard_s:.1f} s ago")
    if link.match_index < last_index:
        return Decision(None, f"the preferred leader {preferred} is behind ({link.match_index} < {last_index})")
    return Decision(preferred, f"{preferred} is group {group}'s preferred leader (member {group % len(members)} "
                    f"of {len(members)} by address), caught up at {link.match_index}, and this member has led "
                    f"for {led_for_s:.1f} s (settle period {settle_s:g} s)")


def not_ready(status: api_pb2.NodeStatus, group: int, commit_offset: int) -> tuple[str, str] | None:
    """Why a node answering `status` is not ready to lead `group` now (a short key, and a message), or None
    when it is: its node must be ready (a sharded node: every group core ready, answering its workers), and
    its group's core must have applied up to within APPLY_WITHIN entries of `commit_offset` (the leader's)."""
    if not status.ready:
        why = status.not_ready_reason or "no reason given"
        return "not ready", f"its node is not ready ({why})"
    own = status.groups[group] if group < len(status.groups) else (status if group == 0 else None)
    if own is None:  # a node that lists no status of this group cannot say it applied it
        return "no group status", f"its node's status lists no group {group}"
    if own.apply_offset < commit_offset - APPLY_WITHIN:
        return "apply behind", (f"its group {group} applied {own.apply_offset}, over {APPLY_WITHIN} entries behind "
                                f"this leader's commit offset {commit_offset}")
    return None


class LeaderBalance:
    """The duty over one group core's log: tick() every check_every_s while this core leads."""

    def __init__(self, rlog: ReplicatedLog, self_addr: str, group: int, settle_s: float, status_of: StatusOf,
                 on_transfer: Callable[[], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.log = rlog
        self.self_addr = self_addr
        self.group = group
        self.settle_s = settle_s
        self.status_of = status_of  # the preferred member's node's Admin.Status (its readiness to lead)
        self.on_transfer = on_transfer  # told of each transfer made (the metrics count them)
        self.clock = clock
        self._term = -1
        self._since = 0.0
        self.transfers = 0
        self._waiting: tuple[str, str] | None = None  # the last readiness refusal logged: (target, key)

    @property
    def check_every_s(self) -> float:
        return min(CHECK_S, self.settle_s)

    def tick(self) -> Decision:
        """One check (a leader duty: runs only while this core leads)."""
        rlog = self.log
        now = self.clock()
        term = rlog.term()
        if term != self._term:  # a new term led: the settle period starts now
            self._term, self._since = term, now
        if not rlog.is_leader():
            return Decision(None, "not the leader")
        decision = decide(self.self_addr, self.group, rlog.members(), rlog.peer_links(), rlog.end_offset,
                          now - self._since, self.settle_s)
        if decision.target is None:
            return decision
        refusal = self._not_ready(decision.target, rlog.commit_offset)
        if refusal is not None:
            return Decision(None, refusal)
        try:
            rlog.transfer_leadership(decision.target, TRANSFER_TIMEOUT_S)
        except ProposalError as exc:  # refused (it fell behind meanwhile, or this core was deposed): next check
            log.debug("group %d: leadership not handed to %s: %s", self.group, decision.target, exc)
            return Decision(None, f"transfer refused: {exc}")
        self.transfers += 1
        self._waiting = None
        if self.on_transfer is not None:
            self.on_transfer()
        log.info("group %d: handing the leadership from %s to %s: %s", self.group, self.self_addr,
                 decision.target, decision.reason,
                 extra={"event": "leader_balance", "from": self.self_addr, "to": decision.target})
        return decision

    def _not_ready(self, target: str, commit_offset: int) -> str | None:
        """Why `target`'s node is not ready to lead this group (asked now), or None when it is. Each reason is
        logged once, until another (or a transfer) takes its place: the check runs every few seconds."""
        try:
            status = self.status_of(target, STATUS_TIMEOUT_S)
        except Exception as exc:  # unreachable (its port not open yet), timed out, refused: asked again next check
            code = getattr(exc, "code", None)
            name = code().name if callable(code) else type(exc).__name__
            details = getattr(exc, "details", None)
            refusal: tuple[str, str] | None = (f"no status: {name}", f"its node's Admin.Status failed: {name}"
                                               + (f": {details()}" if callable(details) and details() else ""))
        else:
            refusal = not_ready(status, self.group, commit_offset)
        if refusal is None:
            return None
        key, message = refusal
        reason = f"the preferred leader {target} is caught up but not ready to lead: {message}"
        if self._waiting != (target, key):
            self._waiting = (target, key)
            log.info("group %d: leadership not handed to %s yet: %s (asked again every %g s; logged once per reason)",
                     self.group, target, reason, self.check_every_s,
                     extra={"event": "leader_balance_wait", "to": target, "reason": key})
        return reason
