"""Read index by heartbeat round, against a stand-in for pysyncobj's private state (no sockets)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

import pytest

from raftlog.leadership import (
    ANSWER,
    ASK,
    ASK_SILENCE_S,
    LEADER,
    LEASE_FRACTION,
    PING,
    RENEW_FRACTION,
    TELL,
    TRANSFER_VOTE,
    LeadershipConfirmer,
    NotConfirmed,
)
from tests.unit.fakeraft import FakeRaft as _FakeRaft

FOLLOWER = 0


def FakeRaft(state: int = LEADER) -> _FakeRaft:  # a factory named as the class it makes
    """A node of term 7 (leading by default) whose no-op is at 40 and commit index at 42."""
    return _FakeRaft(state, 7, noop=40, commit=42)


def in_background(call: Callable[[], int], queued: queue.SimpleQueue) -> tuple[threading.Thread, dict[str, Any]]:
    """Run `call` (a read index) on a thread until its request is in `queued`; its index or error in out."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["index"] = call()
        except NotConfirmed as exc:
            out["error"] = str(exc)

    t = threading.Thread(target=run)
    t.start()
    while queued.empty():
        pass
    return t, out


def ask_in_background(c: LeadershipConfirmer) -> tuple[threading.Thread, dict[str, Any]]:
    return in_background(lambda: c.read_index(5), c._queue)


def test_a_majority_of_yes_confirms_the_commit_index_at_the_time_of_the_ping() -> None:
    raft = FakeRaft()
    c = LeadershipConfirmer(raft)
    t, out = ask_in_background(c)
    c.on_tick()
    pings = raft.transport.sent
    assert sorted(n for n, _ in pings) == ["B", "C"] and pings[0][1]["type"] == PING
    rid = pings[0][1]["id"]
    raft.raftCommitIndex = 50  # commits after the ping do not change this round's index
    c.on_message("B", {"type": ANSWER, "id": rid, "term": 7, "yes": False})
    c.on_message("C", {"type": ANSWER, "id": rid, "term": 6, "yes": True})  # another term: not counted
    assert t.is_alive()
    c.on_message("C", {"type": ANSWER, "id": rid, "term": 7, "yes": True})
    t.join(5)
    assert out == {"index": 42}


@pytest.mark.parametrize("change", ["follower", "no commit this term"])
def test_no_confirmation_without_leadership_or_a_commit_of_this_term(change: str) -> None:
    raft = FakeRaft()
    if change == "follower":
        raft.state = FOLLOWER
    else:
        raft.raftCommitIndex = 39
    c = LeadershipConfirmer(raft)
    t, out = ask_in_background(c)
    c.on_tick()
    t.join(5)
    assert "error" in out and raft.transport.sent == []


def test_losing_leadership_fails_the_rounds_in_flight() -> None:
    raft = FakeRaft()
    c = LeadershipConfirmer(raft)
    t, out = ask_in_background(c)
    c.on_tick()
    raft.term = 8  # a newer term began
    raft.state = FOLLOWER
    c.on_tick()
    t.join(5)
    assert "leadership lost" in out["error"]


def test_a_follower_says_yes_only_to_its_leader_in_its_term() -> None:
    raft = FakeRaft(state=FOLLOWER)
    c = LeadershipConfirmer(raft)
    sent = raft.transport.sent
    assert c.on_message("L", {"type": PING, "id": 3, "term": 7})
    assert c.on_message("X", {"type": PING, "id": 4, "term": 7})  # not our leader
    assert c.on_message("L", {"type": PING, "id": 5, "term": 6})  # an old term
    assert [(n, m["id"], m["yes"]) for n, m in sent] == [("L", 3, True), ("X", 4, False), ("L", 5, False)]
    assert not c.on_message("L", {"type": "append_entries", "term": 7})  # passed on to pysyncobj


# ---- the leader lease and the follower's ask ------------------------------------------------------

class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def leased(state: int = LEADER, promise_s: float = 0.24) -> tuple[FakeRaft, LeadershipConfirmer, Clock]:
    raft, clock = FakeRaft(state), Clock()
    return raft, LeadershipConfirmer(raft, promise_s, clock=clock), clock


def confirm_round(raft: FakeRaft, c: LeadershipConfirmer, *yes: str) -> None:
    """Run one tick and answer its ping round with yes from `yes`."""
    sent = raft.transport.sent
    before = len(sent)
    c.on_tick()
    pings = [m for _, m in sent[before:] if m["type"] == PING]
    assert pings, "the tick started no round"
    for node in yes:
        c.on_message(node, {"type": ANSWER, "id": pings[0]["id"], "term": pings[0]["term"], "yes": True,
                            "promise": 0.24})


