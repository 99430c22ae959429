"""The RocketMQ remoting port on a real 3-process cluster, with the real C++ client.

The C++ client is the one bundled in PyPI's rocketmq-client-python 0.5.0rc2 (librocketmq.so). It runs
in a subprocess (its native threads and logs stay out of pytest), asks our nameserver for routes, and
sends to tests/fakebroker.py, which a simulated broker registered over the remoting protocol.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator

import grpc
import pytest
from fakebroker import FakeBroker

from nameserver.pb import api_pb2
from tests.cluster import Cluster, running

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One cluster for the tests whose brokers and topics are their own (broker-a with TopicRemoting and
    TBW102; broker-z and broker-w of ClusterZ) and that change no setting: they pass in any order."""
    with running(Cluster(str(tmp_path_factory.mktemp("shared")), 3, remoting=True)) as c:
        yield c

PRODUCER = r"""
import json, sys
from rocketmq.client import Producer, Message
ns, messages = sys.argv[1], json.loads(sys.argv[2])
producer = Producer("PID-rip18-remoting-test")
producer.set_namesrv_addr(ns)
producer.start()
try:
    for topic, body in messages:
        msg = Message(topic)
        msg.set_keys("key-" + body)
        msg.set_tags("tag")
        msg.set_body(body)
        r = producer.send_sync(msg)
        print(json.dumps({"topic": topic, "status": int(r.status), "msg_id": r.msg_id, "offset": r.offset}),
              flush=True)
finally:
    producer.shutdown()
"""


def run_cpp_producer(ns_addr: str, messages: list[tuple[str, str]], home: str) -> list[dict]:
    # HOME: the C++ client writes its log under $HOME/logs/rocketmq-cpp.
    out = subprocess.run([sys.executable, "-c", PRODUCER, ns_addr, json.dumps(messages)], capture_output=True,
                         text=True, timeout=120, env=os.environ | {"HOME": home})
    assert out.returncode == 0, f"C++ producer failed ({out.returncode}):\n{out.stdout}\n{out.stderr[-3000:]}"
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def wait_route(broker: FakeBroker, ns_addr: str, topic: str, timeout: float = 20.0) -> bytes:
    deadline = time.monotonic() + timeout
    while True:
        resp = broker.call(ns_addr, 105, {"topic": topic})
        assert resp is not None
        if resp.code == 0:
            return resp.body
        assert resp.code == 17 and time.monotonic() < deadline, (resp.code, resp.remark)
        time.sleep(0.1)


def test_cpp_client_gets_routes_from_us_and_sends_to_the_fake_broker(shared: Cluster, tmp_path) -> None:
    c = shared
    leader = c.wait_ready()
    broker = FakeBroker(name="broker-a", cluster="DefaultCluster").start()
    try:
        # A simulated broker registers through a follower (compressed body, CRC): the write is forwarded
        # to the leader and replicated like a gRPC registration.
        follower = c.followers()[0]
        resp = broker.register(follower.remoting_addr, ["TopicRemoting", "TBW102"])
        assert (resp.code, resp.remark) == (0, None)
        broker.heartbeat(follower.remoting_addr)
        c.wait_converged()
        for n in c.nodes:
            route = n.ns.GetRoute(api_pb2.GetRouteRequest(topic="TopicRemoting"), timeout=5).route
            assert [a.addr for a in route.broker_datas[0].addrs] == [broker.addr]

        # The client asks another node; a garbage connection to that node first must not matter.
        client_node = leader if leader is not follower else c.nodes[-1]
        logged_before = os.path.getsize(client_node.log_path)  # what this test's connections log comes after
        host, port = client_node.remoting_addr.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as junk:
            junk.sendall(struct.pack(">ii", 20, 16) + b"this is not json" + b"tail")
            assert junk.recv(1) == b""
        wait_route(broker, client_node.remoting_addr, "TopicRemoting")

        messages = [("TopicRemoting", f"hello {i}") for i in range(5)] + [("TopicNotRegistered", "via TBW102")]
        results = run_cpp_producer(client_node.remoting_addr, messages, str(tmp_path))
        assert [(r["topic"], r["status"]) for r in results] == [(t, 0) for t, _ in messages], results
        got = broker.wait_messages(len(messages))
        assert [(m.topic, m.body.decode()) for m in got] == messages
        assert all(m.properties.get("KEYS") == "key-" + m.body.decode() for m in got)
        # An unknown topic: the client got TOPIC_NOT_EXIST from us, then used the TBW102 route.
        assert got[-1].default_topic == "TBW102"
        assert 10 in broker.codes() or 310 in broker.codes()
        with open(client_node.log_path) as f:
            f.seek(logged_before)
            assert "closing connection from 127.0.0.1" in f.read()
    finally:
        broker.stop()


