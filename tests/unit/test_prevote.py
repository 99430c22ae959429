"""Pre-vote rules, against a stand-in for pysyncobj's private state (no sockets, a fake clock)."""

from __future__ import annotations

from raftlog.prevote import CANDIDATE, FOLLOWER, LEADER, REQUEST, RESPONSE, PreVote
from tests.unit.fakeraft import FakeRaft as _FakeRaft


def FakeRaft() -> _FakeRaft:  # a factory named as the class it makes
    """A follower at term 5 of leader L, its log ending at index 11 of term 5."""
    return _FakeRaft(FOLLOWER, 5, log=[(b"", 10, 4), (b"", 11, 5)])


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make() -> tuple[FakeRaft, PreVote, Clock]:
    raft, clock = FakeRaft(), Clock()
    return raft, PreVote(raft, 0.4, 1.4, clock=clock), clock


def ask(pv: PreVote, term: int = 6, index: int = 11, log_term: int = 5) -> bool:
    transport = pv.raft.transport
    transport.sent.clear()
    assert pv.on_message("B", {"type": REQUEST, "round": 1, "term": term, "last_log_index": index,
                               "last_log_term": log_term})
    (node, reply), = transport.sent
    assert node == "B" and reply["type"] == RESPONSE and reply["round"] == 1
    return reply["granted"]


def test_no_vote_while_a_leader_was_heard_within_the_minimum_timeout() -> None:
    raft, pv, clock = make()
    clock.now = 10.0
    assert not pv.on_message("L", {"type": "append_entries", "term": 5})  # passed on to pysyncobj
    clock.now = 10.3
    assert not ask(pv)
    clock.now = 10.5
    assert ask(pv)


def test_a_leader_never_pre_votes() -> None:
    raft, pv, _ = make()
    raft.state = LEADER
    assert not ask(pv)


def test_no_vote_for_a_staler_log_or_a_term_that_is_not_ahead() -> None:
    raft, pv, _ = make()
    raft.leader = None
    assert ask(pv, index=11, log_term=5)
    assert ask(pv, index=3, log_term=6)       # a newer last term wins whatever the index
    assert not ask(pv, index=10, log_term=5)  # same last term, shorter
    assert not ask(pv, index=99, log_term=4)  # older last term
    assert not ask(pv, term=5)                # the asker's next term is not past ours


def test_an_expired_timer_asks_first_and_campaigns_only_with_a_majority() -> None:
    raft, pv, clock = make()
    transport = raft.transport
    clock.now = 50.0
    pv.on_tick()  # timer (100) not expired
    assert transport.sent == [] and not pv.may_campaign()
    clock.now = 101.0
    pv.on_tick()
    assert sorted(n for n, _ in transport.sent) == ["B", "C"]
    request = transport.sent[0][1]
    assert request["term"] == 6 and (request["last_log_index"], request["last_log_term"]) == (11, 5)
    assert 101.4 <= raft.real_election_deadline <= 102.4  # pushed back by a fresh random timeout
    assert not pv.may_campaign()
    pv.on_message("B", {"type": RESPONSE, "round": request["round"], "granted": False})
    assert not pv.may_campaign()
    pv.on_message("C", {"type": RESPONSE, "round": request["round"] - 1, "granted": True})  # an old round
    assert not pv.may_campaign()
    pv.on_message("C", {"type": RESPONSE, "round": request["round"], "granted": True})
    assert pv.may_campaign() and raft.real_election_deadline == 0  # campaign at the next tick
    # pysyncobj campaigned (term 6) and lost: the next attempt asks again
    raft.state = CANDIDATE
    raft.term = 6
    raft.real_election_deadline = 103.0
    assert not pv.may_campaign()
    transport.sent.clear()
    clock.now = 103.5
    pv.on_tick()
    assert len(transport.sent) == 2 and transport.sent[0][1]["term"] == 7


def test_leadership_transfer_campaigns_without_asking() -> None:
    raft, pv, _ = make()
    raft.real_election_deadline = 0
    raft.transferring = True
    assert pv.may_campaign()
    pv.on_tick()
    assert raft.transport.sent == []


def test_a_single_node_needs_no_one_else() -> None:
    raft, pv, clock = make()
    raft.others = set()
    clock.now = 200.0
    pv.on_tick()
    assert pv.may_campaign()


def test_a_strictly_newer_log_than_the_leaders_gets_its_yes() -> None:
    # a survivor with data rejoining nodes that elected a leader among themselves with empty logs
    raft, pv, clock = make()
    raft.state = LEADER
    raft.log = [(b"", 1, 1)]
    raft.term = 1
    assert ask(pv, term=4, index=30, log_term=3)
    assert not ask(pv, term=4, index=1, log_term=1)  # merely as up to date: the leader stays


def test_a_follower_with_a_live_leader_says_no_even_to_a_newer_log() -> None:
    # a lagging follower must not help a starved, caught-up one depose the leader
    raft, pv, clock = make()
    clock.now = 10.0
    pv.on_message("L", {"type": "append_entries", "term": 5})
    clock.now = 10.1
    assert not ask(pv, term=6, index=40, log_term=5)