def test_a_confirmed_round_gives_a_lease_that_ends_before_the_promises_it_rests_on() -> None:
    raft, c, clock = leased()
    assert c.leased_index() is None  # no round yet
    confirm_round(raft, c)  # the renewal round: no reads needed
    assert c.leased_index() is None  # no majority yet
    sent = raft.transport.sent
    c.on_message("B", {"type": ANSWER, "id": sent[-1][1]["id"], "term": 7, "yes": True, "promise": 0.24})
    assert c.leased_index() == 42
    raft.raftCommitIndex = 45
    assert c.leased_index() == 45  # the commit index now, not the round's
    clock.now += LEASE_FRACTION * 0.24 - 0.001
    assert c.leased_index() == 45
    clock.now += 0.002
    assert c.leased_index() is None  # run out: LEASE_FRACTION of the promise, never all of it
    assert c.promise_until >= 100.0 + 0.24  # the leader itself votes for no one meanwhile


@pytest.mark.parametrize("change", ["stepped down", "new term", "gave it up", "no commit this term"])
def test_no_lease_read_after_anything_that_could_have_made_another_leader(change: str) -> None:
    raft, c, _ = leased()
    confirm_round(raft, c, "B")
    assert c.leased_index() == 42
    if change == "stepped down":
        raft.state = FOLLOWER
    elif change == "new term":
        raft.term = 8
    elif change == "gave it up":
        c.give_up_lease()  # TimeoutNow is about to go out
    else:
        raft.noop = 50
    assert c.leased_index() is None


def test_after_giving_up_the_lease_no_round_of_this_term_brings_it_back() -> None:
    raft, c, clock = leased()
    c.give_up_lease()
    sent = raft.transport.sent
    c.on_tick()
    assert sent == []  # no renewal round in this term
    t, out = ask_in_background(c)  # a read still gets its own round
    c.on_tick()
    c.on_message("B", {"type": ANSWER, "id": sent[-1][1]["id"], "term": 7, "yes": True})
    t.join(5)
    assert out == {"index": 42} and c.leased_index() is None


def test_renewal_rounds_run_every_quarter_promise_and_only_with_a_lease_configured() -> None:
    raft, c, clock = leased()
    sent = raft.transport.sent
    c.on_tick()
    assert len(sent) == 2
    clock.now += RENEW_FRACTION * 0.24 / 2
    c.on_tick()
    assert len(sent) == 2
    clock.now += RENEW_FRACTION * 0.24
    c.on_tick()
    assert len(sent) == 4
    raft2 = FakeRaft()
    LeadershipConfirmer(raft2).on_tick()  # no lease: no round without a read
    assert raft2.transport.sent == []


def test_a_yes_promises_no_vote_for_the_promise_time_and_a_transfer_vote_is_still_granted() -> None:
    raft, c, clock = leased(state=FOLLOWER)
    assert c.refuses_vote({"type": "request_vote", "term": 8})  # (re)started: promised at once
    clock.now += 0.25
    assert not c.refuses_vote({"type": "request_vote", "term": 8})
    c.on_message("L", {"type": PING, "id": 1, "term": 7})
    answer = raft.transport.sent[-1][1]
    assert answer["yes"] and answer["promise"] == 0.24  # the yes says what it promised
    clock.now += 0.2
    assert c.refuses_vote({"type": "request_vote", "term": 8})
    assert not c.refuses_vote({"type": "request_vote", "term": 8, TRANSFER_VOTE: True})
    c.on_message("X", {"type": PING, "id": 2, "term": 7})  # a no promises nothing
    clock.now += 0.05
    assert not c.refuses_vote({"type": "request_vote", "term": 8})
    assert not LeadershipConfirmer(FakeRaft(FOLLOWER)).refuses_vote({"type": "request_vote"})  # no lease


def follower_asks(raft: FakeRaft, c: LeadershipConfirmer) -> tuple[threading.Thread, dict[str, Any]]:
    t, out = in_background(lambda: c.read_index_from_leader(5), c._ask_queue)
    c.on_tick()
    return t, out


def test_a_follower_asks_its_leader_and_the_leader_answers_under_its_lease_at_once() -> None:
    f_raft, follower, _ = leased(state=FOLLOWER)
    l_raft, leader, _ = leased()
    confirm_round(l_raft, leader, "B")
    t, out = follower_asks(f_raft, follower)
    (to, ask), = [(n, m) for n, m in f_raft.transport.sent if m["type"] == ASK]
    assert to == "L"
    l_raft.transport.sent.clear()
    leader.on_message("A", ask)
    (back, tell), = l_raft.transport.sent
    assert back == "A" and tell == {"type": TELL, "id": ask["id"], "index": 42, "error": ""}
    follower.on_message("X", tell)  # not from the node asked: ignored
    assert t.is_alive()
    follower.on_message("L", tell)
    t.join(5)
    assert out == {"index": 42}


