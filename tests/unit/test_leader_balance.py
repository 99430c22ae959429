"""The leader-balancing duty's decision (nameserver/groups/leaderbalance.py): who is each group's preferred
leader, and when its leader hands the leadership over."""

from __future__ import annotations

import logging

import grpc
import pytest

from nameserver.groups.leaderbalance import APPLY_WITHIN, LeaderBalance, decide, not_ready, preferred_member
from nameserver.pb import api_pb2
from raftlog.binding import PeerLink
from raftlog.proposer import ProposalError

A, B, C = "10.0.0.1:9201", "10.0.0.1:9202", "10.0.0.2:9201"
CAUGHT_UP = PeerLink(connected=True, match_index=50, heard_s=0.1)


def test_group_k_prefers_the_k_mod_n_th_member_by_host_then_port_number() -> None:
    members = [C, B, A]
    assert [preferred_member(members, k) for k in range(4)] == [A, B, C, A]
    # the port's number, not its text: group 1's shifted ports (9301 / 10001) keep the nodes' order
    assert preferred_member(["h:10001", "h:9301"], 0) == "h:9301"


def test_n_groups_on_n_nodes_prefer_n_distinct_nodes() -> None:
    step, ports = 100, [9203, 9201, 9202]  # the nodes' own (group 0) Raft ports; group k's are + k x step
    picks = [int(preferred_member([f"h:{p + k * step}" for p in ports], k).rpartition(":")[2]) - k * step
             for k in range(3)]
    assert picks == [9201, 9202, 9203]


def _decide(self_addr: str = B, group: int = 0, link: PeerLink | None = CAUGHT_UP, last: int = 50,
            led_for: float = 10.0, settle: float = 5.0) -> str | None:
    links = {} if link is None else {A: link}
    return decide(self_addr, group, [A, B, C], links, last, led_for, settle).target


def test_a_settled_leader_hands_over_to_its_caught_up_preferred_member() -> None:
    assert _decide() == A


@pytest.mark.parametrize(("kwargs", "why"), [
    ({"self_addr": A, "link": None}, "already the preferred member"),
    ({"group": 1}, "group 1 prefers B, this leader"),
    ({"led_for": 4.9}, "not settled"),
    ({"settle": 0}, "off"),
    ({"link": None}, "the preferred member is no voter"),
    ({"link": PeerLink(connected=False, match_index=50, heard_s=0.1)}, "its link is down"),
    ({"link": PeerLink(connected=True, match_index=50, heard_s=30.0)}, "not heard from lately"),
    ({"link": PeerLink(connected=True, match_index=49, heard_s=0.1)}, "behind the leader's last entry"),
])
def test_the_leader_keeps_the_leadership(kwargs: dict, why: str) -> None:
    assert _decide(**kwargs) is None, why


def _node_status(ready: bool = True, applied: tuple[int, ...] = (50, 50), reason: str = "") -> api_pb2.NodeStatus:
    """A sharded node's Admin.Status: ready when all its group cores are; groups[k]: group k's core's."""
    groups = [api_pb2.NodeStatus(ready=ready, apply_offset=offset) for offset in applied]
    return api_pb2.NodeStatus(ready=ready, not_ready_reason=reason, apply_offset=applied[0], groups=groups)


