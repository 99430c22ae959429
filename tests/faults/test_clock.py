"""Clock faults: each node runs with tests/faults/clockshim.c preloaded (its wall clock is real + an
offset + a drift, read from a file the test rewrites while the node runs): wall-clock steps forward and
back on the leader and on a follower, as NTP or a resumed VM makes them, and a follower whose wall clock
runs 1.5x fast. CLOCK_MONOTONIC is never touched, as no real clock step touches it. (Debian's
libfaketime was the first choice; see clockshim.c for why it could not be used.)

1. An exactly-once session must survive the leader's wall clock stepping past the session TTL: a client
   retrying its last write after the step must get the first result, not a second application.
2. The workloads of tests/faults/scenario.py run through steps and drift, with every after-check.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from nameserver import headers
from nameserver.pb import api_pb2
from tests.cluster import Cluster, NodeProc
from tests.faults import preload
from tests.faults.scenario import SEED, pick, timeout_for

pytestmark = pytest.mark.cluster

SECONDS = (7.5, 300)  # make test: five clock steps (1.5 s apart) and the drift


def clockshim() -> str:
    return preload.build("clockshim.c")


class Clocks:
    """Each node's wall clock: "OFFSET_SECONDS RATE" in a file its preloaded clockshim re-reads."""

    def __init__(self, cluster: Cluster) -> None:
        shim = clockshim()
        self.files: dict[str, str] = {}
        for n in cluster.nodes:
            path = os.path.join(cluster.root, f"{n.name}.clock")
            self.files[n.name] = path
            self.set(n, 0)
            n.env = {"LD_PRELOAD": shim, "CLOCKSHIM_FILE": path}

    def set(self, node: NodeProc, offset_s: float, rate: float = 1.0) -> None:
        tmp = self.files[node.name] + ".tmp"
        with open(tmp, "w") as f:
            f.write(f"{offset_s} {rate}\n")
        os.replace(tmp, self.files[node.name])


def test_an_exactly_once_session_survives_the_leaders_clock_stepping_past_its_ttl(fault_cluster) -> None:
    c = fault_cluster(start=False, scan_interval_ms=200, session_ttl_ms=60_000)
    clocks = Clocks(c)
    c.start()
    leader = c.wait_ready()
    md = [(headers.CLIENT_ID, "stepped"), (headers.CLIENT_SEQ, "1")]
    first = leader.ns.PutKv(api_pb2.PutKvRequest(namespace="clock", key="k", value="v"), timeout=10, metadata=md)
    assert leader.ns.PutKv(api_pb2.PutKvRequest(namespace="clock", key="k", value="v"), timeout=10,
                           metadata=md).offset == first.offset  # a retry replays
    clocks.set(leader, 7200)  # two hours ahead: past the 60 s TTL by any wall-clock measure
    time.sleep(2.0)  # ten expiry scans
    again = leader.ns.PutKv(api_pb2.PutKvRequest(namespace="clock", key="k", value="v"), timeout=10, metadata=md)
    assert again.offset == first.offset, "the session expired on a clock step: the retry applied a second time"
    clocks.set(leader, -7200)  # and back, past the write: nothing changes either
    time.sleep(1.0)
    assert leader.ns.PutKv(api_pb2.PutKvRequest(namespace="clock", key="k", value="v"), timeout=10,
                           metadata=md).offset == first.offset


@pytest.mark.timeout(timeout_for(*SECONDS))
def test_clock_steps_and_drift_on_leader_and_follower(fault_cluster, make_run) -> None:
    c = fault_cluster(start=False)
    clocks = Clocks(c)
    c.start()
    leader = c.wait_ready()
    run = make_run(c)
    run.start()
    follower = next(n for n in c.nodes if n is not leader)
    steps = [(leader, 3600.0), (follower, -3600.0), (leader, -86400.0), (follower, 86400.0), (leader, 0.0),
             (follower, 0.0)]
    deadline = time.monotonic() + pick(*SECONDS)
    events = []
    i = 0
    while time.monotonic() < deadline:
        node, offset = steps[(i + SEED) % len(steps)]
        clocks.set(node, offset)
        events.append(f"{node.name} {offset:+.0f}s")
        i += 1
        time.sleep(1.5)
    for n in c.nodes:
        clocks.set(n, 0)
    # Drift: a follower's wall clock runs 1.5x fast while the workloads go on.
    drifting = next(n for n in c.nodes if n is not c.leader())
    clocks.set(drifting, 0, 1.5)
    events.append(f"{drifting.name} wall clock x1.5")
    time.sleep(pick(3, 60))
    healed = time.monotonic()
    run.stop()
    print(f"\nclock faults: {events}")
    assert len(events) >= 5, events
    report = run.verify(healed_at=healed)
    assert report["acked"] >= 50, report


def test_the_shim_steps_and_slews_a_processs_wall_clock_and_leaves_sleep_alone(tmp_path) -> None:
    """The premise of this module, checked on a bare Python process."""
    path = str(tmp_path / "clock")
    with open(path, "w") as f:
        f.write("7200 1\n")
    probe = ("import time; m = time.monotonic(); time.sleep(0.2); slept = time.monotonic() - m; "
             f"a = time.time(); open({path!r}, 'w').write('0 3\\n'); time.sleep(0.1); b = time.time(); "
             "time.sleep(0.5); print(a, slept, time.time() - b)")
    out = subprocess.run([sys.executable, "-c", probe], env=os.environ | {"LD_PRELOAD": clockshim(),
                         "CLOCKSHIM_FILE": path}, capture_output=True, text=True, check=True, timeout=30).stdout
    stepped, slept, slewed = (float(x) for x in out.split())
    assert 7100 < stepped - time.time() < 7300      # stepped two hours ahead
    assert 0.19 < slept < 1.0                       # monotonic sleeps unaffected
    assert 1.3 < slewed < 2.0                       # 0.5 s of real time read as 1.5 s
