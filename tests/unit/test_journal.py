"""The fsyncing Raft journal: durability hooks, recovery of torn tails, refusal of corruption."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from pysyncobj import SyncObj
from pysyncobj.journal import FileJournal
from pysyncobj.transport import TCPTransport

from raftlog.journal import EXIT_IO_ERROR, DurableJournal, JournalCorrupt
from raftlog.kvstate import KVState, KVStateMachine
from raftlog.log import LogConfig, ReplicatedLog
from raftlog.pb import entry_pb2
from raftlog.segment import MAGIC, RECORD, list_segments
from snapshot import SnapshotStore
from tests.cluster import free_ports


def fill(j: DurableJournal, n: int, first: int = 1, term: int = 1) -> None:
    for i in range(first, first + n):
        j.add(f"cmd-{i}".encode() * 3, i, term)


def reopen(path: str, **kw) -> DurableJournal:
    return DurableJournal(path, **kw)


def segment_files(path: str) -> list[str]:
    return [p for _, p in list_segments(path)]


def last_offset(j: DurableJournal) -> int:
    """Byte offset, in its segment file, of the last entry's record."""
    return j._where[-1][1]


def reopen_meta(path: str) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def test_entries_term_vote_and_commit_index_survive_reopen(tmp_path) -> None:
    path = str(tmp_path / "raft.journal")
    j = DurableJournal(path)
    fill(j, 5)
    j.setCurrentTerm(7, "127.0.0.1:1")
    j.setRaftCommitIndex(4)
    j._destroy()
    k = reopen(path)
    assert [e[1] for e in k[:]] == [1, 2, 3, 4, 5]
    assert k[2] == (b"cmd-3" * 3, 3, 1)
    assert (k.getCurrentTerm(), k.getVotedForNodeId(), k.getRaftCommitIndex()) == (7, "127.0.0.1:1", 4)


def test_one_fdatasync_covers_every_entry_appended_since_the_last(tmp_path, monkeypatch) -> None:
    calls = []
    real = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (calls.append(fd), real(fd)))
    j = DurableJournal(str(tmp_path / "raft.journal"))
    fill(j, 10)
    j.sync()
    j.sync()  # nothing new: no second sync
    assert len(calls) == 1 and j.syncs == 1
    j.add(b"x", 11, 1)
    j.sync()
    assert len(calls) == 2


