"""Damaged files on restart: a corrupted snapshot, a torn journal tail, bytes flipped mid-journal.

In each scenario a follower is killed (-9) while both workloads run, one of its files is damaged, and it
is started again while the workload goes on:

(a) newest snapshot corrupted: the node must detect it (its log names the file) and either repair
    itself (an older snapshot, or one from its peers) and converge, or refuse to serve with a clear
    error in Status.apply_error (with worker processes too: they open the node's port when its core
    refuses, docs/faults.md finding 11); the operator then deletes its data directory and it rejoins.
(b) the newest raft.journal segment cut in the middle of its last record (a torn write): the node drops the torn tail
    with a warning naming the file, catches up from its peers, and converges.
(c) bytes flipped in a record in the middle of a raft.journal segment: acknowledged data is unreadable, so the
    node refuses to start (non-zero exit) with an error naming the journal file and the record's
    offset; the operator deletes its data directory and it rejoins by snapshot/log catch-up.

Every scenario ends with every check of tests/faults/scenario.py.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import struct
import time

import grpc
import pytest

from nameserver.pb import api_pb2
from tests.cluster import Cluster, NodeProc
from tests.faults.scenario import Run, pick, read_log, timeout_for, wait_exit

pytestmark = pytest.mark.cluster

RUN_BEFORE_S = pick(2.5, 20.0)  # workload before the kill: the journal gets many records
DOWN_S = pick(1.0, 10.0)        # the node stays down while the others go on
AFTER_S = pick(2.0, 20.0)       # workload after the restart, before the final checks

# raftlog/journal.py's format: b"NSJOURN1", then per record u32 length | u32 crc32 | u64 index |
# u64 term | command. Parsed here independently, so a change of format shows up as a test failure.
NS_MAGIC = b"NSJOURN1"
NS_RECORD = struct.Struct("<IIQQ")
# pysyncobj's FileJournal (before raftlog/journal.py): a 40-byte header whose last u32 is the end of
# the last record; per record u32 size | u64 index | u64 term | command | u32 size.
PSO_MAGIC = b"PYSYNCOBJ"


def journal_records(path: str) -> list[tuple[int, int]]:
    """(start, end) byte offsets of every record in a Raft journal file."""
    with open(path, "rb") as f:
        data = f.read()
    out = []
    if data.startswith(NS_MAGIC):
        pos = len(NS_MAGIC)
        while pos + NS_RECORD.size <= len(data):
            length = NS_RECORD.unpack_from(data, pos)[0]
            end = pos + NS_RECORD.size + length
            if end > len(data):
                break
            out.append((pos, end))
            pos = end
        return out
    if data.startswith(PSO_MAGIC):
        last = struct.unpack_from("<I", data, 36)[0]
        pos = 40
        while pos < last:
            size = struct.unpack_from("<I", data, pos)[0]
            out.append((pos, pos + size + 8))
            pos += size + 8
        return out
    raise AssertionError(f"{path}: unknown journal format {data[:16]!r}")


def _data_dir(c: Cluster, node: NodeProc) -> str:
    return os.path.join(c.root, f"{node.name}-data")


def _segments(c: Cluster, node: NodeProc) -> list[str]:
    """The journal's segment files that hold records (raft.journal.<8 digits>), oldest first."""
    raft = os.path.join(_data_dir(c, node), "raft")
    names = sorted(n for n in os.listdir(raft) if re.fullmatch(r"raft\.journal\.\d{8}", n))
    return [p for p in (os.path.join(raft, n) for n in names) if journal_records(p)]


def _start(fault_cluster, make_run, **settings: object) -> tuple[Cluster, Run, NodeProc]:
    c = fault_cluster(**settings)
    leader = c.wait_ready()
    run = make_run(c)
    run.start()
    time.sleep(RUN_BEFORE_S)
    leader = c.wait_for("a leader", c.leader, timeout=30)
    target = next(n for n in c.nodes if n is not leader)
    return c, run, target


def _finish(c: Cluster, run: Run, healed: float) -> dict:
    time.sleep(AFTER_S)
    run.stop()
    return run.verify(healed_at=healed)


def _rejoin_from_scratch(c: Cluster, node: NodeProc) -> float:
    """What the operator does: delete the node's data directory and start it; it rejoins from its peers."""
    if node.alive:
        c.kill(node)
    shutil.rmtree(_data_dir(c, node))
    c.start(node)
    return time.monotonic()