def test_two_timers_firing_together_make_one_candidate_not_a_split_vote() -> None:
    """A (this node) and B both time out; A asks first, B's request arrives, then B's grant."""
    raft, pv, clock = make()
    transport = raft.transport
    clock.now = 101.0
    pv.on_tick()  # A's round
    mine = transport.sent[0][1]["round"]
    # B asks before A heard back: A grants, drops its own round and steps back
    assert ask(pv, term=6, index=11, log_term=5)
    assert raft.real_election_deadline >= 101.4
    pv.on_message("B", {"type": RESPONSE, "round": mine, "granted": True})  # B's grant of A's old round
    assert not pv.may_campaign()  # A does not campaign against the node it granted


def test_a_won_pre_vote_campaigns_at_once_and_refuses_other_pre_votes_meanwhile() -> None:
    raft, pv, clock = make()
    transport = raft.transport
    clock.now = 101.0
    pv.on_tick()
    mine = transport.sent[0][1]["round"]
    wakes = raft.wakes
    pv.on_message("C", {"type": RESPONSE, "round": mine, "granted": True})
    assert pv.may_campaign() and raft.real_election_deadline == 0
    assert raft.wakes == wakes + 1  # the tick loop runs the election now, not after its 50 ms poll
    assert not ask(pv, term=6, index=11, log_term=5)  # about to campaign: no pre-vote for B
    assert pv.may_campaign()


def test_no_campaign_while_a_lease_promise_holds_but_a_transfer_campaigns() -> None:
    """A node that promised a leader its lease votes for no one until the promise ends, itself included."""
    raft, clock = FakeRaft(), Clock()
    promise = {"holds": True}
    pv = PreVote(raft, 0.4, 1.4, clock=clock, promised=lambda: promise["holds"])
    clock.now = 101.0
    pv.on_tick()
    mine = raft.transport.sent[0][1]["round"]
    pv.on_message("C", {"type": RESPONSE, "round": mine, "granted": True})
    assert pv.allowed_term is not None and not pv.may_campaign()  # won, but promised
    promise["holds"] = False
    assert pv.may_campaign()  # the promise ran out within the pre-vote's window: campaign now
    raft2, clock2 = FakeRaft(), Clock()
    pv2 = PreVote(raft2, 0.4, 1.4, clock=clock2, promised=lambda: True)
    raft2.real_election_deadline = 0
    raft2.transferring = True
    assert pv2.may_campaign() and pv2.transfer_term == 6  # the leader gave its lease up first


def test_the_leaders_link_going_down_brings_the_timer_forward_once_and_only_ever_earlier() -> None:
    """A dead leader's links close at once: campaign a minimum timeout after its last append, plus a
    margin and a little jitter (another follower that heard it a little later grants it: its link is down too)."""
    raft, clock = FakeRaft(), Clock()
    pv = PreVote(raft, 0.4, 1.4, clock=clock, heartbeat_s=0.1)
    clock.now = 10.0
    pv.on_message("L", {"type": "append_entries", "term": 5})
    raft.real_election_deadline = 11.3  # pysyncobj's random timeout after that append
    clock.now = 10.05
    pv.on_link_lost("B")  # a link to a follower: nothing to do with the leader
    assert raft.real_election_deadline == 11.3
    pv.on_link_lost("L")
    assert 10.42 <= raft.real_election_deadline <= 10.47 and pv.leader_links_lost == 1
    first = raft.real_election_deadline
    pv.on_link_lost("L")  # the reconnect attempts fail too: the same loss, drawn once
    assert raft.real_election_deadline == first and pv.leader_links_lost == 1
    # a timer already earlier stays
    raft2, clock2 = FakeRaft(), Clock()
    pv2 = PreVote(raft2, 0.4, 1.4, clock=clock2)
    clock2.now = 10.0
    pv2.on_message("L", {"type": "append_entries", "term": 5})
    raft2.real_election_deadline = 10.41
    pv2.on_link_lost("L")
    assert raft2.real_election_deadline == 10.41
    # a leader never expedites against itself
    raft3, clock3 = FakeRaft(), Clock()
    raft3.state = LEADER
    pv3 = PreVote(raft3, 0.4, 1.4, clock=clock3)
    pv3.on_link_lost("L")
    assert raft3.real_election_deadline == 100.0