def test_broker_side_codes_take_the_raft_path(make_cluster) -> None:
    c = make_cluster(remoting=True)
    c.wait_ready()
    a, b, third = c.nodes
    broker = FakeBroker(name="broker-x", cluster="ClusterX").start()
    try:
        assert broker.register(a.remoting_addr, ["TopicX1", "TopicX2"], counter=3).code == 0
        assert json.loads(wait_route(broker, b.remoting_addr, "TopicX1"))["queueDatas"][0]["perm"] == 6

        # QUERY_DATA_VERSION: a newer version than the registered one is "changed"; an unknown broker too.
        dv = b'{"counter":4,"stateVersion":0,"timestamp":1700000000000}'
        resp = broker.call(b.remoting_addr, 322, broker.header(), dv)
        assert (resp.code, resp.ext_fields["changed"]) == (0, "true")
        stranger = FakeBroker(name="broker-y", cluster="ClusterX")
        resp = stranger.call(b.remoting_addr, 322, stranger.header(), dv)
        assert (resp.code, resp.ext_fields["changed"], resp.body) == (0, "true", b"")
        stranger.stop()

        # Admin writes through one node are visible through the others.
        resp = broker.call(third.remoting_addr, 205, {"brokerName": "broker-x"})
        assert (resp.code, resp.ext_fields) == (0, {"wipeTopicCount": "2"})
        assert broker.call(a.remoting_addr, 100, {"namespace": "NS", "key": "k", "value": "v"}).code == 0
        deadline = time.monotonic() + 10
        while (resp := broker.call(b.remoting_addr, 101, {"namespace": "NS", "key": "k"})).code == 22:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert (resp.code, resp.ext_fields) == (0, {"value": "v"})
        cluster = json.loads(broker.call(third.remoting_addr, 106, {}).body)
        assert cluster["clusterAddrTable"] == {"ClusterX": ["broker-x"]}

        # UPDATE_NAMESRV_CONFIG through one node is a replicated setting: every node answers by it.
        assert broker.call(a.remoting_addr, 100, {"namespace": "ORDER_TOPIC_CONFIG", "key": "TopicX1",
                                                  "value": "broker-x:2"}).code == 0
        assert "orderTopicConf" not in json.loads(broker.call(a.remoting_addr, 105, {"topic": "TopicX1"}).body)
        assert broker.call(a.remoting_addr, 318, {}, b"orderMessageEnable=true\nenableAllTopicList=false\n").code == 0
        c.wait_converged()
        for n in c.nodes:
            route = json.loads(broker.call(n.remoting_addr, 105, {"topic": "TopicX1"}).body)
            assert route["orderTopicConf"] == "broker-x:2", n.remoting_addr
            resp = broker.call(n.remoting_addr, 206, {})
            assert resp.code == 1 and resp.remark.startswith("disable"), (resp.code, resp.remark)
            text = broker.call(n.remoting_addr, 319, {}).body.decode()
            assert "orderMessageEnable=true\n" in text and "enableAllTopicList=false\n" in text
        resp = broker.call(b.remoting_addr, 318, {}, b"enableTopicList=maybe\n")  # not a boolean: refused
        assert resp.code == 1 and "enableTopicList" in resp.remark
        assert broker.call(b.remoting_addr, 318, {}, b"enableAllTopicList=true\n").code == 0

        # Bad input: the gRPC validation message comes back as SYSTEM_ERROR's remark.
        resp = broker.call(b.remoting_addr, 103, broker.header() | {"brokerAddr": "not-an-address"})
        assert resp.code == 1 and "broker_addr" in resp.remark

        # Unregister through one node: the route is gone everywhere (TOPIC_NOT_EXIST).
        assert broker.call(b.remoting_addr, 104, broker.header()).code == 0
        c.wait_converged()
        for n in c.nodes:
            resp = broker.call(n.remoting_addr, 105, {"topic": "TopicX1"})
            assert resp.code == 17 and "TopicX1" in resp.remark
            with pytest.raises(grpc.RpcError):
                n.ns.GetRoute(api_pb2.GetRouteRequest(topic="TopicX1"), timeout=5)
    finally:
        broker.stop()


