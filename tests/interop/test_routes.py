"""Real RocketMQ brokers (4.9.x and 5.x) register with our 3 remoting ports; routes agree on every node,
read over remoting and over gRPC."""

from __future__ import annotations

import json
import signal
import time

import pytest

from nameserver.pb import api_pb2

from . import jars, remoting
from .conftest import CLUSTER, Deployment

# Topics every broker creates at start (TopicConfigManager): the default topic, the self-test topic, and
# topics named after its cluster and its broker name.
CORE_TOPICS = ["TBW102", "SELF_TEST_TOPIC", CLUSTER, "broker-a", "broker-b"]


def _remoting_view(route: dict | None) -> tuple:
    if route is None:
        return ()
    qds = sorted((q["brokerName"], q["readQueueNums"], q["writeQueueNums"], q["perm"], q["topicSysFlag"])
                 for q in route["queueDatas"])
    bds = sorted((b["brokerName"], b["cluster"], tuple(sorted((int(i), a) for i, a in b["brokerAddrs"].items())))
                 for b in route["brokerDatas"])
    return tuple(qds), tuple(bds)


def _grpc_view(node, topic: str) -> tuple:
    import grpc

    try:
        r = node.ns.GetRoute(api_pb2.GetRouteRequest(topic=topic), timeout=5).route
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.NOT_FOUND:
            return ()
        raise
    qds = sorted((q.broker_name, q.read_queue_nums, q.write_queue_nums, q.perm, q.topic_sys_flag)
                 for q in r.queue_datas)
    bds = sorted((b.broker_name, b.cluster, tuple(sorted((a.broker_id, a.addr) for a in b.addrs)))
                 for b in r.broker_datas)
    return tuple(qds), tuple(bds)


def test_brokers_register_and_every_node_serves_the_same_routes(deployment: Deployment) -> None:
    d = deployment
    a0, a1, b0 = d.brokers["a0"], d.brokers["a1"], d.brokers["b0"]
    d.wait_brokers({"broker-a": {0, 1}, "broker-b": {0}})
    info = remoting.cluster_info(d.addrs[0])
    assert info["brokerAddrTable"]["broker-a"]["brokerAddrs"] == {"0": a0.addr, "1": a1.addr}
    assert info["brokerAddrTable"]["broker-b"]["brokerAddrs"] == {"0": b0.addr}
    assert sorted(info["clusterAddrTable"][CLUSTER]) == ["broker-a", "broker-b"]

    for topic in CORE_TOPICS:
        d.wait_route(topic)
    topics = set(CORE_TOPICS)
    for addr in d.addrs:
        r = remoting.call(addr, 206)  # GET_ALL_TOPIC_LIST_FROM_NAMESERVER
        assert r.code == 0, r.remark
        topics |= set(json.loads(r.body)["topicList"])
    for topic in sorted(topics):
        views = {("remoting", a): _remoting_view(remoting.route(a, topic)) for a in d.addrs}
        views |= {("grpc", n.grpc_addr): _grpc_view(n, topic) for n in d.ours.nodes}
        assert len(set(views.values())) == 1, f"{topic}: nodes disagree: {views}"
        assert views[("remoting", d.addrs[0])], f"{topic}: no route"
    # the broker-named topics route to their broker, with the slave's address in broker-a's data
    qds, bds = _remoting_view(remoting.route(d.addrs[1], "broker-a"))
    assert [q[0] for q in qds] == ["broker-a"]
    assert bds[0][2] == ((0, a0.addr), (1, a1.addr))


@pytest.mark.interop
def test_brokers_stay_registered_across_heartbeats(deployment: Deployment) -> None:
    """Over 3 registration periods of broker-b (10 s, forceRegister off: QUERY_DATA_VERSION first; on 5.x
    also BROKER_HEARTBEAT every second) and one of broker-a (30 s), nothing expires or changes."""
    d = deployment
    before = {a: remoting.cluster_info(a) for a in d.addrs}
    time.sleep(35)
    d.wait_brokers({"broker-a": {0, 1}, "broker-b": {0}}, timeout=5)
    after = {a: remoting.cluster_info(a) for a in d.addrs}
    assert before == after
    for b in d.brokers.values():
        assert b.alive, b.proc.tail()
        assert not [ln for ln in b.proc.snapshot() if "Failed to register" in ln]