def test_without_a_lease_the_leader_answers_an_ask_after_a_ping_round() -> None:
    l_raft = FakeRaft()
    leader = LeadershipConfirmer(l_raft)
    leader.on_message("A", {"type": ASK, "id": 9})
    sent = l_raft.transport.sent
    assert sent == []
    leader.on_tick()
    ping = sent[-1][1]
    assert ping["type"] == PING
    l_raft.raftCommitIndex = 60
    leader.on_message("C", {"type": ANSWER, "id": ping["id"], "term": 7, "yes": True})
    assert sent[-1] == ("A", {"type": TELL, "id": 9, "index": 42, "error": ""})


def test_an_ask_fails_when_no_leader_is_known_when_the_leader_refuses_or_changes() -> None:
    f_raft, follower, _ = leased(state=FOLLOWER)
    f_raft.leader = None
    t, out = follower_asks(f_raft, follower)
    t.join(5)
    assert "no leader known" in out["error"]
    f_raft.leader = "L"
    t, out = follower_asks(f_raft, follower)
    ask = f_raft.transport.sent[-1][1]
    follower.on_message("L", {"type": TELL, "id": ask["id"], "index": 0, "error": "not the leader"})
    t.join(5)
    assert "not the leader" in out["error"]
    t, out = follower_asks(f_raft, follower)
    f_raft.leader = "B"
    follower.on_tick()
    t.join(5)
    assert "leader changed" in out["error"]
    # a leader that is not one any more says so
    not_leader = LeadershipConfirmer(FakeRaft(FOLLOWER))
    not_leader.on_message("A", {"type": ASK, "id": 3})
    assert not_leader.raft.transport.sent[-1][1]["error"] == "not the leader"


def test_a_yes_without_a_promise_confirms_the_read_index_but_gives_no_lease() -> None:
    """A node whose lease is off, or one on code from before the lease (a rolling upgrade), says yes
    without promising anything: it would vote for anyone, so it counts for the read but not the lease."""
    raft, c, _ = leased()
    t, out = ask_in_background(c)
    c.on_tick()
    ping = raft.transport.sent[-1][1]
    c.on_message("B", {"type": ANSWER, "id": ping["id"], "term": 7, "yes": True})  # old code: no promise
    t.join(5)
    assert out == {"index": 42} and c.leased_index() is None
    raft2, c2, clock2 = leased()
    raft2.others = {"B", "C", "D", "E"}  # five nodes: the leader and two more make a majority
    c2.on_tick()
    ping = raft2.transport.sent[-1][1]
    c2.on_message("B", {"type": ANSWER, "id": ping["id"], "term": 7, "yes": True, "promise": 0.5})
    c2.on_message("C", {"type": ANSWER, "id": ping["id"], "term": 7, "yes": True, "promise": 0.1})
    assert c2.leased_index() == 42
    clock2.now += LEASE_FRACTION * 0.1 + 0.001  # the shortest promise of the majority bounds the lease
    assert c2.leased_index() is None


def test_a_leader_that_never_answers_an_ask_is_not_asked_again_in_its_term() -> None:
    """A leader on code from before the ask (a rolling upgrade) ignores it: after one unanswered ask,
    this follower's reads go another way at once instead of each waiting out the silence."""
    raft, c, clock = leased(state=FOLLOWER)
    sent = raft.transport.sent
    t, out = follower_asks(raft, c)
    clock.now += ASK_SILENCE_S + 0.1
    c.on_tick()
    t.join(5)
    assert out["error"] == "the leader did not answer"
    asks = len(sent)
    t, out = follower_asks(raft, c)
    t.join(5)
    assert out["error"] == "the leader does not answer asks" and len(sent) == asks  # nothing sent
    raft.term = 8  # a new term (maybe an upgraded leader): ask again
    t, out = follower_asks(raft, c)
    assert len(sent) == asks + 1 and t.is_alive()
    c.on_message("L", {"type": TELL, "id": sent[-1][1]["id"], "index": 50, "error": ""})
    t.join(5)
    assert out == {"index": 50}
    t, out = follower_asks(raft, c)  # one that answered before and is slow now stays asked
    clock.now += ASK_SILENCE_S + 0.1
    c.on_tick()
    t.join(5)
    t, out = follower_asks(raft, c)
    assert t.is_alive() and sent[-1][1]["type"] == ASK
    c.on_message("L", {"type": TELL, "id": sent[-1][1]["id"], "index": 51, "error": ""})
    t.join(5)
    assert out == {"index": 51}


