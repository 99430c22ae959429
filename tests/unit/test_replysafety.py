"""Finding 15 (docs/faults.md): the two Raft rules raftlog/replysafety.py restores around pysyncobj.

In process, three real pysyncobj nodes (tests/unit/test_raftlog_inprocess.py's trio): a late append answer
of an older term must not commit a write no follower holds, and a follower sent a snapshot whose last entry
it holds keeps the entries after it."""

from __future__ import annotations

import functools
import os
import threading
import time

import pytest

import raftlog.log
from raftlog.journal import DurableJournal
from raftlog.keptdump import KEPT_SUFFIX
from raftlog.replysafety import capped_ack, keeps_log, stale_reply, stamp_term
from raftlog.segment import list_segments, read_segment
from tests.unit.test_raftlog_inprocess import leader_of, put, trio, wait_for

__all__ = ["trio"]  # the fixture, shared with test_raftlog_inprocess.py


def on_tick(raft, fn):
    """Run fn on raft's tick thread and wait for it; returns its result."""
    done = threading.Event()
    out = []

    def call():
        try:
            out.append(fn())
        finally:
            done.set()

    raft.call_on_tick(call)
    assert done.wait(10)
    return out[0]


def answers_received(raft, sender: str | None = None) -> list[dict]:
    """The append answers raft receives from now on (from the member `sender` only, when given), filled as
    they arrive."""
    answers: list[dict] = []
    transport = raft._SyncObj__transport
    receive = transport._onMessageReceivedCallback

    def record(node, message):
        if isinstance(message, dict) and message.get("type") == "next_node_idx" and sender in (None, node.id):
            answers.append(message)
        receive(node, message)

    on_tick(raft, lambda: transport.setOnMessageReceivedCallback(record))
    return answers


def test_an_answer_is_stamped_with_its_term_and_another_term_s_answer_is_stale() -> None:
    reply = {"type": "next_node_idx", "next_node_idx": 9, "reset": False, "success": True}
    assert stamp_term(reply, 4)["term"] == 4 and "term" not in reply
    assert stale_reply(stamp_term(reply, 3), 4) and stale_reply(stamp_term(reply, 5), 4)
    assert not stale_reply(stamp_term(reply, 4), 4)
    assert not stale_reply(reply, 4)  # unstamped (a node not yet upgraded): taken as before
    assert not stale_reply({"type": "response_vote", "term": 3}, 4)


def test_a_follower_keeps_its_log_for_a_snapshot_whose_last_entry_it_holds() -> None:
    terms = {5: 2, 6: 2, 7: 3}
    assert keeps_log((b"", 6, 2), last_applied=3, term_at=terms.get)       # holds it, same term
    assert not keeps_log((b"", 6, 3), last_applied=3, term_at=terms.get)   # another term there
    assert not keeps_log((b"", 9, 3), last_applied=3, term_at=terms.get)   # not in its log
    assert keeps_log((b"", 4, 1), last_applied=4, term_at=terms.get)       # applied already


def test_the_answer_to_a_kept_snapshot_acknowledges_only_up_to_the_snapshot() -> None:
    reply = {"type": "next_node_idx", "next_node_idx": 120, "reset": False, "success": True, "term": 3}
    assert capped_ack(reply, 100)["next_node_idx"] == 101
    assert capped_ack(reply, None) is reply
    refusal = {**reply, "success": False}
    assert capped_ack(refusal, 100) is refusal
    failed = capped_ack(reply, None, failed=True)  # a load that failed acknowledges nothing, hints nothing
    assert failed["success"] is False and failed["reset"] is False


