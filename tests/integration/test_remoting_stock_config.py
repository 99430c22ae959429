"""What the stock NameServer accepts on the remoting port, we accept: its configuration keys (318, 319),
its registration reply's order-topic table, and as many connections as the descriptor limit allows.
One 3-node cluster serves every test of the module."""

from __future__ import annotations

import json
import resource
import socket
import time
from collections.abc import Iterator

import pytest

from tests.cluster import Cluster, running
from tests.fakebroker import FakeBroker

pytestmark = pytest.mark.cluster

# Apache RocketMQ's NamesrvConfig fields, 4.9.7 and 5.x together (common/.../namesrv/NamesrvConfig.java).
STOCK_KEYS = (
    "rocketmqHome", "kvConfigPath", "configStorePath", "productEnvName", "clusterTest", "orderMessageEnable",
    "returnOrderTopicConfigToBroker", "clientRequestThreadPoolNums", "defaultThreadPoolNums",
    "clientRequestThreadPoolQueueCapacity", "defaultThreadPoolQueueCapacity", "scanNotActiveBrokerInterval",
    "unRegisterBrokerQueueCapacity", "supportActingMaster", "enableAllTopicList", "enableTopicList",
    "notifyMinBrokerIdChanged", "enableControllerInNamesrv", "needWaitForService", "waitSecondsForService",
    "deleteTopicWithBrokerRegistration", "configBlackList",
)
ORDER_NS = "ORDER_TOPIC_CONFIG"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running(Cluster(str(tmp_path_factory.mktemp("stockconfig")), 3, remoting=True)) as c:
        yield c


@pytest.fixture
def broker() -> Iterator[FakeBroker]:
    b = FakeBroker(name="broker-s", cluster="ClusterS").start()
    yield b
    b.stop()


def properties(broker: FakeBroker, addr: str) -> dict[str, str]:
    resp = broker.call(addr, 319, {})
    assert resp is not None and resp.code == 0
    return dict(line.split("=", 1) for line in resp.body.decode().splitlines())


def test_318_accepts_every_stock_key_and_replicates_the_settings(cluster: Cluster, broker: FakeBroker) -> None:
    a, b, _ = cluster.nodes
    body = (b"orderMessageEnable=true\nclientRequestThreadPoolNums=32\nscanNotActiveBrokerInterval=2000\n"
            b"notifyMinBrokerIdChanged=true\nneedWaitForService=true\nproductEnvName=qa\n")
    resp = broker.call(a.remoting_addr, 318, {}, body)
    assert resp is not None and resp.code == 0, (resp.code, resp.remark)
    assert "orderMessageEnable" not in resp.remark  # applied: as stock, nothing to say
    assert "no effect here: clientRequestThreadPoolNums" in resp.remark and "scan_interval_ms" in resp.remark
    cluster.wait_converged()
    for n in cluster.nodes:
        props = properties(broker, n.remoting_addr)
        assert props["orderMessageEnable"] == "true", n.remoting_addr
        assert props["clientRequestThreadPoolNums"] == "8"  # accepted, nothing changed
    # the black list is still refused, as stock refuses it
    resp = broker.call(b.remoting_addr, 318, {}, b"kvConfigPath=/tmp/kv.json\n")
    assert (resp.code, resp.remark) == (16, "Can not update config in black list.")


def test_318_accepts_and_ignores_a_key_rocketmq_does_not_know(cluster: Cluster, broker: FakeBroker) -> None:
    resp = broker.call(cluster.nodes[1].remoting_addr, 318, {}, b"listenPort=9999\nnoSuchKey=1\n")
    assert resp is not None and resp.code == 0, (resp.code, resp.remark)
    assert resp.remark.startswith("accepted and ignored") and "listenPort" in resp.remark
    assert "noSuchKey" not in properties(broker, cluster.nodes[1].remoting_addr)


def test_319_lists_every_stock_key(cluster: Cluster, broker: FakeBroker) -> None:
    props = properties(broker, cluster.nodes[2].remoting_addr)
    assert set(STOCK_KEYS) <= props.keys(), sorted(set(STOCK_KEYS) - props.keys())
    # ours where we have one ([liveness] scan_interval_ms, no controller), RocketMQ's default otherwise
    assert props["scanNotActiveBrokerInterval"] == "1000" and props["enableControllerInNamesrv"] == "false"
    assert props["waitSecondsForService"] == "45" and props["unRegisterBrokerQueueCapacity"] == "3000"
    assert props["rocketmqHome"] == props["kvConfigPath"] == props["configStorePath"] == ""  # no file paths
    assert props["configBlackList"] == "configBlackList;configStorePath;kvConfigPath;rocketmqHome"


def _registration_body(broker: FakeBroker, addr: str) -> bytes:
    resp = broker.register(addr, ["TopicS1"])
    assert resp.code == 0, resp.remark
    return resp.body


def test_registration_reply_carries_the_order_topic_table_as_stock(cluster: Cluster, broker: FakeBroker) -> None:
    a, b, third = cluster.nodes
    # never written: no table at all
    assert _registration_body(broker, a.remoting_addr) == b""
    assert broker.call(b.remoting_addr, 100, {"namespace": ORDER_NS, "key": "TopicS1", "value": "broker-s:4"}
                       ).code == 0
    cluster.wait_converged()
    assert json.loads(_registration_body(broker, third.remoting_addr)) == {"table": {"TopicS1": "broker-s:4"}}
    # emptied: the empty table, so a 4.9 broker clears its topics' order flag
    assert broker.call(a.remoting_addr, 102, {"namespace": ORDER_NS, "key": "TopicS1"}).code == 0
    cluster.wait_converged()
    for n in cluster.nodes:
        assert json.loads(_registration_body(broker, n.remoting_addr)) == {"table": {}}, n.remoting_addr


def test_remoting_takes_more_connections_than_the_old_fixed_cap(cluster: Cluster) -> None:
    """limits.remoting_max_connections defaults to what the open-file limit leaves (the test's nodes
    inherit this process's limit); the fixed cap was 4096."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # this process opens them all (the node did too)
    host, port = cluster.nodes[0].remoting_addr.rsplit(":", 1)
    socks: list[socket.socket] = []
    try:
        for _ in range(4096 + 200):
            socks.append(socket.create_connection((host, int(port)), timeout=5))
        time.sleep(1.0)  # the node closes a connection past its cap at once
        closed = 0
        for s in socks:
            s.setblocking(False)
            try:
                closed += s.recv(1) == b""
            except BlockingIOError:
                pass
            except OSError:
                closed += 1
        assert closed == 0, f"{closed} of {len(socks)} connections closed by the node"
    finally:
        for s in socks:
            s.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