@pytest.mark.interop
def test_compressed_registration(deployment: Deployment) -> None:
    """A broker with compressedRegister=true registers (a zlib RegisterBrokerBody). 4.9.7 says
    `compressed=true`; 5.5.0 says `compressed=false` for the same zlib body, which the stock 5.5.0
    NameServer refuses (Failed to decode RegisterBrokerBody) and we read by its zlib header."""
    d = deployment
    c = d.rmq.broker("broker-c", d.namesrv, 0, CLUSTER, extra={"compressedRegister": "true"})
    try:
        d.wait_brokers({"broker-a": {0, 1}, "broker-b": {0}, "broker-c": {0}}, timeout=60)
        d.wait_route("broker-c", timeout=30)
    finally:
        c.proc.stop()
    d.wait_brokers({"broker-a": {0, 1}, "broker-b": {0}}, timeout=30)  # its shutdown unregistered it


@pytest.mark.interop
def test_broker_named_like_a_host_registers(deployment: Deployment) -> None:
    """RocketMQ's default broker name is the host name, which may hold `.`; the broker then owns a topic of
    that name (brokerTopicEnable). The stock NameServer validates nothing in REGISTER_BROKER."""
    d = deployment
    c = d.rmq.broker("host.example", d.namesrv, 0, CLUSTER)
    try:
        d.wait_brokers({"broker-a": {0, 1}, "broker-b": {0}, "host.example": {0}}, timeout=60)
        d.wait_route("TBW102", lambda r: r is not None and "host.example" in
                     {q["brokerName"] for q in r["queueDatas"]}, timeout=30)
    finally:
        c.proc.stop()
    d.wait_brokers({"broker-a": {0, 1}, "broker-b": {0}}, timeout=30)


@pytest.mark.interop
@pytest.mark.parametrize("line", [jars.LINE_5], indirect=True)
def test_broker_named_with_at_space_and_unicode_registers(deployment: Deployment) -> None:
    """The stock NameServer takes any broker name (issue 28): a 5.x broker whose brokerName holds '@', a space
    and a unicode letter registers, and every node answers routes and cluster info with the name as sent."""
    d = deployment
    name = "team@host b ü"
    c = d.rmq.broker(name, d.namesrv, 0, CLUSTER)
    try:
        d.wait_brokers({"broker-a": {0, 1}, "broker-b": {0}, name: {0}}, timeout=60)
        routes = d.wait_route("TBW102", lambda r: r is not None and name in
                              {q["brokerName"] for q in r["queueDatas"]}, timeout=30)
        for route in routes.values():
            assert route is not None
            assert [b["brokerAddrs"] for b in route["brokerDatas"] if b["brokerName"] == name] == [{"0": c.addr}]
        for addr in d.addrs:
            assert name in remoting.cluster_info(addr)["clusterAddrTable"][CLUSTER]
    finally:
        c.proc.stop()
    d.wait_brokers({"broker-a": {0, 1}, "broker-b": {0}}, timeout=30)


@pytest.mark.interop
@pytest.mark.parametrize("line", [jars.LINE_5], indirect=True)  # 4.9.x brokers announce no heartbeat timeout
def test_broker_with_a_500_ms_heartbeat_timeout_registers_and_expires_by_it(deployment: Deployment) -> None:
    """A 5.x broker acting master announces brokerNotActiveTimeoutMillis as its registration's
    heartbeatTimeoutMillis. At 500 ms (stock takes it as is) we register it with 1000 (our floor, said in the
    reply's remark): it stays while it beats (every 200 ms), and once it stops beating (SIGSTOP: its
    connections stay open, so no channel close unregisters it) it leaves by that timeout and one scan (5 s),
    before the 10 s of a broker announcing the default could have passed."""
    d = deployment
    name = "broker-hb"
    c = d.rmq.broker(name, d.namesrv, 0, CLUSTER, extra={
        "enableSlaveActingMaster": "true", "brokerNotActiveTimeoutMillis": "500", "brokerHeartbeatInterval": "200"})
    stopped = False
    try:
        d.wait_brokers({"broker-a": {0, 1}, "broker-b": {0}, name: {0}}, timeout=60)
        until = time.monotonic() + 6  # heartbeats keep it: a scan or more passes with it listed everywhere
        while time.monotonic() < until:
            for addr in d.addrs:
                assert remoting.cluster_info(addr)["brokerAddrTable"].get(name, {}).get("brokerAddrs"), addr
            time.sleep(0.5)
        c.proc.signal(signal.SIGSTOP)
        stopped = True
        paused = time.monotonic()
        d.wait_brokers({"broker-a": {0, 1}, "broker-b": {0}}, timeout=30)
        gone_after = time.monotonic() - paused
        assert gone_after < 10, f"{name} left {gone_after:.1f} s after its heartbeats stopped (want < 10 s)"
    finally:
        if stopped:
            c.proc.signal(signal.SIGCONT)
        c.proc.stop()
    d.wait_brokers({"broker-a": {0, 1}, "broker-b": {0}}, timeout=30)
