"""The append filter: pysyncobj must not truncate entries that match its leader's.

The in-process cases run three real pysyncobj nodes (tests/unit/test_raftlog_inprocess.py's trio)."""

from __future__ import annotations

from dataclasses import dataclass

from raftlog.appendfilter import skip_known_entries
from tests.unit.test_raftlog_inprocess import leader_of, put, trio, wait_for
from tests.unit.test_replysafety import answers_received, on_tick

__all__ = ["trio"]  # the fixture, shared with test_raftlog_inprocess.py

NOOP = b"\x01"  # pysyncobj's no-op command

# the follower's log: indexes 1..12; 1..8 of term 2, 9..12 of term 3
TERMS = {i: (2 if i <= 8 else 3) for i in range(1, 13)}


def term_at(i: int) -> int | None:
    return TERMS.get(i)


def msg(prev: int, prev_term: int, term: int, entries: list[tuple[bytes, int, int]]) -> dict:
    return {"type": "append_entries", "term": term, "commit_index": 5, "prevLogIdx": prev,
            "prevLogTerm": prev_term, "entries": entries}


def run(m: dict, last_term: int = 3) -> dict:
    out = skip_known_entries(m, 12, last_term, term_at)
    assert out.acked_through is None, "the log pysyncobj keeps is the leader's: no cap"
    return out.message


def test_a_stale_heartbeat_of_the_current_leader_is_moved_to_the_last_entry() -> None:
    out = run(msg(9, 3, 3, []))
    assert (out["prevLogIdx"], out["prevLogTerm"], out["entries"]) == (12, 3, [])
    assert out["commit_index"] == 5 and out["term"] == 3


def test_a_resend_of_entries_already_held_is_moved_too() -> None:
    out = run(msg(9, 3, 3, [(b"a", 10, 3), (b"b", 11, 3)]))
    assert (out["prevLogIdx"], out["entries"]) == (12, [])


def test_known_entries_are_dropped_and_new_ones_appended_after_ours() -> None:
    # a new leader (term 4) resending 8..13: 8..12 match ours, 13 is new
    entries = [(b"", 8, 2), (b"", 9, 3), (b"", 10, 3), (b"", 11, 3), (b"", 12, 3), (b"new", 13, 4)]
    out = run(msg(7, 2, 4, entries))
    assert (out["prevLogIdx"], out["prevLogTerm"], out["entries"]) == (12, 3, [(b"new", 13, 4)])


def test_conflicts_and_unverifiable_tails_pass_unchanged() -> None:
    conflict = msg(8, 2, 4, [(b"", 9, 3), (b"x", 10, 4)])  # index 10: term 4 here, 3 ours
    assert run(conflict) is conflict
    bad_prev = msg(9, 2, 3, [])  # prev term mismatch: pysyncobj must answer "reset"
    assert run(bad_prev) is bad_prev
    at_end = msg(12, 3, 3, [])
    assert run(at_end) is at_end
    snapshot = {"type": "append_entries", "term": 3, "serialized": b"...", "commit_index": 5}
    assert run(snapshot) is snapshot
    chunk = msg(9, 3, 3, []) | {"transmission": "start", "data": b""}
    assert run(chunk) is chunk
    vote = {"type": "request_vote", "term": 4}
    assert run(vote) is vote


def test_a_tail_of_another_term_past_the_message_is_kept_and_acknowledged_only_to_the_message_s_end() -> None:
    """A term-4 leader's stale heartbeat or resend covers our log up to 9 or 10; our 10..12 are of term 3, not
    known to be its, but they conflict with nothing it says. pysyncobj deleted them (it saw the message
    unchanged); Raft keeps them, and the answer and the commit index go only to the message's end."""
    heartbeat = skip_known_entries(msg(9, 3, 4, []), 12, 3, term_at)
    assert (heartbeat.message["prevLogIdx"], heartbeat.message["prevLogTerm"], heartbeat.message["entries"]) \
        == (12, 3, [])
    assert heartbeat.acked_through == 9
    assert heartbeat.message["term"] == 4 and heartbeat.message["commit_index"] == 5
    resend = skip_known_entries(msg(8, 2, 4, [(b"", 9, 3), (b"", 10, 3)]), 12, 3, term_at)
    assert (resend.message["prevLogIdx"], resend.message["entries"], resend.acked_through) == (12, [], 10)


@dataclass(frozen=True)
class AfterStaleAppend:
    end: int           # the stale message's last index: the follower's log up to it is the leader's
    last_before: int   # the follower's last index before the message: end + 2 (its tail of an older term)
    last_after: int
    commit_after: int
    answer: dict       # the follower's answer, as the sender received it


def stale_append_over_an_older_tail(trio) -> AfterStaleAppend:
    """A follower holds two entries past `end` of the term T it follows (sent by the leader of T, to it
    alone, not committed), and a leader of T + 1 (here the other follower, as this one sees it) sends a
    stale append covering its log up to `end` (its next index for the follower moved back), with its commit
    index past the tail. That leader may hold the tail (the follower acknowledged it to it: cutting it
    could lose a committed entry) or not (it holds others there: committing the tail would apply entries
    no majority holds); the follower cannot tell which."""
    leader = leader_of(trio)
    leader.log.propose(put("k", "v"), timeout=10)
    follower, other = (n for n in trio if n is not leader)
    raft, oraft = follower.log.raft, other.log.raft
    top = leader.log.raft.last_log_index()
    wait_for(lambda: raft.last_log_index() == top and raft.commit_index() == top)
    answers = answers_received(oraft, follower.addr)
    from_other = next(p for p in raft.other_peers() if p.id == other.addr)
    receive = raft._SyncObj__transport._onMessageReceivedCallback

    def tail_then_stale_append() -> tuple[int, int, int]:
        entries = raft._SyncObj__raftLog
        end, term = raft.last_log()
        first = entries[0][1]
        held, prev = tuple(entries[end - first]), entries[end - 1 - first]
        for i in (1, 2):
            entries.add(NOOP, end + i, term)
        receive(from_other, {"type": "append_entries", "term": term + 1, "commit_index": end + 2,
                             "prevLogIdx": prev[1], "prevLogTerm": prev[2], "entries": [held]})
        return end, raft.last_log_index(), raft.commit_index()

    end, last_after, commit_after = on_tick(raft, tail_then_stale_append)
    return AfterStaleAppend(end, end + 2, last_after, commit_after, wait_for(lambda: answers and answers[-1]))


def test_a_stale_append_keeps_a_tail_of_an_older_term_and_acknowledges_only_its_own_end(trio) -> None:
    """pysyncobj deleted every entry after the message's prevLogIdx (Raft deletes only from a conflict) and
    answered up to the message's end; the follower keeps its tail, and says no more than pysyncobj did:
    it holds the leader's log up to the message's end, not up to its own last entry."""
    after = stale_append_over_an_older_tail(trio)
    assert after.last_after == after.last_before, f"the tail was cut: {after.last_before} -> {after.last_after}"
    assert after.answer["success"] and after.answer["next_node_idx"] == after.end + 1, after.answer


def test_a_stale_append_commits_nothing_of_the_tail_it_did_not_verify(trio) -> None:
    """pysyncobj's follower commits min(leaderCommit, its own last index): over a kept tail the leader may
    not hold, it would apply entries no majority has. Raft commits min(leaderCommit, the message's end)."""
    after = stale_append_over_an_older_tail(trio)
    assert after.last_after == after.last_before, f"the tail was cut: {after.last_before} -> {after.last_after}"
    assert after.commit_after <= after.end, f"committed the unverified tail: {after.end} -> {after.commit_after}"
