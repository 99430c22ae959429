"""The leader-balancing duty's decision (nameserver/groups/leaderbalance.py): who is each group's preferred
leader, and when its leader hands the leadership over."""

from __future__ import annotations

import pytest

from nameserver.groups.leaderbalance import LeaderBalance, decide, preferred_member
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


class FakeLog:
    def __init__(self) -> None:
        self.leading = True
        self.current_term = 3
        self.links = {A: CAUGHT_UP}
        self.end_offset = 50
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
    duty = LeaderBalance(rlog, B, 0, settle_s=5.0, on_transfer=lambda: counted.append(1),  # type: ignore[arg-type]
                         clock=lambda: now[0])
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