def test_a_late_answer_of_an_older_term_commits_nothing(trio) -> None:
    """A leader whose followers are gone appends a write; an append answer stamped with an older term then
    arrives claiming a follower holds it. pysyncobj alone counts it and commits the write with no follower
    holding it (an acknowledged write a new leader will not have)."""
    leader = leader_of(trio)
    raft = leader.log.raft
    for n in trio:
        if n is not leader:
            n.close()
    outcome: list[object] = []
    writer = threading.Thread(target=lambda: outcome.append(_try(leader, timeout=4)))
    writer.start()
    wait_for(lambda: (raft.last_log_index() or 0) > raft.commit_index())
    top, term = raft.last_log_index(), raft.current_term()
    peer = next(iter(raft.other_peers()))
    receive = raft._SyncObj__transport._onMessageReceivedCallback
    on_tick(raft, lambda: receive(peer, {"type": "next_node_idx", "next_node_idx": top + 1, "reset": False,
                                         "success": True, "term": term - 1}))
    on_tick(raft, lambda: None)  # a whole tick (its commit pass) ran after the answer
    on_tick(raft, lambda: None)
    assert raft.commit_index() < top, "committed on an older term's answer, with no follower holding it"
    assert raft.stale_replies == 1
    writer.join()
    assert outcome == ["not committed"]


def _try(node, timeout: float) -> str:
    try:
        node.log.propose(put("lonely", "write"), timeout=timeout)
    except Exception:
        return "not committed"
    return "committed"


def test_a_snapshot_the_follower_holds_keeps_the_entries_it_acknowledged_after_it(trio) -> None:
    """pysyncobj's install clears the follower's whole log; Raft (Figure 13, step 6) keeps what follows."""
    leader = leader_of(trio)
    follower = next(n for n in trio if n is not leader)
    for i in range(45):  # past snapshot_every_entries (40): the follower compacts into its own snapshot
        leader.log.propose(put(f"k/{i}", "v"), timeout=10)
    wait_for(lambda: follower.log.snapshot_offset > 0)
    raft = follower.log.raft
    snap_last = follower.log._read_dump_meta(follower.log.dump_path)[0][1]
    for i in range(5):
        leader.log.propose(put(f"after/{i}", "v"), timeout=10)
    wait_for(lambda: (raft.last_log_index() or 0) > snap_last)

    def install() -> tuple[int, int]:  # that snapshot, as if the leader had sent it: pysyncobj's install path
        before = raft.last_log_index()
        raft._SyncObj__loadDumpFile(clearJournal=True)
        return before, raft.last_log_index()

    before, after = on_tick(raft, install)
    assert before > snap_last
    assert after == before, f"the install cut the follower's log from {before} back to {after}"


def test_followers_stamp_their_answers_with_the_leader_s_term(trio) -> None:
    """The leader's check needs the stamp: every append answer a real follower sends carries its term."""
    leader = leader_of(trio)
    raft = leader.log.raft
    answers = answers_received(raft)
    leader.log.propose(put("k", "v"), timeout=10)
    wait_for(lambda: len(answers) >= 4)
    assert {a.get("term") for a in answers} == {raft.current_term()}


def test_a_snapshot_the_follower_fails_to_load_is_not_acknowledged(trio) -> None:
    """pysyncobj swallows a failed load and answers success with the log the follower still has: its leader
    would count that log, whatever it holds, towards commits. The answer says no success instead."""
    leader = leader_of(trio)
    follower = next(n for n in trio if n is not leader)
    leader.log.propose(put("k", "v"), timeout=10)
    raft, lraft = follower.log.raft, leader.log.raft
    answers = answers_received(lraft, follower.addr)
    from_leader = next(p for p in raft.other_peers() if p.id == leader.addr)
    receive = raft._SyncObj__transport._onMessageReceivedCallback
    damaged = {"type": "append_entries", "term": raft.current_term(), "commit_index": raft.commit_index(),
               "serialized": (b"not a snapshot", True, True)}  # a whole transfer in one message
    # hold the leader's appends to this follower back (its probe gate), so the only answer to come is the install's
    to_follower = next(p for p in lraft.other_peers() if p.id == follower.addr)
    on_tick(lraft, lambda: lraft.probe_gate._probing.__setitem__(to_follower, float("inf")))
    time.sleep(0.3)  # answers already on their way arrive
    answers.clear()
    on_tick(raft, lambda: receive(from_leader, damaged))
    wait_for(lambda: answers)
    assert answers[0]["success"] is False and answers[0]["reset"] is False
    assert not os.path.exists(follower.log.dump_path), "the damaged file is the follower's raft.dump"


