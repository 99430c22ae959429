"""The remoting port where a RocketMQ client or broker meets the node's life: a node that is starting, a
name we would never store, a broker set whose lowest id changes (issue 28). One 3-node cluster.

A RocketMQ client keeps asking the nameserver it chose while its connection holds, whatever the answer
is, and moves to the next one only when it cannot connect (docs/remoting.md, "A starting node").
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest
from cluster import Cluster, running
from fakebroker import FakeBroker, read_frame

from nameserver.remoting import codes, frame
from nameserver.remoting.command import Command
from nameserver.remoting.server import split_addr

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running(Cluster(str(tmp_path_factory.mktemp("lifecycle")), 3, remoting=True)) as c:
        yield c


@pytest.fixture
def client() -> Iterator[FakeBroker]:
    """A connection per node to send requests on (a FakeBroker's nameserver side)."""
    c = FakeBroker(name="client")
    yield c
    c.stop()


def test_a_name_we_would_refuse_is_not_found(cluster: Cluster, client: FakeBroker) -> None:
    # The stock NameServer answers "not found" for any name it does not hold; the 5.x proxy and clients
    # act on 17 (SYSTEM_ERROR reached a proxy's client as an internal error).
    addr = cluster.nodes[0].remoting_addr
    for topic in ("bad/topic", "", "x" * 400, "tab\there"):
        resp = client.call(addr, codes.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
        assert resp is not None and resp.code == codes.TOPIC_NOT_EXIST, (topic, resp)
        assert (resp.remark or "").startswith(f"No topic route info in name server for the topic: {topic}\nSee ")
    resp = client.call(addr, codes.GET_KV_CONFIG, {"namespace": "a/b", "key": "k"})
    assert resp is not None and (resp.code, resp.remark) == (codes.QUERY_NOT_FOUND,
                                                             "No config item, Namespace: a/b Key: k")
    resp = client.call(addr, codes.GET_KVLIST_BY_NAMESPACE, {"namespace": ""})
    assert resp is not None and (resp.code, resp.remark) == (codes.QUERY_NOT_FOUND, "No config item, Namespace: ")
    resp = client.call(addr, codes.GET_ROUTEINFO_BY_TOPIC, {})  # a missing field is still the request's error
    assert resp is not None and resp.code == codes.SYSTEM_ERROR


def test_a_set_is_told_when_its_lowest_broker_id_changes(cluster: Cluster, client: FakeBroker) -> None:
    node = cluster.nodes[1].remoting_addr  # both brokers connect to this node only: it alone tells them
    master = FakeBroker(name="broker-905", cluster="C905").start()
    slave = FakeBroker(name="broker-905", cluster="C905").start()
    try:
        # Off (the default, as stock): a master registering below its slave tells no one.
        assert slave.register(node, ["T905"], broker_id=1, acting_master=True).code == codes.SUCCESS
        assert master.register(node, ["T905"], broker_id=0, acting_master=True).code == codes.SUCCESS
        resp = client.call(node, codes.UPDATE_NAMESRV_CONFIG, {}, body=b"notifyMinBrokerIdChanged=true\n")
        assert resp is not None and resp.code == codes.SUCCESS, resp

        # The master leaves: the slave is now the set's lowest id, and is told so, with who left.
        resp = master.call(node, codes.UNREGISTER_BROKER, master.header(0))
        assert resp is not None and resp.code == codes.SUCCESS
        told = slave.wait_requests(codes.NOTIFY_MIN_BROKER_ID_CHANGE, 1)
        assert told[0].is_oneway
        assert told[0].ext_fields == {"minBrokerId": "1", "minBrokerAddr": slave.addr,
                                      "offlineBrokerAddr": master.addr}

        # The master returns: the slave is told of the new lowest id, with its HA address.
        assert master.register(node, ["T905"], broker_id=0, acting_master=True, counter=2).code == codes.SUCCESS
        told = slave.wait_requests(codes.NOTIFY_MIN_BROKER_ID_CHANGE, 2)
        assert told[1].ext_fields == {"minBrokerId": "0", "minBrokerAddr": master.addr,
                                      "haBrokerAddr": master.addr.rsplit(":", 1)[0] + ":10912"}
        time.sleep(0.5)  # nodes that do not hold the slave's connection tell it nothing
        assert [r.code for r in slave.requests].count(codes.NOTIFY_MIN_BROKER_ID_CHANGE) == 2
        assert codes.NOTIFY_MIN_BROKER_ID_CHANGE not in master.codes()  # the new lowest is not told of itself
    finally:
        client.call(node, codes.UPDATE_NAMESRV_CONFIG, {}, body=b"notifyMinBrokerIdChanged=false\n")
        master.stop()
        slave.stop()


def read_routes(addr: str, topic: str, stop: threading.Event, seen: list[int | str]) -> None:
    """Ask `addr` for `topic`'s route over and over, as a client polling its nameserver; each answer's
    code, or "no connection" when it cannot connect or its connection drops (then it reconnects)."""
    sock = None
    opaque = 0
    while not stop.is_set():
        try:
            if sock is None:
                sock = socket.create_connection(split_addr(addr), timeout=5)
            opaque += 1
            sock.sendall(frame.encode(Command(code=codes.GET_ROUTEINFO_BY_TOPIC, version=479, opaque=opaque,
                                              ext_fields={"topic": topic})))
            payload = read_frame(sock)
            if payload is None:
                raise ConnectionError("closed")
            seen.append(frame.decode(payload).code)
        except OSError:
            seen.append("no connection")
            if sock is not None:
                sock.close()
                sock = None
            time.sleep(0.01)
    if sock is not None:
        sock.close()


def test_a_restarting_node_refuses_connections_until_it_can_answer(cluster: Cluster) -> None:
    leader = cluster.wait_ready()
    target, other = [n for n in cluster.nodes if n is not leader][:2]
    broker = FakeBroker(name="broker-loop", cluster="CLoop").start()
    stop = threading.Event()
    seen: list[int | str] = []
    reader = threading.Thread(target=read_routes, args=(target.remoting_addr, "TopicLoop", stop, seen))
    try:
        assert broker.register(other.remoting_addr, ["TopicLoop"]).code == codes.SUCCESS
        cluster.wait_converged()
        reader.start()
        cluster.wait_for("routes read from the node", lambda: seen.count(codes.SUCCESS) >= 5)
        cluster.kill(target)
        cluster.start(target)
        cluster.wait_for("the node back", lambda: "no connection" in seen and seen[-1] == codes.SUCCESS
                         and seen[seen.index("no connection"):].count(codes.SUCCESS) >= 20, timeout=60)
    finally:
        stop.set()
        if reader.is_alive():
            reader.join(timeout=10)
        broker.stop()
    errors = [code for code in seen if code not in (codes.SUCCESS, "no connection")]
    assert not errors, f"{len(errors)} of {len(seen)} reads answered with an error: codes {sorted(set(errors))}"
    cluster.wait_ready()
