"""A slow disk on the leader: every fsync/fdatasync of the leader stalls 0.2 to 2 s (tests/faults/slowdisk.c,
preloaded into every node; the stall is a file the test rewrites), while the workloads run.

The weakness it showed (docs/faults.md): the journal was synced on pysyncobj's tick thread, which also
sends the heartbeats. A stalled fsync was a stalled heartbeat: the followers elected another leader
(whose disk then stalled too: the stall follows the leadership), and writes waited for each election:
162 acknowledged writes/s before, 0.8/s during, 3 leader changes in 10 s. Since the fix (the leader's
journal syncs on its own thread, and a commit needs a majority of durable copies, the leader's or its
followers'), the stalled leader stays leader and the writes go on at the followers' pace: no leader
change, and at least half the acknowledged writes per second of before the stall (same run). The
after-checks hold as everywhere (no acknowledged write lost, bindings linearizable, digests equal, no
node wedged).
"""

from __future__ import annotations

import os
import random
import subprocess
import time

import pytest

from tests.cluster import Cluster, NodeProc
from tests.faults import preload
from tests.faults.scenario import SEED, median, pick, timeout_for

pytestmark = pytest.mark.cluster

SECONDS = (7, 240)


def slowdisk() -> str:
    return preload.build("slowdisk.c")


class Disks:
    """Each node's fsync stall, in seconds, in a file its preloaded shim re-reads."""

    def __init__(self, cluster: Cluster) -> None:
        shim = slowdisk()
        self.files: dict[str, str] = {}
        for n in cluster.nodes:
            self.files[n.name] = os.path.join(cluster.root, f"{n.name}.fsync-stall")
            self.stall(n, 0.0)
            n.env = {"LD_PRELOAD": shim, "SLOWDISK_FILE": self.files[n.name]}

    def stall(self, node: NodeProc, seconds: float) -> None:
        tmp = self.files[node.name] + ".tmp"
        with open(tmp, "w") as f:
            f.write(f"{seconds}\n")
        os.replace(tmp, self.files[node.name])


def test_the_shim_stalls_fsync() -> None:
    path = os.path.join(os.path.expanduser("~/.cache/rip18"), f"stall-{os.getpid()}")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write("0.3\n")
    probe = ("import os, tempfile, time; fd, _ = tempfile.mkstemp(); t = time.monotonic(); os.fsync(fd); "
             "a = time.monotonic() - t; t = time.monotonic(); os.fdatasync(fd); print(a, time.monotonic() - t)")
    try:
        out = subprocess.run(["python3", "-c", probe], env=os.environ | {"LD_PRELOAD": slowdisk(),
                             "SLOWDISK_FILE": path}, capture_output=True, text=True, check=True, timeout=30).stdout
    finally:
        os.unlink(path)
    fsync_s, fdatasync_s = (float(x) for x in out.split())
    assert fsync_s >= 0.29 and fdatasync_s >= 0.29, out


@pytest.mark.timeout(timeout_for(*SECONDS))
def test_fsync_stalls_on_the_leader(fault_cluster, make_run) -> None:
    c = fault_cluster(start=False)
    disks = Disks(c)
    c.start()
    c.wait_ready()
    run = make_run(c)
    run.start()
    time.sleep(2)  # latency before the stall
    base_end = time.monotonic()
    rng = random.Random(SEED)
    stalled: list[str] = []
    leaders: list[str] = []
    start = time.monotonic()
    while time.monotonic() - start < pick(*SECONDS):
        leader = c.leader()
        if leader is not None and (not leaders or leaders[-1] != leader.name):
            leaders.append(leader.name)
        if leader is not None:  # whoever leads now gets the slow disk; the others recover theirs
            for n in c.nodes:
                disks.stall(n, rng.uniform(0.2, 2.0) if n is leader else 0.0)
            if not stalled or stalled[-1] != leader.name:
                stalled.append(leader.name)
        time.sleep(0.5)
    stall_end = time.monotonic()
    for n in c.nodes:
        disks.stall(n, 0.0)
    healed = time.monotonic()
    time.sleep(2)
    run.stop()
    before = len(run.ledger.acked_between(run.started, base_end)) / (base_end - run.started)
    done = sorted(w.complete for w in run.ledger.acked_between(base_end, stall_end))
    gaps = [b - a for a, b in zip([base_end, *done], [*done, stall_end], strict=True)]
    slow = run.write_latencies_ms(base_end, stall_end)
    print(f"\nslow disk: leaders seen {leaders}; stalled {stalled}; acknowledged writes {before:.0f}/s before, "
          f"{len(done) / (stall_end - base_end):.1f}/s during the stall; longest time without an "
          f"acknowledgement {max(gaps):.1f} s; p50 of those acknowledged {median(slow):.0f} ms")
    assert len(stalled) >= 1
    assert leaders == stalled[:1], f"a slow disk on the leader cost an election: leaders {leaders}"
    during = len(done) / (stall_end - base_end)
    assert during >= 0.5 * before, f"writes slowed from {before:.0f}/s to {during:.1f}/s with the leader's disk slow"
    report = run.verify(healed_at=healed)
    assert report["acked"] >= 50, report