def test_a_broker_whose_connections_all_close_leaves_the_routes(shared: Cluster) -> None:
    """RocketMQ unregisters a broker the moment its channel closes; we do when every node's channel
    from it has closed (one node losing its connection proves nothing about the broker)."""
    c = shared  # default_timeout_ms 120 s, far beyond this test: no expiry by timeout
    c.wait_ready()
    broker = FakeBroker(name="broker-z", cluster="ClusterZ").start()
    other = FakeBroker(name="broker-w", cluster="ClusterZ").start()
    try:
        for n in c.nodes:  # a broker registers with every nameserver, each over its own connection
            assert broker.register(n.remoting_addr, ["TopicZ"]).code == 0
            assert other.register(n.remoting_addr, ["TopicW"]).code == 0
        wait_route(broker, c.nodes[0].remoting_addr, "TopicZ")
        # one node's connection closes (that node restarted, say): the broker stays
        sock = broker._channels.pop(c.nodes[1].remoting_addr)
        sock.close()
        time.sleep(3.0)  # three scans
        assert broker.call(c.nodes[2].remoting_addr, 105, {"topic": "TopicZ"}).code == 0
        # the broker process exits: every connection closes, and it leaves the routes within a scan
        t0 = time.monotonic()
        broker.close_channels()
        deadline = time.monotonic() + 10
        while other.call(c.nodes[0].remoting_addr, 105, {"topic": "TopicZ"}).code != 17:
            assert time.monotonic() < deadline, "the broker is still routed 10 s after its connections closed"
            time.sleep(0.1)
        took = time.monotonic() - t0
        assert took < 1.0 + 2.0, f"unregistered {took:.1f} s after its connections closed (scan interval 1 s)"
        # the other broker, still connected, is untouched
        assert other.call(c.nodes[0].remoting_addr, 105, {"topic": "TopicW"}).code == 0
    finally:
        broker.stop()
        other.stop()


def test_broker_with_70000_topics_registers_over_remoting(make_cluster) -> None:
    c = make_cluster(remoting=True)
    c.wait_ready()
    follower = c.followers()[0]
    broker = FakeBroker(name="broker-huge", cluster="C").start()
    try:
        topics = [f"HugeTopic-{i}" for i in range(70000)]
        resp = broker.register(follower.remoting_addr, topics, timeout=120)
        assert (resp.code, resp.remark) == (0, None)
        sts = c.wait_converged(timeout=60)
        assert len({s.digest for s in sts}) == 1
        for n in c.nodes:
            body = json.loads(wait_route(broker, n.remoting_addr, "HugeTopic-69999"))
            assert body["brokerDatas"][0]["brokerName"] == "broker-huge"
        topic_list = json.loads(broker.call(c.nodes[0].remoting_addr, 206, {}).body)["topicList"]
        assert len(topic_list) == 70000
    finally:
        broker.stop()