def test_a_leader_that_comes_back_pushes_the_timer_back_and_a_round_refused_meanwhile_is_retried_soon() -> None:
    raft, clock = FakeRaft(), Clock()
    pv = PreVote(raft, 0.4, 1.4, clock=clock, heartbeat_s=0.1)
    transport = raft.transport
    clock.now = 10.0
    pv.on_message("L", {"type": "append_entries", "term": 5})
    pv.on_link_lost("L")
    clock.now = raft.real_election_deadline
    pv.on_tick()  # the round goes out; B still heard the leader lately and refuses it
    (_, request), *_ = transport.sent
    pv.on_message("B", {"type": RESPONSE, "round": request["round"], "granted": False})
    assert clock.now + 0.1 <= raft.real_election_deadline <= clock.now + 0.2  # retried within two heartbeats
    # the leader was alive after all: its next append is a fresh contact, and timeouts are whole again
    clock.now += 0.15
    pv.on_message("L", {"type": "append_entries", "term": 5})
    raft.real_election_deadline = clock.now + 0.9  # as pysyncobj resets it on an append
    transport.sent.clear()
    clock.now = raft.real_election_deadline
    pv.on_tick()
    assert clock.now + 0.4 <= raft.real_election_deadline <= clock.now + 1.4


def test_simultaneous_rounds_go_to_the_greater_address_and_only_while_they_are_simultaneous() -> None:
    """A ("A") and another node time out together with equal logs: A grants "B" (greater) and gives
    way; it refuses "0" (smaller) while its own round is fresh, and grants it once that round is old."""
    raft, pv, clock = make()
    clock.now = 101.0
    pv.on_tick()  # A's round
    transport = raft.transport
    transport.sent.clear()
    assert pv.on_message("0", {"type": REQUEST, "round": 1, "term": 6, "last_log_index": 11, "last_log_term": 5})
    assert transport.sent[0][1]["granted"] is False  # the smaller asker: A's round goes on
    clock.now = 101.06  # past the collision window: A's round is just slow, not simultaneous
    transport.sent.clear()
    assert pv.on_message("0", {"type": REQUEST, "round": 2, "term": 6, "last_log_index": 11, "last_log_term": 5})
    assert transport.sent[0][1]["granted"] is True
    raft2, pv2, clock2 = make()
    clock2.now = 101.0
    pv2.on_tick()
    assert ask(pv2, term=6, index=11, log_term=5)  # "B" > "A": granted at once


def test_an_empty_node_joining_a_cluster_with_data_never_campaigns_before_it_hears_a_leader() -> None:
    raft, clock = FakeRaft(), Clock()
    pv = PreVote(raft, 0.4, 1.4, clock=clock, await_leader=True)
    transport = raft.transport
    for now in (101.0, 103.0, 105.0):  # its timer runs out again and again: no round, timer pushed back
        clock.now = now
        pv.on_tick()
        assert transport.sent == [] and raft.real_election_deadline > now
    assert ask(pv, term=6, index=11, log_term=5)  # it still votes (the survivor's log is as new)
    clock.now = 106.0
    pv.on_message("L", {"type": "append_entries", "term": 5})  # a leader is heard: an ordinary node now
    clock.now = raft.real_election_deadline = 108.0
    transport.sent.clear()
    pv.on_tick()
    assert len(transport.sent) == 2 and transport.sent[0][1]["type"] == REQUEST


def test_a_deadline_brought_forward_is_woken_for_not_left_to_the_50_ms_poll() -> None:
    """A dead leader sends nothing, so pysyncobj's tick thread would notice the earlier timer only at its
    next 50 ms poll: the pre-vote asks for a wake at the deadline itself, and again for a refused round's retry."""
    raft, clock = FakeRaft(), Clock()
    asked: list[float] = []
    pv = PreVote(raft, 0.4, 1.4, clock=clock, heartbeat_s=0.1,
                 wake_after=lambda delay, fn: (asked.append(delay), fn()))
    clock.now = 10.0
    pv.on_message("L", {"type": "append_entries", "term": 5})
    clock.now = 10.05
    pv.on_link_lost("L")
    assert len(asked) == 1 and abs(clock.now + asked[0] - raft.real_election_deadline) < 1e-9
    assert raft.wakes == 1
    clock.now = raft.real_election_deadline
    pv.on_tick()  # the round goes out while the link is still down: its retry is woken for too
    assert len(asked) == 2 and 0.1 <= asked[1] <= 0.2 and raft.wakes == 2


def test_the_default_wake_runs_on_a_timer_thread() -> None:
    import threading

    from raftlog import prevote
    done = threading.Event()
    prevote._timer(0.01, done.set)
    assert done.wait(5.0)


def test_a_follower_whose_own_link_to_the_leader_is_down_grants_inside_the_minimum() -> None:
    """Both followers of a dead leader lost their links to it; the one that heard its last heartbeat a little
    later still grants the other's pre-vote. A follower still hearing the leader refuses, as before."""
    raft, pv, clock = make()
    clock.now = 10.0
    pv.on_message("L", {"type": "append_entries", "term": 5})
    clock.now = 10.3  # inside the minimum (0.4) since the leader's last append
    assert not ask(pv)  # the link is up: a live leader
    pv.on_link_lost("L")
    assert ask(pv)
    # the leader was alive after all: its next append is a fresh contact, and the refusal is back
    clock.now = 10.35
    pv.on_message("L", {"type": "append_entries", "term": 5})
    assert not ask(pv)
