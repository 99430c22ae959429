"""The probe gate: after a refusal the leader sends a follower one append per interval until one is accepted.
The follower's repeated answers: an answer identical to the last one sent within a heartbeat period stays home."""

from __future__ import annotations

from raftlog.appendflow import ProbeGate, RepeatedAnswers


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def append(prev: int, transmission: str | None = None) -> dict:
    m = {"type": "append_entries", "term": 4, "commit_index": 1, "prevLogIdx": prev, "prevLogTerm": 4,
         "entries": [(b"x", prev + 1, 4)]}
    if transmission:
        m["transmission"] = transmission
    return m


def refusal(hint: int) -> dict:
    return {"type": "next_node_idx", "next_node_idx": hint, "reset": True, "success": False}


def accepted(nxt: int) -> dict:
    return {"type": "next_node_idx", "next_node_idx": nxt, "reset": False, "success": True}


def test_a_follower_that_never_refused_gets_every_append() -> None:
    gate = ProbeGate(0.1, Clock())
    assert all(gate.may_send("f", append(i)) for i in range(50))
    assert gate.dropped == 0


def test_after_a_refusal_one_append_per_interval_until_one_is_accepted() -> None:
    clock = Clock()
    gate = ProbeGate(0.1, clock)
    gate.on_reply("f", refusal(1267))
    assert gate.probing("f")
    sent = [gate.may_send("f", append(i)) for i in range(1266, 1300)]  # one tick's pipelined batches
    assert sent[0] and not any(sent[1:])
    clock.now += 0.05
    assert not gate.may_send("f", append(1266))
    clock.now += 0.06
    assert gate.may_send("f", append(1265))  # the next probe, one interval later
    gate.on_reply("f", accepted(1300))
    assert not gate.probing("f")
    assert all(gate.may_send("f", append(i)) for i in range(1300, 1320))  # pipelining again
    assert gate.dropped == 34


def test_the_walk_back_converges_where_pysyncobj_alone_livelocked() -> None:
    """A model of pysyncobj's leader against a follower holding two stale entries (1265, 1266 of term 3)
    and a backlog of refusals: each tick the leader sends every batch from its next index to its end and
    moves the next index to the end; each refusal sets it to the follower's hint."""

    follower_terms = {i: 2 for i in range(1, 1265)} | {1265: 3, 1266: 3}
    leader_end = 3000

    def answer(prev: int) -> dict:  # pysyncobj's follower, for a message whose prevLogIdx is `prev`
        if prev not in follower_terms and prev != 0:
            return refusal(max(follower_terms) + 1)
        if follower_terms.get(prev, 2) != 2:
            return refusal(prev)
        return accepted(min(prev + 350, leader_end) + 1)

    def ticks(gate: ProbeGate | None, clock: Clock, count: int) -> bool:
        next_index = leader_end + 1
        for _ in range(count):
            batches = list(range(next_index - 1, leader_end, 350)) or [leader_end]
            answers = []
            for prev in batches:
                if gate is None or gate.may_send("f", append(prev)):
                    answers.append(answer(prev))
            for a in answers:  # in order, after the whole tick was sent (the follower lags)
                if gate is not None:
                    gate.on_reply("f", a)
                if a["success"]:
                    return True
                next_index = a["next_node_idx"]
            clock.now += 0.1
        return False

    assert not ticks(None, Clock(), 200), "the model should reproduce pysyncobj's livelock"
    clock = Clock()
    assert ticks(ProbeGate(0.1, clock), clock, 200)


def test_a_chunked_transfer_passes_or_drops_whole() -> None:
    clock = Clock()
    gate = ProbeGate(0.1, clock)
    assert gate.may_send("f", append(5, "start"))
    gate.on_reply("f", refusal(3))  # a refusal arrives mid-transfer: the transfer still completes
    assert gate.may_send("f", append(5, "process")) and gate.may_send("f", append(5, "finish"))
    assert gate.may_send("f", append(2, "start"))  # the probe is a transfer
    assert gate.may_send("f", append(2, "process")) and gate.may_send("f", append(2, "finish"))
    assert not gate.may_send("f", append(9, "start"))  # within the interval: the whole transfer waits
    assert not gate.may_send("f", append(9, "process")) and not gate.may_send("f", append(9, "finish"))


