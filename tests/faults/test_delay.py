"""Delay and jitter on every Raft link through a userspace TCP proxy (tests/faults/proxy.py).

The kernel here has no netem, so each node's namespace routes its peers' Raft addresses to a local
proxy (tests/faults/netns.py explains how, without changing the addresses pysyncobj knows peers by).
The proxy holds each chunk 20-100 ms per direction (60 ± 40 ms, uniform) while both workloads run;
the long run also kills and pauses nodes meanwhile. Checked: traffic really went through every
initiating link's proxy with the delay in force (its counters), writes became slower by about a
round trip (so the delay was on the commit path) and kept being acknowledged, and afterwards every
check of tests/faults/scenario.py.
"""

from __future__ import annotations

import time

import pytest

from tests.faults.harness import Nemesis
from tests.faults.netns import NetnsCluster
from tests.faults.scenario import LONG, SEED, median, pick, timeout_for

pytestmark = pytest.mark.cluster

SECONDS = (6, 300)
DELAY_MS, JITTER_MS = 60.0, 40.0


@pytest.mark.timeout(timeout_for(*SECONDS))
def test_delay_and_jitter_on_every_raft_link(lab, fault_cluster, make_run) -> None:
    net = lab(3, proxied=True)
    c = fault_cluster(net)
    assert isinstance(c, NetnsCluster)
    c.wait_ready()
    run = make_run(c)
    run.start()
    time.sleep(2)  # the latency before the delay: about a hundred writes
    base_end = time.monotonic()
    before = net.proxy_stats()
    net.set_delay(DELAY_MS, JITTER_MS)
    delayed_start = time.monotonic()
    nemesis = None
    if LONG:  # the long run also kills and pauses under delay: elections with slow links
        nemesis = Nemesis(c, seed=SEED, pause_s=3.0, down_s=2.0, settle_s=4.0,
                          faults=("kill-leader", "pause-leader", "kill-any", "pause-any"))
        nemesis.start()
    time.sleep(pick(*SECONDS))
    if nemesis is not None:
        nemesis.stop()
    delayed_end = time.monotonic()
    after = net.proxy_stats()
    net.set_delay(0, 0)
    healed = time.monotonic()
    time.sleep(1)  # the workload keeps running across the heal
    run.stop()

    # pysyncobj: the node with the greater address string dials; n3 > n2 > n1 here. Our peer links also
    # dial back after 2 s without a link (raftlog/peerlinks.py), so under the long run's kills and pauses
    # the other direction carries traffic too, through its own proxy.
    dialing = ["n2->n1", "n3->n1", "n3->n2"]
    moved = {r: after[r]["up_bytes"] + after[r]["down_bytes"] - before[r]["up_bytes"] - before[r]["down_bytes"]
             for r in after}
    print(f"\nproxy bytes under delay: {moved}; max hold ms: { {r: after[r]['max_hold_ms'] for r in after} }")
    # Followers exchange nothing, so only the links of a leader must carry traffic.
    leader = c.wait_for("a leader", c.leader, timeout=30).name
    leader_links = [r for r in dialing if leader in r.split("->")]
    assert all(moved[r] > 0 for r in leader_links), f"a Raft link of leader {leader} bypassed its proxy: {moved}"
    assert all(after[r]["max_hold_ms"] >= DELAY_MS for r in leader_links), after
    # any other route that carried traffic held it at least the smallest delay (a few chunks may not reach 60)
    used = [r for r in after if moved[r] > 0]
    assert all(after[r]["max_hold_ms"] >= DELAY_MS - JITTER_MS for r in used), f"traffic without the delay: {after}"
    reverse = [r for r, st in after.items() if r not in dialing and st["conns"]]
    if not LONG:  # no node died or paused: nothing dials back
        assert not reverse, f"a node dialed a peer with a greater address: {reverse}"

    base = run.write_latencies_ms(run.started, base_end)
    slow = run.write_latencies_ms(delayed_start + 1, delayed_end)
    print(f"write latency p50: {median(base):.1f} ms before, {median(slow):.1f} ms under delay "
          f"({len(slow)} writes acknowledged under delay)")
    assert len(slow) >= 10, f"only {len(slow)} writes acknowledged under delay: no progress"
    # a commit needs one round trip to a follower: at least 2 x 20 ms (the smallest hold)
    assert median(slow) >= 40 and median(slow) > median(base), (median(base), median(slow))
    run.verify(healed_at=healed)