def test_a_piece_of_a_snapshot_commits_nothing_of_the_follower_s_own_tail(trio) -> None:
    """The loss of finding 15: an old leader back from a partition holds a tail of its own that no majority
    has; the new leader sends it a snapshot. pysyncobj moved its commit index to min(leader's commit, its
    own last index) on the first piece, so it applied (and acknowledged) that tail, then the last piece
    replaced the state with one without it."""
    leader = leader_of(trio)
    follower = next(n for n in trio if n is not leader)
    leader.log.propose(put("k", "v"), timeout=10)
    raft = follower.log.raft
    wait_for(lambda: raft.commit_index() == raft.last_log_index())
    from_leader = next(p for p in raft.other_peers() if p.id == leader.addr)
    receive = raft._SyncObj__transport._onMessageReceivedCallback

    def stale_tail_then_a_snapshot_piece() -> tuple[int, int]:
        committed, (last, term) = raft.commit_index(), raft.last_log()
        raft._SyncObj__raftLog.add(b"\x01", last + 1, term)  # a no-op no leader has: an old leader's tail
        receive(from_leader, {"type": "append_entries", "term": raft.current_term(), "commit_index": last + 100,
                              "serialized": (b"the first piece", True, False)})
        return committed, raft.commit_index()

    before, after = on_tick(raft, stale_tail_then_a_snapshot_piece)
    assert after == before, f"a snapshot's first piece committed the follower's own tail: {before} -> {after}"


@pytest.fixture
def small_segments(monkeypatch):
    """Journal segments of 2 KiB: a compaction deletes the files that held the entries before a snapshot, as
    it does with the 4 MiB default over a real snapshot interval (then nothing on disk holds those entries)."""
    monkeypatch.setattr(raftlog.log, "DurableJournal", functools.partial(DurableJournal, segment_bytes=2048))


def oldest_on_disk(journal) -> int:
    """The first entry any segment file of `journal` holds."""
    return min(s.first for s in (read_segment(seq, p) for seq, p in list_segments(journal.path)) if s.entries)


