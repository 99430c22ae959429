"""A full disk on one node: its data directory is a small tmpfs, filled while both workloads run.

Expected (raftlog/journal.py): the node cannot persist, so it must not acknowledge; it stops with a
clear error ("No space left on device" in its log, exit code 74 = EX_IOERR) or stays up without
acknowledging. The other two keep serving writes. Once space is freed and the node restarted (if it
exited), it catches up: every check of tests/faults/scenario.py. Run with the full-disk node as a
follower and as the leader: both fail in the same journal append; the leader's case also needs an
election, so make test runs it alone, and make test-slow and make faults (FAULTS_LONG=1) run both.
"""

from __future__ import annotations

import errno
import os
import time

import pytest

from tests.cluster import NodeProc
from tests.faults.scenario import LONG, pick, read_log, timeout_for, wait_exit

pytestmark = pytest.mark.cluster

HOLD_S = pick(6.0, 30.0)
TMPFS_MB = 48
EX_IOERR = 74


def fill(directory: str) -> tuple[str, int]:
    """Fill the filesystem holding `directory` until ENOSPC; returns the filler's path and size."""
    path = os.path.join(directory, "filler")
    written = 0
    with open(path, "wb", buffering=0) as f:
        for chunk in (1 << 20, 1 << 16, 1 << 12, 1 << 9, 1):
            block = b"\0" * chunk
            while True:
                try:
                    n = f.write(block)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
                written += n or 0
                if not n:
                    break
    st = os.statvfs(directory)
    assert st.f_bavail == 0, f"{directory} still has {st.f_bavail} free blocks"
    return path, written


def _data_dir(root: str, node: NodeProc) -> str:
    return os.path.join(root, f"{node.name}-data")


@pytest.mark.timeout(timeout_for(HOLD_S, HOLD_S))
@pytest.mark.parametrize("role", [pytest.param("follower", marks=() if LONG else pytest.mark.slow), "leader"])
def test_full_disk_on_one_node(role: str, tmpfs, fault_cluster, make_run) -> None:
    c = fault_cluster(start=False)
    for n in c.nodes:  # every node on a tmpfs: which one leads is known only after the election
        tmpfs(_data_dir(c.root, n), TMPFS_MB)
    c.start()
    leader = c.wait_ready()
    run = make_run(c)
    run.start()
    time.sleep(1)  # the workload going before the fill
    leader = c.wait_for("a leader", c.leader, timeout=30)
    target = leader if role == "leader" else next(n for n in c.nodes if n is not leader)
    others = {n.name for n in c.nodes if n is not target}
    filler, size = fill(_data_dir(c.root, target))
    filled = time.monotonic()
    print(f"\nfilled {target.name} ({role}) with {size >> 20} MiB")
    code = wait_exit(target, HOLD_S)
    exited_after = time.monotonic() - filled
    time.sleep(max(0.0, filled + HOLD_S - time.monotonic()))
    end = time.monotonic()
    log = read_log(target)
    if code is not None:
        print(f"{target.name} exited with code {code} {exited_after:.1f}s after its disk filled: "
              f"{[line for line in log.splitlines() if 'No space' in line][:1]}")
        assert "No space left on device" in log, f"{target.name} exited (code {code}) without a clear error:\n" \
                                                 f"{log[-3000:]}"
        assert code == EX_IOERR, f"{target.name} exited with {code}, expected {EX_IOERR} (EX_IOERR)"
    else:
        st = target.status()
        print(f"{target.name} stayed up: {st}")
    # the other two keep serving: writes through them acknowledged after an election's worth of time
    grace = 3.0
    served = run.ledger.acked_between(filled + grace, end, others)
    assert served, f"no write acknowledged through {sorted(others)} in {end - filled - grace:.1f}s after " \
                   f"{target.name}'s disk filled\n{c.logs()}"
    print(f"{len(served)} writes acknowledged through {sorted(others)} while {target.name}'s disk was full")
    os.unlink(filler)
    if not target.alive:
        c.start(target)
    healed = time.monotonic()
    time.sleep(1)  # the workload keeps running across the heal
    run.stop()
    run.verify(healed_at=healed)
