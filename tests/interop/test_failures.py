"""Kills under real traffic: a master broker, then our Raft leader (each test has its own deployment)."""

from __future__ import annotations

import signal
import time

import pytest

from .conftest import Deployment
from .recorder import Recorder
from .traffic import create_topic, finish_producer, start_consumer, start_producer

pytestmark = pytest.mark.interop

# How soon a SIGKILLed broker must leave the routes. 5.x brokers announce heartbeatTimeoutMillis =
# brokerNotActiveTimeoutMillis (10 s); 4.9 brokers announce none, and the stock NameServer drops a broker
# the moment its channel closes (onChannelDestroy). 10 s, plus one scan and slack.
BROKER_GONE_WITHIN_S = 15.0


def test_master_sigkill_leaves_routes_and_producer_keeps_sending(fresh: Deployment) -> None:
    d = fresh
    d.wait_brokers({"broker-a": {0, 1}, "broker-b": {0}})
    topic = "InteropMasterKill"
    create_topic(d, topic)
    p = start_producer(d, topic, 400, interval_ms=50, prefix="mk")
    p.wait_line(lambda ln: ln.startswith("SENT "), timeout=60)
    time.sleep(3)
    d.brokers["b0"].proc.kill()  # broker-b has no slave: its queues must leave every route
    killed = time.monotonic()
    d.wait_route(topic, lambda r: r is not None and {q["brokerName"] for q in r["queueDatas"]} == {"broker-a"},
                 timeout=180)
    gone_after = time.monotonic() - killed
    at_gone = len(p.snapshot())
    res = finish_producer(p, timeout=300)
    # The client sends synchronously, one message at a time: the one under way when the route dropped
    # broker-b was sent before it dropped (to broker-b, maybe, which died under it: its retries can run
    # out of the 3 s budget). Every later send must succeed.
    done_before = sum(1 for ln in res.lines[:at_gone] if ln.startswith(("SENT ", "FAIL ")))
    in_flight = f"mk-{done_before}"
    failed_after = [ln for ln in res.lines[at_gone:] if ln.startswith("FAIL ") and ln.split()[1] != in_flight]
    assert not failed_after, f"sends failed after the route dropped broker-b: {failed_after[:5]}"
    d.wait_brokers({"broker-a": {0, 1}}, timeout=5)
    assert gone_after <= BROKER_GONE_WITHIN_S, (
        f"broker-b left the routes {gone_after:.1f} s after its SIGKILL (want <= {BROKER_GONE_WITHIN_S} s); "
        f"{len(res.failed)} sends failed in all")


def test_raft_leader_sigkill_during_traffic(fresh: Deployment) -> None:
    d = fresh
    d.wait_brokers({"broker-a": {0, 1}, "broker-b": {0}})
    topic = "InteropLeaderKill"
    create_topic(d, topic)
    c = start_consumer(d, topic, "interop-cg-leaderkill", "lk1")
    c.wait_owning()
    p = start_producer(d, topic, 300, interval_ms=50, prefix="lk")
    p.wait_line(lambda ln: ln.startswith("SENT "), timeout=60)
    time.sleep(2)
    leader = d.ours.leader()
    assert leader is not None
    d.ours.kill(leader)
    killed = time.monotonic()
    survivors = [n for n in d.ours.nodes if n is not leader]
    d.ours.wait_ready(survivors, timeout=30)
    res = finish_producer(p, timeout=300)
    assert not res.failed, f"{len(res.failed)} sends failed beyond the client's retries: {res.failed[:5]}"
    c.wait_received(set(res.sent), timeout=120)
    # a broker-side change after the kill (a new topic: new DataVersion) registers through the survivors
    alive = [n.remoting_addr for n in survivors]
    create_topic(d, "InteropAfterLeaderKill", namesrv=";".join(alive))
    d.wait_route("InteropAfterLeaderKill", addrs=alive, timeout=60)
    d.wait_brokers({"broker-a": {0, 1}, "broker-b": {0}}, addrs=alive, timeout=30)
    assert time.monotonic() - killed < 240
    c.proc.stop()


def test_client_asking_a_restarting_node_gets_only_answers(deployment: Deployment) -> None:
    """A real producer whose only name server is one of our nodes (through recorder.py), polling its route every
    200 ms, while that node restarts (SIGTERM, then started again from its log). A starting node does not
    accept connections until it can answer, so the client sees refusals (the recorder closes its connection),
    never an error code; once the node is back it answers the route again. Every send succeeds (the
    client keeps its last route meanwhile)."""
    d = deployment
    topic = "InteropRestartingNode"
    create_topic(d, topic)
    node = d.ours.followers()[0]
    rec = Recorder(node.remoting_addr, "restarting").start()
    p = start_producer(d, topic, 400, interval_ms=100, prefix="rn", namesrv=rec.addr,
                       props={"interop.pollNameServerInterval": "200"})
    try:
        p.wait_line(lambda ln: ln.startswith("SENT "), timeout=60)
        time.sleep(2)
        d.ours.kill(node, signal.SIGTERM)
        restarted_at = len(rec.snapshot())
        d.ours.start(node)
        d.ours.wait_ready(timeout=60)
        deadline = time.monotonic() + 60
        while not any(ex.request.code == 105 and ex.response is not None for ex in rec.snapshot()[restarted_at:]):
            assert time.monotonic() < deadline, "the client was never answered by the restarted node"
            time.sleep(0.5)
        res = finish_producer(p, timeout=300)
    finally:
        rec.stop()
    codes = {(ex.request.code, ex.response.code, ex.response.remark) for ex in rec.snapshot()
             if ex.response is not None and ex.response.code != 0}
    assert not codes, f"the client got error answers around the restart: {sorted(codes, key=str)[:5]}"
    assert not res.failed, f"{len(res.failed)} sends failed: {res.failed[:5]}"
    d.ours.wait_converged(timeout=60)
