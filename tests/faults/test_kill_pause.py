"""kill -9 of any node in a loop, and SIGSTOP of the leader past the election timeout then SIGCONT,
with both workloads recording and every check of tests/faults/scenario.py afterwards; the same with
two worker processes a node and one of them SIGKILLed during each fault (tests/faults/workers.py)."""

from __future__ import annotations

import time

import pytest

from tests.faults.harness import Nemesis
from tests.faults.scenario import SEED, pick, timeout_for

pytestmark = pytest.mark.cluster

# Short: 12 s, room for three faults of the cycle (kill, leader pause, kill: 10.5 s with the settles).
SECONDS = (12, 300)


def kill_and_pause(fault_cluster, make_run, **settings: int) -> Nemesis:
    c = fault_cluster(**settings)
    c.wait_ready()
    run = make_run(c)
    # pause_s 3 s > the election timeout (0.4-1.4 s): the paused leader is deposed while stopped.
    nemesis = Nemesis(c, seed=SEED, pause_s=3.0, down_s=1.5, settle_s=1.5,
                      faults=("kill-any", "pause-leader", "kill-any", "kill-leader"))
    run.start()
    nemesis.start()
    time.sleep(pick(*SECONDS))
    nemesis.stop()
    healed = time.monotonic()
    run.stop()
    print(f"\nfaults: {nemesis.log}")
    assert any(f == "pause-leader" for _, _, f, _ in nemesis.events), "no leader pause was injected"
    assert sum(1 for _, _, f, _ in nemesis.events if f.startswith("kill")) >= 2, nemesis.log
    report = run.verify(healed_at=healed)
    assert report["acked"] >= 50, report
    return nemesis


@pytest.mark.timeout(timeout_for(*SECONDS))
def test_kill_any_node_in_a_loop_and_pause_the_leader(fault_cluster, make_run) -> None:
    kill_and_pause(fault_cluster, make_run)


@pytest.mark.timeout(timeout_for(*SECONDS))
def test_the_same_with_workers_and_a_worker_killed_during_each_fault(fault_cluster, make_run) -> None:
    """Clients' connections to a killed worker drop and they reconnect to another; the core starts it
    again (verify waits for every worker on its port); nothing a client was told is contradicted."""
    nemesis = kill_and_pause(fault_cluster, make_run, worker_processes=2)
    kills = [name for _, _, f, name in nemesis.events if f == "worker-kill"]
    assert len(kills) >= 2, nemesis.log