def test_a_read_index_asked_for_later_is_answered_on_the_tick_thread_by_the_next_round_or_ask() -> None:
    """read_index_later and read_index_from_leader_later (the core's answers to its workers' asks, with no
    thread waiting): the callback gets what read_index and read_index_from_leader would return, from a round
    or an ask sent after the call, or the reason there is none."""
    raft = FakeRaft()
    c = LeadershipConfirmer(raft)
    got: list[tuple[int, str]] = []
    c.read_index_later(lambda index, error: got.append((index, error)))
    assert got == [] and raft.transport.sent == []  # nothing before the tick's round
    c.on_tick()
    ping = raft.transport.sent[-1][1]
    raft.raftCommitIndex = 50  # a commit after the ping: not this round's index
    c.on_message("B", {"type": ANSWER, "id": ping["id"], "term": 7, "yes": True})
    assert got == [(42, "")]
    raft.state = FOLLOWER
    c.read_index_later(lambda index, error: got.append((index, error)))
    c.on_tick()
    assert got[-1] == (0, "not the leader")

    f_raft, follower, _ = leased(state=FOLLOWER)
    asked: list[tuple[int, str]] = []
    follower.read_index_from_leader_later(lambda index, error: asked.append((index, error)))
    follower.on_tick()
    (to, ask), = [(n, m) for n, m in f_raft.transport.sent if m["type"] == ASK]
    assert to == "L" and asked == []
    follower.on_message("L", {"type": TELL, "id": ask["id"], "index": 61, "error": ""})
    assert asked == [(61, "")]
    f_raft.leader = None
    follower.read_index_from_leader_later(lambda index, error: asked.append((index, error)))
    follower.on_tick()
    assert asked[-1] == (0, "no leader known")


def test_a_follower_keeps_one_ask_out_and_a_read_arriving_meanwhile_waits_for_the_next() -> None:
    """Reads that arrive while the follower's ask is out are not served by it (it may order before a
    write acknowledged before them): they wait, without waking the tick thread, for the ask the follower
    sends as soon as that one is answered; every read queued by then shares it."""
    f_raft, follower, _ = leased(state=FOLLOWER)
    asked: list[tuple[str, int, str]] = []
    follower.read_index_from_leader_later(lambda index, error: asked.append(("first", index, error)))
    assert f_raft.wakes == 1
    follower.on_tick()
    first = [m for _, m in f_raft.transport.sent if m["type"] == ASK]
    assert len(first) == 1
    wakes = f_raft.wakes
    for name in ("second", "third"):  # after the first ask went out
        follower.read_index_from_leader_later(lambda index, error, name=name: asked.append((name, index, error)))
    follower.on_tick()
    assert f_raft.wakes == wakes and len([m for _, m in f_raft.transport.sent if m["type"] == ASK]) == 1
    follower.on_message("L", {"type": TELL, "id": first[0]["id"], "index": 70, "error": ""})
    assert asked == [("first", 70, "")]  # the later two are not answered by an ask sent before them
    asks = [m for _, m in f_raft.transport.sent if m["type"] == ASK]
    assert len(asks) == 2  # sent on the TELL's arrival, for both
    follower.on_message("L", {"type": TELL, "id": asks[1]["id"], "index": 75, "error": ""})
    assert asked[1:] == [("second", 75, ""), ("third", 75, "")]
    follower.on_tick()
    assert len([m for _, m in f_raft.transport.sent if m["type"] == ASK]) == 2  # nothing left to ask


def test_a_failed_ask_sends_the_next_for_the_reads_that_waited_behind_it() -> None:
    f_raft, follower, clock = leased(state=FOLLOWER)
    asked: list[tuple[int, str]] = []
    follower.read_index_from_leader_later(lambda index, error: asked.append((index, error)))
    follower.on_tick()
    first = f_raft.transport.sent[-1][1]
    follower.on_message("L", {"type": TELL, "id": first["id"], "index": 80, "error": ""})  # it answers asks
    follower.read_index_from_leader_later(lambda index, error: asked.append((index, error)))
    follower.on_tick()
    second = f_raft.transport.sent[-1][1]
    follower.read_index_from_leader_later(lambda index, error: asked.append((index, error)))
    follower.on_message("L", {"type": TELL, "id": second["id"], "index": 0, "error": "not the leader"})
    assert asked[1] == (0, f"the leader refused ask {second['id']}: not the leader")
    third = f_raft.transport.sent[-1][1]
    assert third["type"] == ASK and third["id"] != second["id"]
    clock.now += ASK_SILENCE_S + 0.1  # unanswered: it fails, and the next read's ask goes out at that tick
    follower.read_index_from_leader_later(lambda index, error: asked.append((index, error)))
    follower.on_tick()
    assert asked[2] == (0, "the leader did not answer")
    fourth = f_raft.transport.sent[-1][1]
    assert fourth["type"] == ASK and fourth["id"] != third["id"]
    follower.on_message("L", {"type": TELL, "id": fourth["id"], "index": 90, "error": ""})
    assert asked[3] == (90, "")
