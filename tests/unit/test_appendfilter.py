"""The append filter: pysyncobj must not truncate entries that match its leader's."""

from __future__ import annotations

from raftlog.appendfilter import skip_known_entries

# the follower's log: indexes 1..12; 1..8 of term 2, 9..12 of term 3
TERMS = {i: (2 if i <= 8 else 3) for i in range(1, 13)}


def term_at(i: int) -> int | None:
    return TERMS.get(i)


def msg(prev: int, prev_term: int, term: int, entries: list[tuple[bytes, int, int]]) -> dict:
    return {"type": "append_entries", "term": term, "commit_index": 5, "prevLogIdx": prev,
            "prevLogTerm": prev_term, "entries": entries}


def run(m: dict, last_term: int = 3) -> dict:
    return skip_known_entries(m, 12, last_term, term_at)


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
    unverified = msg(9, 3, 4, [])  # a term-4 leader's heartbeat: our 10..12 (term 3) may not be its
    assert run(unverified) is unverified
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