@pytest.mark.parametrize("crash", ["after the install", "between the dump's replacement and its put-back"])
def test_a_follower_that_kept_its_log_over_an_older_snapshot_restarts_with_every_entry(small_segments, trio,
                                                                                          crash) -> None:
    """Rule 2 on disk: pysyncobj renames the leader's snapshot over raft.dump before the binding decides to
    keep the log. A follower whose own snapshot is newer then restarted from the leader's older dump, and its
    journal (paired with its own) was cleared: writes it had acknowledged were gone from its disk, and an
    election without the old leader lost them. It restarts from its own snapshot, with every entry."""
    leader = leader_of(trio)
    follower, other = (n for n in trio if n is not leader)
    for i in range(45):  # past snapshot_every_entries (40): a first snapshot on every node
        leader.log.propose(put(f"k/{i}", "v"), timeout=10)
    wait_for(lambda: leader.log.snapshot_offset > 0)
    older = leader.log.store.list()[0]  # the leader's snapshot that it will send, late
    with open(older.path, "rb") as f:
        older_bytes = f.read()
    raft = follower.log.raft
    for i in range(45):  # the follower's own snapshot passes it, and its log is compacted behind that one
        leader.log.propose(put(f"k2/{i}", "v"), timeout=10)
    wait_for(lambda: oldest_on_disk(follower.log.journal) > older.offset)
    other.close()
    acked = [leader.log.propose(put(f"acked/{i}", "v"), timeout=10).offset for i in range(5)]  # with the follower
    wait_for(lambda: (raft.last_log_index() or 0) >= max(acked))
    leader.close()
    from_leader = next(p for p in raft.other_peers() if p.id == leader.addr)
    receive = raft._SyncObj__transport._onMessageReceivedCallback

    def install_older() -> tuple[int, int]:
        before = raft.last_log_index()
        receive(from_leader, {"type": "append_entries", "term": raft.current_term(), "commit_index": older.offset,
                              "serialized": (older_bytes, True, True)})  # the whole file in one piece
        return before, raft.last_log_index()

    dump = follower.log.dump_path
    own = follower.log._read_dump_meta(dump)[0][1]
    before, after = on_tick(raft, install_older)
    assert after == before, "the follower did not keep its log over the older snapshot"
    assert follower.log._read_dump_meta(dump)[0][1] == own, "raft.dump is the leader's older snapshot now"
    follower.close()
    if crash != "after the install":  # a crash in the window: the leader's file is raft.dump, its own aside
        os.replace(dump, dump + KEPT_SUFFIX)
        with open(dump, "wb") as f:
            f.write(older_bytes)
    follower.start()
    other.start()
    new_leader = leader_of([follower, other])
    new_leader.log.wait_applied(max(acked), 10)
    lost = [f"acked/{i}" for i in range(5) if new_leader.kv.get(f"acked/{i}") is None]
    assert not lost, f"acknowledged writes lost after the follower's restart: {lost}"
    wait_for(lambda: follower.kv.offset == new_leader.kv.offset and follower.kv.digest == new_leader.kv.digest)


def test_a_snapshot_written_after_a_newer_one_became_raft_dump_does_not_replace_it(trio) -> None:
    """The node's snapshot writer runs on its own thread; a snapshot from the leader (newer than anything this
    node applied) may be installed while it writes. Linking the writer's older file as raft.dump afterwards
    paired the journal, which goes with the installed one, with an older dump: the next restart cleared it."""
    leader = leader_of(trio)
    follower = next(n for n in trio if n is not leader)
    for i in range(90):  # two snapshots on the follower
        leader.log.propose(put(f"k/{i}", "v"), timeout=10)
    wait_for(lambda: len(follower.log.store.list()) >= 2)
    dump = follower.log.dump_path
    newest = follower.log._read_dump_meta(dump)[0][1]
    older = follower.log.store.list()[-1]
    assert older.offset < newest
    follower.log._write_snapshot(older.offset, older.term, follower.log.fsm.freeze(), older.meta, older.digest)
    follower.log._snapshot_writer.join(10)
    assert follower.log._read_dump_meta(dump)[0][1] == newest, "an older snapshot replaced raft.dump"


def test_a_snapshot_from_the_leader_is_durable_before_the_install_is_answered(trio, monkeypatch) -> None:
    """pysyncobj writes a received snapshot's file without an fsync and renames it over raft.dump; the node
    then answers and acknowledges entries after it. A power loss could leave raft.dump torn while the
    journal was already cleared for it: the file and its name are synced before the answer."""
    leader = leader_of(trio)
    follower = next(n for n in trio if n is not leader)
    leader.log.propose(put("k", "v"), timeout=10)
    raft = follower.log.raft
    monkeypatch.setattr(follower.log.journal, "fsync", True)
    synced: list[str] = []
    real_fsync = os.fsync

    def spy(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)
    from_leader = next(p for p in raft.other_peers() if p.id == leader.addr)
    receive = raft._SyncObj__transport._onMessageReceivedCallback
    whole = {"type": "append_entries", "term": raft.current_term(), "commit_index": raft.commit_index(),
             "serialized": (b"not a snapshot", True, True)}  # a whole transfer in one message
    on_tick(raft, lambda: receive(from_leader, whole))
    dump = os.path.realpath(follower.log.dump_path)
    assert dump in synced, f"raft.dump was not synced after the install's rename: {synced}"
    assert os.path.dirname(dump) in synced