def test_every_piece_labelled_finish_passes_with_its_start() -> None:
    """pysyncobj labels two pieces of some entries finish (raftlog/chunkedappend.py): the gate let only the
    first through, the follower never got the rest, and the entry never committed."""
    clock = Clock()
    gate = ProbeGate(0.1, clock)
    assert gate.may_send("f", append(5, "start"))
    assert gate.may_send("f", append(5, "finish")) and gate.may_send("f", append(5, "finish"))
    gate.on_reply("f", refusal(3))
    assert gate.may_send("f", append(2, "start"))
    clock.now += 0.05
    assert not gate.may_send("f", append(2, "start"))  # the next transfer waits for its interval, whole
    assert not gate.may_send("f", append(2, "finish")) and not gate.may_send("f", append(2, "finish"))


def test_other_messages_are_never_gated() -> None:
    gate = ProbeGate(0.1, Clock())
    gate.on_reply("f", refusal(3))
    gate.may_send("f", append(2))
    assert gate.may_send("f", {"type": "append_entries", "term": 4, "commit_index": 1, "serialized": b"x"})
    assert gate.may_send("f", {"type": "request_vote", "term": 5})
    assert gate.may_send("f", {"type": "ns_read_index_ping", "id": 1})
    assert gate.may_send("g", append(2))  # another follower


def answer(nxt: int, term: int = 4, success: bool = True, reset: bool = False) -> dict:
    return {"type": "next_node_idx", "next_node_idx": nxt, "reset": reset, "success": success, "term": term}


def test_an_answer_repeating_the_last_one_within_the_interval_stays_home() -> None:
    """The answer to the commit index's append repeats the entry's answer: it is not sent again."""
    clock = Clock()
    answers = RepeatedAnswers(0.1, clock)
    assert answers.may_send("leader", answer(8))
    clock.now += 0.002
    assert not answers.may_send("leader", answer(8))
    assert answers.may_send("leader", answer(9))  # the next entry's answer says more
    clock.now += 0.001
    assert not answers.may_send("leader", answer(9))
    assert answers.held == 2


def test_the_leader_still_hears_from_a_follower_every_interval() -> None:
    """Held-back answers do not move the clock: one goes out at least every interval (heartbeats every 0.1 s
    answered for seconds send ~10 a second, not none)."""
    clock = Clock()
    answers = RepeatedAnswers(0.1, clock)
    sent = 0
    for _ in range(200):  # 2 s of answers every 10 ms, all the same
        sent += answers.may_send("leader", answer(8))
        clock.now += 0.01
    assert 18 <= sent <= 21


def test_refusals_other_terms_and_other_leaders_always_go_out() -> None:
    clock = Clock()
    answers = RepeatedAnswers(0.1, clock)
    refusal8 = answer(8, success=False, reset=True)
    assert answers.may_send("a", refusal8)
    assert answers.may_send("a", refusal8)  # a refusal is never held back
    assert answers.may_send("a", answer(8))  # the last answer on the wire was a refusal
    assert answers.may_send("a", answer(8, term=5))
    assert answers.may_send("b", answer(8, term=5))
    assert answers.held == 0


def test_a_lost_link_forgets_what_went_out_on_it() -> None:
    """An answer sent on a link that then went down may never have arrived: after the reconnection the same
    answer goes out again at once."""
    clock = Clock()
    answers = RepeatedAnswers(0.1, clock)
    assert answers.may_send("leader", answer(8))
    answers.forget("leader")
    assert answers.may_send("leader", answer(8))