class Unreachable(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "failed to connect to all addresses"


class FakeStatus:
    """The preferred member's node as the duty asks it (Server._status_of): its status, or a failing call."""

    def __init__(self, status: api_pb2.NodeStatus | None = None) -> None:
        self.status = status if status is not None else _node_status()
        self.failing = False
        self.asked: list[tuple[str, float]] = []

    def of(self, member: str, timeout: float) -> api_pb2.NodeStatus:
        self.asked.append((member, timeout))
        if self.failing:
            raise Unreachable()
        return self.status


class FakeLog:
    def __init__(self) -> None:
        self.leading = True
        self.current_term = 3
        self.links = {A: CAUGHT_UP}
        self.end_offset = 50
        self.commit_offset = 50
        self.transfers: list[str | None] = []
        self.refuse = False

    def term(self) -> int:
        return self.current_term

    def is_leader(self) -> bool:
        return self.leading

    def members(self) -> list[str]:
        return [A, B, C]

    def peer_links(self) -> dict[str, PeerLink]:
        return self.links

    def transfer_leadership(self, addr: str | None, timeout: float) -> None:
        if self.refuse:
            raise ProposalError("refused", unknown_outcome=False)
        self.transfers.append(addr)


def test_the_duty_waits_out_each_term_s_settle_period_and_counts_its_transfers() -> None:
    now = [100.0]
    counted: list[int] = []
    rlog = FakeLog()
    duty = LeaderBalance(rlog, B, 0, settle_s=5.0, status_of=FakeStatus().of,  # type: ignore[arg-type]
                         on_transfer=lambda: counted.append(1), clock=lambda: now[0])
    assert duty.check_every_s == 2.0
    assert duty.tick().target is None  # term 3 first led now
    now[0] += 5.0
    rlog.refuse = True  # e.g. the preferred member fell behind meanwhile: no count, tried again next check
    assert duty.tick().target is None and not counted
    rlog.refuse = False
    assert duty.tick().target == A
    assert rlog.transfers == [A] and counted == [1] and duty.transfers == 1
    rlog.current_term = 5  # led again in a later term: the settle period starts over
    now[0] += 1.0
    assert duty.tick().target is None
    now[0] += 5.0
    assert duty.tick().target == A
    assert counted == [1, 1]


def test_a_node_is_ready_to_lead_its_group_when_ready_and_applied_near_the_leader_s_commit() -> None:
    assert not_ready(_node_status(applied=(50, 50)), 1, 50) is None
    assert not_ready(_node_status(applied=(0, 50 - APPLY_WITHIN)), 1, 50) is None  # group 1's offset counts
    assert not_ready(_node_status(ready=False, reason="group 1: loading"), 1, 50) == (
        "not ready", "its node is not ready (group 1: loading)")
    assert not_ready(_node_status(applied=(50, 49 - APPLY_WITHIN)), 1, 50)[0] == "apply behind"  # type: ignore[index]
    assert not_ready(_node_status(applied=(50,)), 1, 50)[0] == "no group status"  # type: ignore[index]


def _settled(status: FakeStatus) -> tuple[FakeLog, LeaderBalance, list[float]]:
    """A leader of group 0 (B) past its settle period, its preferred member A caught up in Raft."""
    now = [100.0]
    rlog = FakeLog()
    duty = LeaderBalance(rlog, B, 0, settle_s=5.0, status_of=status.of, clock=lambda: now[0])  # type: ignore[arg-type]
    duty.tick()
    now[0] += 5.0
    return rlog, duty, now


def test_the_leadership_goes_only_to_a_node_that_answers_ready(caplog: pytest.LogCaptureFixture) -> None:
    status = FakeStatus(_node_status(ready=False, reason="group 0: node is loading its snapshot"))
    rlog, duty, _ = _settled(status)
    caplog.set_level(logging.INFO, "nameserver.groups.leaderbalance")
    for _ in range(3):  # caught up in Raft, but its workers have not opened its port / loaded the state
        decision = duty.tick()
        assert decision.target is None and "not ready" in decision.reason
    assert rlog.transfers == [] and status.asked == [(A, 1.0)] * 3
    waits = [r for r in caplog.records if "not handed" in r.getMessage()]
    assert len(waits) == 1, "one line per reason, not one per check"
    status.status = _node_status(applied=(50 - APPLY_WITHIN - 1, 50))  # ready, but group 0 applied too little
    assert duty.tick().target is None and rlog.transfers == []
    status.status = _node_status()
    assert duty.tick().target == A
    assert rlog.transfers == [A] and duty.transfers == 1
    assert len([r for r in caplog.records if "not handed" in r.getMessage()]) == 2


def test_no_transfer_while_the_node_s_status_call_fails(caplog: pytest.LogCaptureFixture) -> None:
    status = FakeStatus()
    status.failing = True  # its port not open yet: the call fails at once
    rlog, duty, _ = _settled(status)
    caplog.set_level(logging.INFO, "nameserver.groups.leaderbalance")
    for _ in range(3):
        decision = duty.tick()
        assert decision.target is None and "UNAVAILABLE" in decision.reason
    assert rlog.transfers == [] and len(status.asked) == 3
    assert len([r for r in caplog.records if "not handed" in r.getMessage()]) == 1
    status.failing = False  # asked again at the next check: now it answers ready
    assert duty.tick().target == A and rlog.transfers == [A]


def test_the_node_is_asked_only_once_the_raft_checks_pass() -> None:
    status = FakeStatus()
    rlog, duty, _ = _settled(status)
    rlog.links = {A: PeerLink(connected=True, match_index=49, heard_s=0.1)}  # behind in Raft: not asked
    assert duty.tick().target is None and status.asked == []