def test_fsync_opt_out_still_writes_but_never_syncs(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(os, "fdatasync", lambda fd: pytest.fail("fdatasync with fsync off"))
    path = str(tmp_path / "raft.journal")
    j = DurableJournal(path, fsync=False)
    fill(j, 3)
    j.sync()
    j._destroy()
    assert len(reopen(path)) == 3


@pytest.mark.parametrize("cut", [1, RECORD.size - 1, RECORD.size + 2])
def test_torn_tail_is_dropped_with_a_warning(tmp_path, caplog, cut: int) -> None:
    path = str(tmp_path / "raft.journal")
    j = DurableJournal(path)
    fill(j, 4)
    j._destroy()
    last = last_offset(j)
    [segment] = segment_files(path)
    os.truncate(segment, last + cut)  # the last record cut short, as by a crash mid-write
    k = reopen(path)
    assert [e[1] for e in k[:]] == [1, 2, 3]
    assert "torn tail" in caplog.text and segment in caplog.text
    assert os.path.getsize(segment) == last
    k.add(b"again", 4, 2)  # appending after a repair continues cleanly
    k._destroy()
    assert [e[1] for e in reopen(path)[:]] == [1, 2, 3, 4]


def test_last_record_with_a_bad_checksum_is_a_torn_tail(tmp_path) -> None:
    path = str(tmp_path / "raft.journal")
    j = DurableJournal(path)
    fill(j, 3)
    j._destroy()
    [segment] = segment_files(path)
    with open(segment, "r+b") as f:
        f.seek(os.path.getsize(segment) - 2)
        f.write(b"\xff\xff")
    assert [e[1] for e in reopen(path)[:]] == [1, 2]


def test_damage_before_the_end_is_refused_naming_file_and_offset(tmp_path) -> None:
    path = str(tmp_path / "raft.journal")
    j = DurableJournal(path)
    fill(j, 6)
    j._destroy()
    bad = j._where[2][1]
    [segment] = segment_files(path)
    with open(segment, "r+b") as f:
        f.seek(bad + RECORD.size + 1)
        f.write(b"\x00\x01\x02")
    with pytest.raises(JournalCorrupt) as err:
        reopen(path)
    assert segment in str(err.value) and f"offset {bad}" in str(err.value)


def test_not_a_journal_is_refused(tmp_path) -> None:
    path = tmp_path / "raft.journal"
    path.write_bytes(b"garbage that is no journal")
    with pytest.raises(JournalCorrupt, match="bad header"):
        reopen(str(path))


def test_truncate_from_and_compact_to_survive_reopen(tmp_path) -> None:
    path = str(tmp_path / "raft.journal")
    j = DurableJournal(path)
    fill(j, 10)
    j.deleteEntriesFrom(7)  # a follower drops a conflicting suffix (entries 8..10)
    j.add(b"new-8", 8, 2)
    j.deleteEntriesTo(3)  # compaction after a snapshot keeps entries 4..8
    j.add(b"new-9", 9, 2)
    j._destroy()
    # one segment: the compacted entries stay in its file; the snapshot says where the log starts
    assert [e[1] for e in reopen(path)[:]][:4] == [1, 2, 3, 4]
    k = reopen(path, compacted_to=4)
    assert [(e[1], e[2]) for e in k[:]] == [(4, 1), (5, 1), (6, 1), (7, 1), (8, 2), (9, 2)]
    assert k[4][0] == b"new-8"
    k.clear()
    k._destroy()
    assert len(reopen(path)) == 0
    [segment] = segment_files(path)
    with open(segment, "rb") as f:
        assert f.read() == MAGIC


def test_a_pysyncobj_journal_is_converted(tmp_path) -> None:
    path = str(tmp_path / "raft.journal")
    old = FileJournal(path)
    for i in range(1, 4):
        old.add(f"old-{i}".encode(), i, 3)
    old.setCurrentTerm(3, "127.0.0.1:9")
    old._destroy()
    j = reopen(path)
    assert [e[0] for e in j[:]] == [b"old-1", b"old-2", b"old-3"]
    assert (j.getCurrentTerm(), j.getVotedForNodeId()) == (3, "127.0.0.1:9")
    j._destroy()
    assert not os.path.exists(path)
    with open(segment_files(path)[0], "rb") as f:
        assert f.read(len(MAGIC)) == MAGIC


def test_a_single_file_journal_becomes_the_first_segment(tmp_path) -> None:
    # the layout before segments: the same format in one file at the journal's path
    path = str(tmp_path / "raft.journal")
    j = DurableJournal(path)
    fill(j, 3)
    j._destroy()
    [segment] = segment_files(path)
    os.rename(segment, path)
    k = reopen(path)
    assert [e[1] for e in k[:]] == [1, 2, 3] and not os.path.exists(path)
    assert segment_files(path) == [segment]
    k._destroy()


def test_an_append_that_cannot_be_written_stops_the_process(tmp_path) -> None:
    # RLIMIT_FSIZE makes writes past a size fail (EFBIG) as a full disk would (ENOSPC)
    script = textwrap.dedent(f"""
        import logging, resource, signal
        logging.basicConfig(level=logging.INFO)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        from raftlog.journal import DurableJournal
        j = DurableJournal({str(tmp_path / "raft.journal")!r})
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
        for i in range(1, 1000):
            j.add(b"x" * 100, i, 1)
        print("never reached")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert proc.returncode == EXIT_IO_ERROR, proc.stderr
    assert "journal append failed" in proc.stderr and "never reached" not in proc.stdout


def test_no_acknowledgement_leaves_unsynced_and_a_commit_has_a_durable_majority(tmp_path,
                                                                                          monkeypatch) -> None:
    """Acknowledgements of entries and votes leave with every entry durable; the leader's own appends
    go out unsynced, and it commits only what a majority holds durably: its own copy counts only up to
    its durable index (the syncer thread makes the leader's entries durable, off the tick thread)."""
    journals: list[DurableJournal] = []
    unsynced: list[str] = []
    sent = [0]
    read = [0]
    leader_checks = [0]
    real_send = TCPTransport.send
    real_receive = SyncObj._SyncObj__onMessageReceived

    def check_leader(raft: SyncObj) -> None:
        if raft._isLeader():
            leader_checks[0] += 1
            # three members: a commit needs two durable copies, the leader's or both followers'
            by_followers = min(raft._SyncObj__raftMatchIndex.values())
            if raft.raftCommitIndex > max(raft.journal.durable_index, by_followers):
                unsynced.append(f"leader committed {raft.raftCommitIndex} with {raft.journal.durable_index} durable "
                                f"and {by_followers} on both followers")

    def checking_send(self: TCPTransport, node: object, message: object) -> object:
        # the binding wraps each node's transport.send; this is what its wrapper calls
        sent[0] += 1
        journal = self._syncObj.journal
        if message.get("type") in ("next_node_idx", "response_vote") and journal.durable_index < journal[-1][1]:
            unsynced.append(f"sent {repr(message)[:80]} with {journal.durable_index} of {journal[-1][1]} durable")
        check_leader(self._syncObj)
        return real_send(self, node, message)

    def checking_receive(self: SyncObj, node: object, message: object) -> None:
        # what the binding's receive wrapper delivers to, after its own checks
        read[0] += 1
        check_leader(self)
        return real_receive(self, node, message)

    monkeypatch.setattr(TCPTransport, "send", checking_send)
    monkeypatch.setattr(SyncObj, "_SyncObj__onMessageReceived", checking_receive)
    ports = free_ports(3)
    addrs = [f"127.0.0.1:{p}" for p in ports]
    logs = []
    try:
        for i, a in enumerate(addrs):
            cfg = LogConfig(self_addr=a, partners=[b for b in addrs if b != a], data_dir=str(tmp_path / f"n{i}"))
            rl = ReplicatedLog(cfg, KVStateMachine(KVState()), SnapshotStore(str(tmp_path / f"s{i}")),
                               threading.RLock())
            logs.append(rl)
            journals.append(rl.journal)
        deadline = time.monotonic() + 20
        while not any(rl.is_leader() for rl in logs):
            assert time.monotonic() < deadline, "no leader"
            time.sleep(0.05)
        leader = next(rl for rl in logs if rl.is_leader())
        for i in range(50):
            batch = entry_pb2.Batch(records=[entry_pb2.Record(type=1, key=f"k{i}", value=b"v")])
            leader.propose(batch, 10)
        assert sent[0] > 100 and read[0] > 100 and leader_checks[0] > 100
        assert unsynced == []
        assert all(j.syncs > 0 for j in journals)  # followers synced what they acknowledged
        # the leader may commit on its followers' copies before its own sync lands; it lands soon after
        deadline = time.monotonic() + 5
        while leader.journal.durable_index < leader.journal[-1][1] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert leader.raft.raftCommitIndex == leader.journal.durable_index == leader.journal[-1][1]
    finally:
        for rl in logs:
            rl.close()


def test_compaction_past_the_end_keeps_the_last_entry(tmp_path) -> None:
    # pysyncobj may finish compacting for a snapshot after a leader's snapshot shortened the log
    path = str(tmp_path / "raft.journal")
    j = DurableJournal(path)
    fill(j, 2, first=39993)
    j.deleteEntriesTo(60)
    assert [e[1] for e in j[:]] == [39994]
    j._destroy()
    assert [e[1] for e in reopen(path, compacted_to=39994)[:]] == [39994]


def test_the_syncer_makes_appends_durable_and_says_so(tmp_path) -> None:
    j = DurableJournal(str(tmp_path / "raft.journal"))
    woken = threading.Event()
    j.start_syncer(woken.set)
    try:
        fill(j, 5)
        assert j.durable_index == 0
        j.request_sync()
        assert woken.wait(5), "the syncer never reported"
        assert j.durable_index == 5 and j.syncs >= 1
        woken.clear()
        j.deleteEntriesFrom(3)  # a follower's truncation: durable never claims what is gone
        assert j.durable_index == 3
        fill(j, 2, first=4)
        j.setRaftCommitIndex(4)
        j.onOneSecondTimer()  # the commit index is stored by the syncer
        j.request_sync()
        assert woken.wait(5)
        deadline = time.monotonic() + 5
        while reopen_meta(j.meta_path).get("raftCommitIndex") != 4:
            assert time.monotonic() < deadline, "the commit index was not stored"
            time.sleep(0.01)
        assert j.durable_index == 5
    finally:
        j._destroy()
    again = DurableJournal(str(tmp_path / "raft.journal"))
    assert [e[1] for e in again] == [1, 2, 3, 4, 5] and again.durable_index == 5
    assert again.getRaftCommitIndex() == 4
    again._destroy()


def test_segments_roll_over_and_compaction_deletes_whole_old_ones(tmp_path) -> None:
    path = str(tmp_path / "raft.journal")
    j = DurableJournal(path, segment_bytes=300)
    fill(j, 40)
    files = segment_files(path)
    assert len(files) >= 5 and j.segment_paths() == files
    j.deleteEntriesTo(20)  # compaction after a snapshot at 21: entries 21.. stay
    assert [e[1] for e in j[:]][0] == 21
    left = segment_files(path)
    assert left == files[-len(left):] and len(left) < len(files)
    assert left[0] == j._where[0][0].path  # the segment holding entry 21 stays, earlier ones went
    j._destroy()
    k = reopen(path, compacted_to=21)
    assert [e[1] for e in k[:]] == list(range(21, 41))
    k._destroy()


def test_truncation_across_segments_deletes_the_later_ones(tmp_path) -> None:
    path = str(tmp_path / "raft.journal")
    j = DurableJournal(path, segment_bytes=300)
    fill(j, 40)
    before = segment_files(path)
    j.deleteEntriesFrom(9)  # entries 10.. conflicted with the leader's
    assert len(segment_files(path)) < len(before)
    fill(j, 3, first=10, term=2)
    j._destroy()
    k = reopen(path)
    assert [(e[1], e[2]) for e in k[:]] == [(i, 1) for i in range(1, 10)] + [(10, 2), (11, 2), (12, 2)]
    k._destroy()


def test_compaction_leftovers_are_skipped_and_deleted_on_open(tmp_path) -> None:
    # a crash after the snapshot at 31 and before its compaction's deletions reached the disk
    path = str(tmp_path / "raft.journal")
    j = DurableJournal(path, segment_bytes=300)
    fill(j, 40)
    j._destroy()
    files = segment_files(path)
    k = reopen(path, compacted_to=30)
    assert [e[1] for e in k[:]] == list(range(30, 41))  # pysyncobj finds its snapshot's two entries first
    gone = [f for f in files if f not in segment_files(path)]
    assert gone and gone == files[:len(gone)]
    k._destroy()
    # all of it older than the snapshot: the newest entry stays (pysyncobj replaces the log then)
    assert [e[1] for e in reopen(path, compacted_to=99)[:]] == [40]


def test_a_torn_segment_ends_the_log_and_later_segments_go(tmp_path, caplog) -> None:
    # a crash before the syncer reached a rolled-over segment: a later one may hold entries it lacks
    path = str(tmp_path / "raft.journal")
    j = DurableJournal(path, segment_bytes=300)
    fill(j, 40)
    j._destroy()
    files = segment_files(path)
    k = reopen(path)
    middle = k._where[12][0]
    end = [off for seg, off in k._where if seg is middle][-1]
    last_in_middle = [e[1] for e, (seg, _) in zip(k[:], k._where, strict=True) if seg is middle][-1]
    k._destroy()
    os.truncate(middle.path, end + 5)
    m = reopen(path)
    assert [e[1] for e in m[:]] == list(range(1, last_in_middle))
    assert "torn tail" in caplog.text and "dropping entries" in caplog.text
    assert segment_files(path) == files[:files.index(middle.path) + 1]
    m._destroy()


def test_the_tick_thread_never_syncs_to_roll_over_or_compact(tmp_path, monkeypatch) -> None:
    calls: list[str] = []
    real_fsync, real_fdatasync = os.fsync, os.fdatasync

    def record(real):
        return lambda fd: (calls.append(threading.current_thread().name), real(fd))[1]

    monkeypatch.setattr(os, "fsync", record(real_fsync))
    monkeypatch.setattr(os, "fdatasync", record(real_fdatasync))
    path = str(tmp_path / "raft.journal")
    j = DurableJournal(path, segment_bytes=300)
    calls.clear()  # opening syncs the first segment's creation, before the node runs
    woken = threading.Event()
    j.start_syncer(woken.set)
    try:
        deadline = time.monotonic() + 5
        index = 0
        while len(segment_files(path)) < 6:  # rolls over as the segment thread makes spares
            assert time.monotonic() < deadline, "no spare segments"
            index += 1
            fill(j, 1, first=index)
            j.request_sync()
            time.sleep(0.005)
        j.deleteEntriesTo(index - 3)
        assert woken.wait(5)
        deadline = time.monotonic() + 5
        while j.durable_index < index or len(segment_files(path)) > 3:
            assert time.monotonic() < deadline, (j.durable_index, segment_files(path))
            time.sleep(0.01)
        mine = threading.current_thread().name
        assert mine not in calls and calls, calls
    finally:
        j._destroy()


def test_a_sync_covers_the_segment_rolled_over_from(tmp_path, monkeypatch) -> None:
    synced: list[int] = []
    real = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (synced.append(os.fstat(fd).st_ino), real(fd))[1])
    path = str(tmp_path / "raft.journal")
    j = DurableJournal(path, segment_bytes=300)
    fill(j, 5)
    j.sync()
    synced.clear()
    fill(j, 10, first=6)  # rolls over at least once
    j.sync()
    inodes = {os.stat(p).st_ino for p in segment_files(path)[:2]}
    assert len(j.segment_paths()) >= 2 and inodes <= set(synced)
    j._destroy()
