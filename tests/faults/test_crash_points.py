"""A node dies at a named instant of writing or installing a snapshot (raftlog/crashpoints.py: the
RIP18_CRASH_POINT environment variable, set only here), while the workloads run; it is restarted
without the variable and must come back: ready, converged, no acknowledged write lost, bindings
linearizable (every after-check of tests/faults/scenario.py).

Writer points are hit by a follower taking its own snapshot (every 300 entries here). Install points
are hit by a node that joins late: the leader has compacted its log, so the newcomer gets a snapshot
sent over the Raft port and dies while installing it; on restart it installs the file it received.
"""

from __future__ import annotations

import time

import pytest

from raftlog.crashpoints import ENV, EXIT_CODE, POINTS
from tests.faults.scenario import pick, read_log, timeout_for, wait_exit

pytestmark = pytest.mark.cluster

SECONDS = (3, 30)  # the workloads' run after the restart


@pytest.mark.timeout(timeout_for(*SECONDS) + 120)
@pytest.mark.parametrize("point", POINTS)
def test_a_node_killed_at_a_crash_point_comes_back(point, fault_cluster, make_run) -> None:
    c = fault_cluster(start=False, snapshot_every_entries=300)
    victim = c.nodes[2]
    victim.env = {ENV: point}
    joins_late = point.startswith("install")
    first = c.nodes[:2] if joins_late else c.nodes
    for n in first:
        c.start(n)
    leader = c.wait_ready(first)
    run = make_run(c)
    run.start()
    if joins_late:
        c.wait_for("the leader to compact its log", lambda: (s := leader.status()) is not None
                   and s.snapshot_offset > 300, timeout=60)
        c.start(victim)
    code = wait_exit(victim, 90)
    assert code == EXIT_CODE, f"{victim.name} did not die at {point} (exit {code}):\n{read_log(victim)[-3000:]}"
    victim.env = {}
    c.start(victim)
    time.sleep(pick(*SECONDS))
    healed = time.monotonic()
    run.stop()
    report = run.verify(healed_at=healed)
    assert report["acked"] >= 50, report
    status = victim.status()
    assert status is not None and status.ready and status.snapshot_offset > 0, status