@pytest.mark.timeout(timeout_for(RUN_BEFORE_S + DOWN_S + AFTER_S, RUN_BEFORE_S + DOWN_S + AFTER_S))
def test_corrupted_snapshot_on_restart(fault_cluster, make_run) -> None:
    c, run, target = _start(fault_cluster, make_run, snapshot_every_entries=500)
    snap = target.admin.TakeSnapshot(api_pb2.TakeSnapshotRequest(), timeout=30)
    assert snap.offset > 0, "the follower took no snapshot"
    c.kill(target)  # SIGKILL
    newest = sorted(glob.glob(os.path.join(_data_dir(c, target), "snapshots", "snap-*.mdb")))[-1]
    with open(newest, "r+b") as f:  # flip bytes in the middle of the newest snapshot
        f.seek(os.path.getsize(newest) // 2)
        f.write(b"\xff" * 64)
    time.sleep(DOWN_S)
    logged_before = len(read_log(target))
    c.start(target)
    restarted = time.monotonic()

    def outcome() -> str | None:
        st = target.status()
        if st is not None and st.apply_error:
            return "refused"
        if st is not None and st.ready:
            return "repaired"
        if not target.alive:
            return "exited"
        return None

    got = c.wait_for("the node to refuse or repair its corrupt snapshot", outcome, timeout=30)
    # Only what the restarted node logged about the damage counts ("snapshot written" lines from
    # before the kill name the file too).
    complaints = [line for line in read_log(target)[logged_before:].splitlines()
                  if "corrupt snapshot" in line or "SnapshotCorrupt" in line or "apply stopped" in line]
    named = [line for line in complaints if os.path.basename(newest) in line or "raft.dump" in line]
    print(f"\ncorrupt {os.path.basename(newest)}: {got}; log: {complaints[:2]}")
    assert named, (f"the restarted node's log does not name the damaged file ({os.path.basename(newest)}, "
                   f"hard-linked as raft/raft.dump); it says: {complaints[:3]}")
    if got == "refused":
        # With worker processes too: they open the port when their core refuses for good (finding 11)
        st = target.status()
        print(f"apply_error: {st.apply_error if st else None}")
        assert st is not None and "snapshot" in st.apply_error and not st.ready, st
        with pytest.raises(grpc.RpcError) as err:  # it serves nothing it cannot trust, and says why
            target.ns.GetKv(api_pb2.GetKvRequest(namespace="ledger", key="w0-0000000"), timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "apply stopped" in (err.value.details() or "")
        others = {n.name for n in c.nodes if n is not target}
        c.wait_for("a write acknowledged through the others since the restart (they keep serving)",
                   lambda: run.ledger.acked_between(restarted, time.monotonic(), others), timeout=10)
        healed = _rejoin_from_scratch(c, target)
    elif got == "exited":
        assert target.proc is not None and target.proc.returncode != 0
        healed = _rejoin_from_scratch(c, target)
    else:
        healed = restarted
    _finish(c, run, healed)


@pytest.mark.timeout(timeout_for(RUN_BEFORE_S + DOWN_S + AFTER_S, RUN_BEFORE_S + DOWN_S + AFTER_S))
def test_torn_journal_tail_is_repaired_on_restart(fault_cluster, make_run) -> None:
    c, run, target = _start(fault_cluster, make_run)
    c.kill(target)
    path = _segments(c, target)[-1]  # the newest: its last record is the last written
    records = journal_records(path)
    start, end = records[-1]
    cut = start + (end - start) // 2
    os.truncate(path, cut)  # a crash in the middle of writing the last record
    print(f"\n{path}: {len(records)} records; cut the last one ({start}..{end}) at {cut}")
    time.sleep(DOWN_S)
    c.start(target)
    restarted = time.monotonic()

    def outcome() -> str | None:  # the journal is read at start: a node refusing it exits before it is ready
        if not target.alive:
            return "exited"
        st = target.status()
        return "ready" if st is not None and st.ready else None

    got = c.wait_for("the restarted node to be ready or exit", outcome, timeout=60)
    log = read_log(target)
    assert got == "ready", (f"{target.name} exited with {target.proc.returncode if target.proc else None} on a "
                            f"torn tail instead of repairing it:\n{log[-3000:]}")
    c.wait_ready(nodes=c.nodes, timeout=60)  # (and it must still be up at the end: Run.verify checks)
    warned = [line for line in log.splitlines() + read_log(target).splitlines()
              if "torn" in line and "raft.journal" in line]
    print(f"warning: {warned[:1]}")
    assert warned, f"no warning naming the journal and its torn tail:\n{read_log(target)[-3000:]}"
    _finish(c, run, restarted)


@pytest.mark.timeout(timeout_for(RUN_BEFORE_S + DOWN_S + AFTER_S, RUN_BEFORE_S + DOWN_S + AFTER_S))
def test_flipped_bytes_mid_journal_refuse_to_start(fault_cluster, make_run) -> None:
    c, run, target = _start(fault_cluster, make_run)
    c.kill(target)
    path = max(_segments(c, target), key=lambda p: len(journal_records(p)))
    records = journal_records(path)
    assert len(records) >= 5, f"{path} holds only {len(records)} records"
    start, end = records[len(records) // 2]
    with open(path, "r+b") as f:
        header = NS_RECORD.size if f.read(8) == NS_MAGIC else 20
        at = start + header + max(0, (end - start - header) // 2 - 4)  # inside the record's command bytes
        f.seek(at)
        old = f.read(8)
        f.seek(at)
        f.write(bytes(b ^ 0xFF for b in old))
    print(f"\n{path}: {len(records)} records; flipped 8 bytes at {at} in record {len(records) // 2} "
          f"({start}..{end})")
    time.sleep(DOWN_S)
    c.start(target)
    code = wait_exit(target, 20)
    log = read_log(target)
    assert code is not None and code != 0, \
        f"{target.name} started on a journal with a corrupt record mid-file (exit {code}):\n{log[-3000:]}"
    errors = [line for line in log.splitlines() if "raft.journal" in line and str(start) in line]
    print(f"exit {code}; error: {errors[:1]}")
    assert errors, f"no error naming {path} and offset {start}:\n{log[-3000:]}"
    healed = _rejoin_from_scratch(c, target)
    _finish(c, run, healed)
