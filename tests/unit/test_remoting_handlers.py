"""Golden frames for every request code: hand-built RocketMQ frames go into a RemotingServer whose
gRPC side is a fake NameServer servicer. Each test checks the gRPC request the frame became and the
exact response frame (code, extFields, body bytes) the client gets back."""

from __future__ import annotations

import itertools
import json
import os
import socket
import struct
import time
import zlib
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from fakebroker import crc32, register_body

from nameserver import validation
from nameserver.config import Member, NodeConfig
from nameserver.pb import api_pb2, api_pb2_grpc, state_pb2
from nameserver.remoting import RemotingServer, codes
from nameserver.remoting.handlers import INLINE_CODES, REQUESTS
from tests.cluster import ROOT

ADDR_A0, ADDR_A1 = "10.0.0.1:10911", "10.0.0.2:10911"
BROKER_A = state_pb2.BrokerData(cluster="DefaultCluster", broker_name="broker-a", addrs=[
    state_pb2.BrokerAddr(broker_id=0, addr=ADDR_A0), state_pb2.BrokerAddr(broker_id=1, addr=ADDR_A1)])
QUEUE_A = state_pb2.QueueData(broker_name="broker-a", read_queue_nums=4, write_queue_nums=4, perm=6)
LIVE_VERSION = state_pb2.DataVersion(counter=7, timestamp=1700000000000)


class FakeNameServer(api_pb2_grpc.NameServerServicer):
    """Canned answers; every call recorded as (method, request)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.fail: dict[str, tuple[grpc.StatusCode, str]] = {}
        self.kv: dict[str, dict[str, str]] = {"ORDER_TOPIC_CONFIG": {"TopicTest": "broker-a:4"}}
        self.lives = {ADDR_A0: LIVE_VERSION}
        self.watch = True
        self.route_perm = 6
        self.watch_ended = 0

    def _rec(self, method: str, request: Any, context: grpc.ServicerContext) -> None:
        self.calls.append((method, request))
        if method in self.fail:
            context.abort(*self.fail[method])

    def only(self, method: str) -> Any:
        found = [r for m, r in self.calls if m == method]
        assert len(found) == 1, (method, self.calls)
        return found[0]

    def RegisterBroker(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._rec("RegisterBroker", request, context)
        slave = request.broker_id != 0
        return api_pb2.RegisterBrokerReply(offset=5, records=3, master_addr=ADDR_A0 if slave else "",
                                           ha_server_addr="10.0.0.1:10912" if slave else "",
                                           order_topic_config=self.kv.get("ORDER_TOPIC_CONFIG", {}),
                                           order_topic_config_exists="ORDER_TOPIC_CONFIG" in self.kv)

    def UpdateSettings(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._rec("UpdateSettings", request, context)
        return api_pb2.WriteReply(offset=8, records=len(request.settings))

    def GetSettings(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._rec("GetSettings", request, context)
        return api_pb2.GetSettingsReply(settings={"orderMessageEnable": True, "enableTopicList": False})

    def RegisterBrokerStream(self, request_iterator: Iterator[Any], context: grpc.ServicerContext) -> Any:
        chunks = list(request_iterator)
        self._rec("RegisterBrokerStream", chunks, context)
        return api_pb2.RegisterBrokerReply(offset=6, records=len(chunks))

    def UnregisterBroker(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._rec("UnregisterBroker", request, context)
        return api_pb2.WriteReply(offset=7, records=1)

    def Heartbeat(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._rec("Heartbeat", request, context)
        return api_pb2.HeartbeatReply(
            unknown_addrs=[hb.broker_addr for hb in request.heartbeats if hb.broker_addr not in self.lives],
            data_versions={hb.broker_addr: self.lives[hb.broker_addr] for hb in request.heartbeats
                           if hb.broker_addr in self.lives})

    def Watch(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        self._rec("Watch", request, context)
        context.add_callback(self._watch_ended)  # runs when the call ends, however it ends
        if not self.watch:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not implemented!")
        events = []
        for addr, dv in self.lives.items():
            key = f"live/{addr}"
            if any(key.startswith(p) for p in request.key_prefixes):
                live = state_pb2.BrokerLive(broker_addr=addr, data_version=dv)
                events.append(api_pb2.WatchEvent(type=state_pb2.BROKER_LIVE, key=key,
                                                 value=live.SerializeToString(), version=3))
        yield api_pb2.WatchResponse(offset=9, events=events, initial_state=True, initial_state_done=True)
        while context.is_active():  # a watch never ends by itself: the caller must cancel it
            time.sleep(0.01)

    def _watch_ended(self) -> None:
        self.watch_ended += 1

    def GetRoute(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._rec("GetRoute", request, context)
        if request.topic != "TopicTest":
            context.abort(grpc.StatusCode.NOT_FOUND, f"topic {request.topic} does not exist")
        route = api_pb2.TopicRoute(broker_datas=[BROKER_A], queue_datas=[QUEUE_A])
        route.queue_datas[0].perm = self.route_perm
        return api_pb2.GetRouteReply(route=route, apply_offset=9)

    def GetClusterInfo(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._rec("GetClusterInfo", request, context)
        reply = api_pb2.GetClusterInfoReply(apply_offset=9)
        reply.broker_addr_table["broker-a"].CopyFrom(BROKER_A)
        reply.cluster_addr_table["DefaultCluster"].names.append("broker-a")
        return reply

    def GetTopicList(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._rec("GetTopicList", request, context)
        return api_pb2.GetTopicListReply(topics=[f"kind{request.kind}", request.cluster_name or "-"])

    def GetBrokerMemberGroup(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._rec("GetBrokerMemberGroup", request, context)
        return api_pb2.GetBrokerMemberGroupReply(cluster_name=request.cluster_name,
                                                 broker_name=request.broker_name, addrs=BROKER_A.addrs)

    def PutKv(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._rec("PutKv", request, context)
        return api_pb2.WriteReply(offset=10, records=1)

    def GetKv(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._rec("GetKv", request, context)
        value = self.kv.get(request.namespace, {}).get(request.key)
        if value is None:
            context.abort(grpc.StatusCode.NOT_FOUND, "no KV config")
        return api_pb2.GetKvReply(value=value)

    def DeleteKv(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._rec("DeleteKv", request, context)
        return api_pb2.WriteReply(offset=11)

    def ListKv(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._rec("ListKv", request, context)
        return api_pb2.ListKvReply(table=self.kv.get(request.namespace, {}),
                                   namespace_exists=request.namespace in self.kv)

    def WipeWritePerm(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._rec("WipeWritePerm", request, context)
        return api_pb2.BrokerPermReply(topic_count=3)

    def AddWritePerm(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._rec("AddWritePerm", request, context)
        return api_pb2.BrokerPermReply(topic_count=2)

    def RegisterTopic(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._rec("RegisterTopic", request, context)
        return api_pb2.WriteReply(offset=12)

    def DeleteTopic(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._rec("DeleteTopic", request, context)
        return api_pb2.WriteReply(offset=13)


class Client:
    """A raw socket client: frames in, (header dict, body) out, parsed by hand."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.opaque = itertools.count(100)

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read(self) -> tuple[dict, bytes]:
        kind, head, body = self.read_frame()
        assert kind == 0, "a JSON request's response must use a JSON header"
        return json.loads(head), body

    def read_frame(self) -> tuple[int, bytes, bytes]:
        """(header type, header, body)."""
        total, word = struct.unpack(">ii", self._exactly(8))
        rest = self._exactly(total - 4)
        length = word & 0xFFFFFF
        return word >> 24, rest[:length], rest[length:]

    def _exactly(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError(f"closed after {len(buf)} of {n} bytes")
            buf += chunk
        return buf

    def call(self, code: int, ext: dict[str, str] | None = None, body: bytes = b"", version: int = 479,
             flag: int = 0) -> tuple[dict, bytes]:
        opaque = next(self.opaque)
        head: dict[str, Any] = {"code": code, "flag": flag, "language": "JAVA", "opaque": opaque,
                                "serializeTypeCurrentRPC": "JSON", "version": version}
        if ext is not None:
            head["extFields"] = ext
        raw = json.dumps(head, sort_keys=True, separators=(",", ":")).encode()
        self.send_raw(struct.pack(">ii", 4 + len(raw) + len(body), len(raw)) + raw + body)
        resp, resp_body = self.read()
        assert resp["opaque"] == opaque and resp["flag"] == 1
        return resp, resp_body

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def fake() -> Iterator[FakeNameServer]:
    yield FakeNameServer()


@pytest.fixture
def server(fake: FakeNameServer, tmp_path: Any) -> Iterator[RemotingServer]:
    cfg = NodeConfig(raft_addr="127.0.0.1:1", grpc_addr="127.0.0.1:2", data_dir=str(tmp_path),
                     members=[Member("127.0.0.1:1", "127.0.0.1:2")], remoting_addr="127.0.0.1:0",
                     password="secret-password")
    remoting = RemotingServer(cfg, fake)
    remoting.start()
    yield remoting
    remoting.stop()


@pytest.fixture
def client(server: RemotingServer) -> Iterator[Client]:
    c = Client(server.port)
    yield c
    c.close()


FASTJSON_ROUTE = (b'{"brokerDatas":[{"brokerAddrs":{0:"10.0.0.1:10911",1:"10.0.0.2:10911"},"brokerName":"broker-a",'
                  b'"cluster":"DefaultCluster","enableActingMaster":false}],"filterServerTable":{},"queueDatas":'
                  b'[{"brokerName":"broker-a","perm":6,"readQueueNums":4,"topicSysFlag":0,"writeQueueNums":4}]}')
STANDARD_ROUTE = FASTJSON_ROUTE.replace(b"{0:", b'{"0":').replace(b",1:", b',"1":')


# ---- 105 GET_ROUTEINFO_BY_TOPIC ---------------------------------------------------------------------

def test_105_from_the_cpp_client_gets_fastjson_route(client: Client, fake: FakeNameServer) -> None:
    head = (b'{"code":105,"extFields":{"AccessKey":"","OnsChannel":"ALIYUN","Signature":"LOAJ=","topic":"TopicTest"},'
            b'"flag":0,"language":"CPP","opaque":0,"remark":"","version":63}\n')
    client.send_raw(struct.pack(">ii", 4 + len(head), len(head)) + head)
    resp, body = client.read()
    assert resp == {"code": 0, "flag": 1, "language": "JAVA", "opaque": 0, "serializeTypeCurrentRPC": "JSON",
                    "version": 479}
    assert body == FASTJSON_ROUTE
    assert fake.only("GetRoute") == api_pb2.GetRouteRequest(topic="TopicTest")


def test_105_java_json_header_gets_standard_json(client: Client) -> None:
    head = (b'{"code":105,"extFields":{"topic":"TopicTest"},"flag":0,"language":"JAVA","opaque":1,'
            b'"serializeTypeCurrentRPC":"JSON","version":479}')
    client.send_raw(struct.pack(">ii", 4 + len(head), len(head)) + head)
    resp, body = client.read()
    assert (resp["code"], resp["opaque"], body) == (0, 1, STANDARD_ROUTE)


def test_105_answers_each_route_change_and_each_dialect(client: Client, fake: FakeNameServer,
                                                       server: RemotingServer) -> None:
    """Route bodies are reused only while the route's bytes are the same, per JSON dialect."""
    standard = lambda: client.call(105, {"topic": "TopicTest"}, version=479)[1]  # noqa: E731
    fast = lambda: client.call(105, {"topic": "TopicTest"}, version=63)[1]  # noqa: E731
    assert (standard(), standard(), fast()) == (STANDARD_ROUTE, STANDARD_ROUTE, FASTJSON_ROUTE)
    assert (server.handlers.route_bodies.misses, server.handlers.route_bodies.hits) == (2, 1)
    fake.route_perm = 4  # the write permission wiped
    assert standard() == STANDARD_ROUTE.replace(b'"perm":6', b'"perm":4')
    assert fast() == FASTJSON_ROUTE.replace(b'"perm":6', b'"perm":4')
    fake.route_perm = 6
    assert standard() == STANDARD_ROUTE


def test_105_java_binary_header_gets_a_binary_response(client: Client) -> None:
    client.send_raw(bytes.fromhex("0000002d010000290069" "0001df" "00000001" "00000000" "00000000" "00000014"
                                  "0005" + b"topic".hex() + "00000009" + b"TopicTest".hex()))
    kind, head, body = client.read_frame()
    # code 0, language JAVA, version 479, opaque 1, flag 1 (response), no remark, no extFields
    assert (kind, head, body) == (1, bytes.fromhex("0000" "00" "01df" "00000001" "00000001" "00000000" "00000000"),
                                  STANDARD_ROUTE)


def test_105_old_version_can_ask_for_standard_json(client: Client) -> None:
    _, body = client.call(105, {"topic": "TopicTest", "acceptStandardJsonOnly": "true"}, version=317)
    assert body == STANDARD_ROUTE
    _, body = client.call(105, {"topic": "TopicTest"}, version=400)
    assert body == FASTJSON_ROUTE
    _, body = client.call(105, {"topic": "TopicTest"}, version=401)
    assert body == STANDARD_ROUTE


def test_105_unknown_topic_is_17_and_missing_topic_is_1(client: Client) -> None:
    resp, _ = client.call(105, {"topic": "Nope"}, version=407)  # a 4.9.7 client: 4.x's FAQ address
    assert resp["remark"].endswith("\nSee http://rocketmq.apache.org/docs/faq/ for further details.")
    resp, body = client.call(105, {"topic": "Nope"})
    assert (resp["code"], resp["remark"], body) == (17, "No topic route info in name server for the topic: Nope"
                                                    "\nSee https://rocketmq.apache.org/docs/bestPractice/06FAQ for "
                                                    "further details.",
                                                    b"")
    resp, _ = client.call(105, {})
    assert (resp["code"], resp["remark"]) == (1, "the custom field <topic> is null")


def test_105_a_route_change_is_answered_on_every_connection(client: Client, fake: FakeNameServer,
                                                             server: RemotingServer) -> None:
    """The service requests and bodies reused across reads never answer a changed route stale: not on the
    connection that read it before the change, nor on another one, nor for another zone's request."""
    other = Client(server.port)
    try:
        zoned = {"topic": "TopicTest", "__ZONE_MODE": "true", "__ZONE_NAME": "az1"}
        for c in (client, other):
            assert c.call(105, {"topic": "TopicTest"})[1] == STANDARD_ROUTE
            assert c.call(105, zoned)[1] == STANDARD_ROUTE
        fake.route_perm = 4
        changed = STANDARD_ROUTE.replace(b'"perm":6', b'"perm":4')
        for c in (client, other):
            assert c.call(105, {"topic": "TopicTest"})[1] == changed
            assert c.call(105, zoned)[1] == changed
        assert len(server.handlers.route_requests) == 2  # one per (topic, zone): reused by both connections
        assert [r.zone_name for m, r in fake.calls if m == "GetRoute"] == ["", "az1"] * 4
    finally:
        other.close()


def test_105_a_topic_name_we_refuse_is_17_with_the_faq_remark(client: Client, fake: FakeNameServer) -> None:
    # the not-found remark is made only when needed (a route read that finds its topic makes none)
    resp, body = client.call(105, {"topic": "a/b"})
    assert (resp["code"], resp["remark"], body) == (17, "No topic route info in name server for the topic: a/b"
                                                    "\nSee https://rocketmq.apache.org/docs/bestPractice/06FAQ for "
                                                    "further details.", b"")
    assert not [r for m, r in fake.calls if m == "GetRoute"]


@pytest.mark.parametrize(("value", "zone"), [(None, ""), ("", ""), ("false", ""), ("yes", ""), (" TRUE ", "az1"),
                                             ("True", "az1")])
def test_105_zone_mode_reads_as_java_boolean_parse(client: Client, fake: FakeNameServer, value: str | None,
                                                   zone: str) -> None:
    fields = {"topic": "TopicTest", "__ZONE_NAME": "az1"} | ({} if value is None else {"__ZONE_MODE": value})
    client.call(105, fields)
    assert [r.zone_name for m, r in fake.calls if m == "GetRoute"] == [zone]


def test_105_zone_name_is_passed_only_in_zone_mode(client: Client, fake: FakeNameServer) -> None:
    client.call(105, {"topic": "TopicTest", "__ZONE_NAME": "az1"})
    client.call(105, {"topic": "TopicTest", "__ZONE_NAME": "az1", "__ZONE_MODE": "true"})
    assert [r.zone_name for m, r in fake.calls if m == "GetRoute"] == ["", "az1"]


# ---- 106 / 901: bodies with numeric map keys ---------------------------------------------------------

def test_106_cluster_info(client: Client) -> None:
    broker = (b'{"brokerAddrs":{"0":"10.0.0.1:10911","1":"10.0.0.2:10911"},"brokerName":"broker-a",'
              b'"cluster":"DefaultCluster","enableActingMaster":false}')
    resp, body = client.call(106)
    assert resp["code"] == 0
    assert body == (b'{"brokerAddrTable":{"broker-a":' + broker
                    + b'},"clusterAddrTable":{"DefaultCluster":["broker-a"]}}')
    _, old = client.call(106, version=63)
    assert old == body.replace(b'{"0":', b"{0:").replace(b',"1":', b",1:")


def test_901_broker_member_group(client: Client, fake: FakeNameServer) -> None:
    resp, body = client.call(901, {"clusterName": "DefaultCluster", "brokerName": "broker-a"})
    assert resp["code"] == 0
    assert body == (b'{"brokerMemberGroup":{"brokerAddrs":{"0":"10.0.0.1:10911","1":"10.0.0.2:10911"},'
                    b'"brokerName":"broker-a","cluster":"DefaultCluster"}}')
    # looked up by broker name only, as RocketMQ does; the cluster is echoed
    assert fake.only("GetBrokerMemberGroup") == api_pb2.GetBrokerMemberGroupRequest(broker_name="broker-a")


def test_224_and_901_naming_what_we_could_never_store_answer_as_stock_for_a_name_it_does_not_hold(
        client: Client, fake: FakeNameServer) -> None:
    """Stock answers a cluster or broker name it does not hold, of any length, with SUCCESS and an empty
    list or group; so do we for a name over our bound (once SYSTEM_ERROR), without asking the core."""
    too_long = "n" * (validation.MAX_NAME_BYTES + 1)
    resp, body = client.call(224, {"cluster": too_long})
    assert (resp["code"], body) == (0, b'{"topicList":[]}')
    resp, body = client.call(901, {"clusterName": "DefaultCluster", "brokerName": too_long})
    assert (resp["code"], json.loads(body)) == (0, {"brokerMemberGroup": {
        "brokerAddrs": {}, "brokerName": too_long, "cluster": "DefaultCluster"}})
    assert [m for m, _ in fake.calls] == []
    resp, body = client.call(901, {"clusterName": too_long, "brokerName": "broker-a"})  # only echoed
    assert resp["code"] == 0 and json.loads(body)["brokerMemberGroup"]["cluster"] == too_long
    assert len(json.loads(body)["brokerMemberGroup"]["brokerAddrs"]) == 2


# ---- topic lists ------------------------------------------------------------------------------------

@pytest.mark.parametrize("code, ext, kind, cluster", [
    (206, None, api_pb2.TOPIC_LIST_ALL, ""),
    (224, {"cluster": "DefaultCluster"}, api_pb2.TOPIC_LIST_BY_CLUSTER, "DefaultCluster"),
    (311, None, api_pb2.TOPIC_LIST_UNIT, ""),
    (312, None, api_pb2.TOPIC_LIST_HAS_UNIT_SUB, ""),
    (313, None, api_pb2.TOPIC_LIST_HAS_UNIT_SUB_NOT_UNIT, ""),
])
def test_topic_lists(client: Client, fake: FakeNameServer, code: int, ext: dict | None, kind: int,
                     cluster: str) -> None:
    resp, body = client.call(code, ext)
    assert resp["code"] == 0
    assert body == b'{"topicList":["kind%d","%s"]}' % (kind, (cluster or "-").encode())
    assert fake.only("GetTopicList") == api_pb2.GetTopicListRequest(kind=kind, cluster_name=cluster)


def test_304_system_topic_list_names_a_broker_address(client: Client) -> None:
    resp, body = client.call(304)
    assert resp["code"] == 0
    assert body == b'{"brokerAddr":"10.0.0.1:10911","topicList":["kind2","-"]}'


def test_224_without_cluster_is_1(client: Client) -> None:
    resp, _ = client.call(224, {})
    assert (resp["code"], resp["remark"]) == (1, "the custom field <cluster> is null")


# ---- KV config ----------------------------------------------------------------------------------------

def test_kv_codes(client: Client, fake: FakeNameServer) -> None:
    resp, _ = client.call(100, {"namespace": "NS", "key": "k", "value": "v"})
    assert resp["code"] == 0 and "remark" not in resp
    assert fake.only("PutKv") == api_pb2.PutKvRequest(namespace="NS", key="k", value="v")

    resp, _ = client.call(101, {"namespace": "ORDER_TOPIC_CONFIG", "key": "TopicTest"})
    assert (resp["code"], resp["extFields"]) == (0, {"value": "broker-a:4"})
    resp, _ = client.call(101, {"namespace": "NS", "key": "missing"})
    assert (resp["code"], resp["remark"]) == (22, "No config item, Namespace: NS Key: missing")

    resp, _ = client.call(102, {"namespace": "NS", "key": "k"})
    assert resp["code"] == 0
    assert fake.only("DeleteKv") == api_pb2.DeleteKvRequest(namespace="NS", key="k")

    resp, body = client.call(219, {"namespace": "ORDER_TOPIC_CONFIG"})
    assert (resp["code"], body) == (0, b'{"table":{"TopicTest":"broker-a:4"}}')
    resp, body = client.call(219, {"namespace": "EMPTY"})
    assert (resp["code"], resp["remark"], body) == (22, "No config item, Namespace: EMPTY", b"")
    fake.kv["EMPTIED"] = {}  # its last key was deleted: RocketMQ answers an empty table
    resp, body = client.call(219, {"namespace": "EMPTIED"})
    assert (resp["code"], body) == (0, b'{"table":{}}')

    resp, _ = client.call(100, {"namespace": "NS"})
    assert (resp["code"], resp["remark"]) == (1, "the custom field <key> is null")


# ---- 103 REGISTER_BROKER ----------------------------------------------------------------------------

REGISTER_EXT = {"brokerName": "broker-a", "brokerAddr": ADDR_A0, "clusterName": "DefaultCluster",
                "haServerAddr": "10.0.0.1:10912", "brokerId": "0", "heartbeatTimeoutMillis": "30000",
                "enableActingMaster": "false", "__ZONE_NAME": "az1"}


def test_103_compressed_with_crc(client: Client, fake: FakeNameServer) -> None:
    body = register_body(["T1", "T2"], counter=7)
    resp, out = client.call(103, REGISTER_EXT | {"compressed": "true", "bodyCrc32": str(crc32(body))}, body)
    assert resp["code"] == 0 and "extFields" not in resp  # a master gets no masterAddr / haServerAddr
    assert out == b'{"table":{"TopicTest":"broker-a:4"}}'  # the ORDER_TOPIC_CONFIG KVTable
    assert fake.only("RegisterBroker") == api_pb2.RegisterBrokerRequest(
        cluster_name="DefaultCluster", broker_name="broker-a", broker_addr=ADDR_A0, broker_id=0,
        ha_server_addr="10.0.0.1:10912", heartbeat_timeout_ms=30000, zone_name="az1",
        enable_acting_master=False,  # sent as "false": kept apart from a missing field
        data_version=state_pb2.DataVersion(counter=7, timestamp=1700000000000),
        topics=[api_pb2.TopicConfig(topic_name=t, read_queue_nums=4, write_queue_nums=4, perm=6)
                for t in ("T1", "T2")])


def test_103_plain_json_from_a_slave_gets_master_and_ha_addresses(client: Client, fake: FakeNameServer) -> None:
    fake.kv.clear()
    body = register_body(["T1"], counter=2, compressed=False)
    resp, out = client.call(103, REGISTER_EXT | {"brokerId": "1", "brokerAddr": ADDR_A1}, body)
    assert (resp["code"], resp["extFields"], out) == (
        0, {"haServerAddr": "10.0.0.1:10912", "masterAddr": ADDR_A0}, b"")  # no ORDER_TOPIC_CONFIG: no body
    req = fake.only("RegisterBroker")
    assert (req.broker_id, req.data_version.counter, [t.topic_name for t in req.topics]) == (1, 2, ["T1"])


@pytest.mark.parametrize("compressed", [True, False])
def test_103_a_topic_we_cannot_store_is_left_out_never_the_broker(client: Client, fake: FakeNameServer,
                                                                    compressed: bool) -> None:
    # The stock NameServer checks no topic. A refused registration does not refresh liveness, so the
    # broker would expire: one odd topic must cost that topic only.
    odd = ["a/b", "x" * 400, "bell\x07"]
    body = register_body(["T1", *odd, "host-1.example.com", "%RETRY%" + "g" * 255, "brökér@host"],
                         compressed=compressed)
    resp, _ = client.call(103, REGISTER_EXT | {"compressed": str(compressed).lower()}, body)
    assert resp["code"] == 0, resp
    assert [t.topic_name for t in fake.only("RegisterBroker").topics] == [
        "T1", "host-1.example.com", "%RETRY%" + "g" * 255, "brökér@host"]


@pytest.mark.parametrize(("asked", "stored"), [("500", 1000), ("-1", 1000), ("3600001", 3_600_000)])
def test_103_a_heartbeat_timeout_out_of_range_is_clamped_and_said_in_the_remark(
        client: Client, fake: FakeNameServer, asked: str, stored: int) -> None:
    resp, _ = client.call(103, REGISTER_EXT | {"heartbeatTimeoutMillis": asked}, register_body(["T1"]))
    assert resp["code"] == 0 and f"heartbeatTimeoutMillis {asked} " in resp["remark"] and str(stored) in resp["remark"]
    assert fake.only("RegisterBroker").heartbeat_timeout_ms == stored
    fake.calls.clear()
    resp, _ = client.call(103, REGISTER_EXT, register_body(["T1"]))  # in range: stored as sent, no remark
    assert resp["code"] == 0 and "remark" not in resp and fake.only("RegisterBroker").heartbeat_timeout_ms == 30000


def test_103_crc_mismatch_is_refused_before_any_call(client: Client, fake: FakeNameServer) -> None:
    body = register_body(["T1"])
    resp, _ = client.call(103, REGISTER_EXT | {"compressed": "true", "bodyCrc32": str(crc32(body) ^ 1)}, body)
    assert (resp["code"], resp["remark"]) == (1, "crc32 not match")
    assert fake.calls == []


def test_103_undecodable_body_is_1(client: Client, fake: FakeNameServer) -> None:
    resp, _ = client.call(103, REGISTER_EXT | {"compressed": "true"}, b"\x78\x9cgarbage")
    assert resp["code"] == 1 and "does not inflate" in resp["remark"]
    assert fake.calls == []


def test_103_invalid_argument_from_grpc_is_1_with_the_field(client: Client, fake: FakeNameServer) -> None:
    fake.fail["RegisterBroker"] = (grpc.StatusCode.INVALID_ARGUMENT, "broker_addr: address 'x' is not host:port")
    resp, _ = client.call(103, REGISTER_EXT, register_body(["T1"], compressed=False))
    assert (resp["code"], resp["remark"]) == (1, "broker_addr: address 'x' is not host:port")


def test_103_unavailable_from_grpc_is_system_busy(client: Client, fake: FakeNameServer) -> None:
    fake.fail["RegisterBroker"] = (grpc.StatusCode.UNAVAILABLE, "no leader elected")
    resp, _ = client.call(103, REGISTER_EXT, register_body(["T1"], compressed=False))
    assert (resp["code"], resp["remark"]) == (2, "no leader elected")


def test_103_with_70000_topics_goes_over_the_stream(client: Client, fake: FakeNameServer) -> None:
    topics = [f"HugeTopic-{i}" for i in range(70000)]
    body = register_body(topics)
    assert len(body) < 16 << 20
    resp, _ = client.call(103, REGISTER_EXT | {"compressed": "true", "bodyCrc32": str(crc32(body))}, body)
    assert resp["code"] == 0
    chunks = fake.only("RegisterBrokerStream")
    assert chunks[0].WhichOneof("part") == "header" and not chunks[0].header.topics
    assert chunks[0].header.broker_name == "broker-a"
    assert [len(c.topics.topics) for c in chunks[1:]] == [5000] * 14
    assert [t.topic_name for c in chunks[1:] for t in c.topics.topics] == topics


def test_103_with_5000_topics_is_one_call(client: Client, fake: FakeNameServer) -> None:
    client.call(103, REGISTER_EXT | {"compressed": "true"}, register_body([f"T{i}" for i in range(5000)]))
    assert len(fake.only("RegisterBroker").topics) == 5000


def test_103_without_body_registers_version_zero(client: Client, fake: FakeNameServer) -> None:
    resp, _ = client.call(103, REGISTER_EXT)
    assert resp["code"] == 0
    req = fake.only("RegisterBroker")
    assert (req.data_version.counter, len(req.topics)) == (0, 0)


# ---- 104, 904, 322: the rest of the broker side -----------------------------------------------------

def test_104_unregister(client: Client, fake: FakeNameServer) -> None:
    resp, _ = client.call(104, {"brokerName": "broker-a", "brokerAddr": ADDR_A1, "clusterName": "DefaultCluster",
                                "brokerId": "1"})
    assert resp["code"] == 0
    assert fake.only("UnregisterBroker") == api_pb2.UnregisterBrokerRequest(
        cluster_name="DefaultCluster", broker_name="broker-a", broker_addr=ADDR_A1, broker_id=1)


def test_104_bad_broker_id_is_1(client: Client) -> None:
    resp, _ = client.call(104, {"brokerName": "b", "brokerAddr": ADDR_A1, "clusterName": "c", "brokerId": "x"})
    assert (resp["code"], resp["remark"]) == (1, "the custom field <brokerId> is not an integer: 'x'")


def test_904_oneway_heartbeat_gets_no_response(client: Client, fake: FakeNameServer) -> None:
    head = (b'{"code":904,"extFields":{"brokerAddr":"10.0.0.1:10911","brokerName":"broker-a",'
            b'"clusterName":"DefaultCluster"},"flag":2,"language":"JAVA","opaque":41,"version":479}')
    client.send_raw(struct.pack(">ii", 4 + len(head), len(head)) + head)
    resp, _ = client.call(206)  # the next frame on the connection is the 206 answer, not one for 904
    assert resp["opaque"] != 41
    deadline = time.monotonic() + 5  # requests run concurrently: the 904 may still be in its handler
    while not any(m == "Heartbeat" for m, _ in fake.calls) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert fake.only("Heartbeat") == api_pb2.HeartbeatRequest(heartbeats=[api_pb2.BrokerHeartbeat(
        cluster_name="DefaultCluster", broker_name="broker-a", broker_addr=ADDR_A0, channel_node="127.0.0.1:1")])


def test_904_two_way_heartbeat_is_answered(client: Client) -> None:
    resp, _ = client.call(904, {"brokerAddr": ADDR_A0, "brokerName": "broker-a", "clusterName": "DefaultCluster"})
    assert resp["code"] == 0


QDV_EXT = {"brokerName": "broker-a", "brokerAddr": ADDR_A0, "clusterName": "DefaultCluster", "brokerId": "0"}


def test_322_same_version_is_unchanged_and_refreshes_liveness(client: Client, fake: FakeNameServer) -> None:
    resp, body = client.call(322, QDV_EXT, b'{"counter":7,"stateVersion":0,"timestamp":1700000000000}')
    assert (resp["code"], resp["extFields"]) == (0, {"changed": "false"})
    assert body == b'{"counter":7,"stateVersion":0,"timestamp":1700000000000}'
    # one point read: the heartbeat's reply carries the stored DataVersion (no watch stream per call:
    # acting-master brokers send this every second to every nameserver)
    assert [m for m, _ in fake.calls] == ["Heartbeat"]
    assert fake.only("Heartbeat").heartbeats[0].broker_addr == ADDR_A0


def test_322_other_version_is_changed(client: Client) -> None:
    resp, body = client.call(322, QDV_EXT, b'{"counter":8,"stateVersion":0,"timestamp":1700000000000}')
    assert resp["extFields"] == {"changed": "true"}
    assert body == b'{"counter":7,"stateVersion":0,"timestamp":1700000000000}'


def test_322_answers_a_4_9_broker_without_state_version(client: Client) -> None:
    """A broker before 5 sends a DataVersion without stateVersion, and gets one back in the same form."""
    resp, body = client.call(322, QDV_EXT, b'{"counter":7,"timestamp":1700000000000}')
    assert resp["extFields"] == {"changed": "false"}
    assert body == b'{"counter":7,"timestamp":1700000000000}'


def test_322_unknown_broker_is_changed_without_body(client: Client, fake: FakeNameServer) -> None:
    resp, body = client.call(322, QDV_EXT | {"brokerAddr": "10.9.9.9:10911"}, b'{"counter":1,"timestamp":1}')
    assert (resp["extFields"], body) == ({"changed": "true"}, b"")
    assert [m for m, _ in fake.calls] == ["Heartbeat"]


def test_a_brokers_connection_closing_is_reported(server: RemotingServer, fake: FakeNameServer) -> None:
    # RocketMQ unregisters a broker when its channel closes: the node reports it, naming itself
    c = Client(server.port)
    c.call(103, REGISTER_EXT, register_body(["T1"], compressed=False))
    opened = [r for m, r in fake.calls if m == "Heartbeat"]
    assert [(b.broker_addr, b.channel_node, b.channel_closed) for r in opened for b in r.heartbeats] == [
        (ADDR_A0, "127.0.0.1:1", False)]
    c.close()
    deadline = time.monotonic() + 5
    while len([m for m, _ in fake.calls if m == "Heartbeat"]) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    closed = [r for m, r in fake.calls if m == "Heartbeat"][1]
    assert [(b.broker_addr, b.channel_node, b.channel_closed) for b in closed.heartbeats] == [
        (ADDR_A0, "127.0.0.1:1", True)]


def test_322_bad_body_is_1(client: Client) -> None:
    resp, _ = client.call(322, QDV_EXT, b'{"counter":"many"}')
    assert resp["code"] == 1 and "counter" in resp["remark"]


# ---- topic and permission administration ------------------------------------------------------------

def test_205_and_327_report_counts(client: Client, fake: FakeNameServer) -> None:
    resp, _ = client.call(205, {"brokerName": "broker-a"})
    assert (resp["code"], resp["extFields"]) == (0, {"wipeTopicCount": "3"})
    resp, _ = client.call(327, {"brokerName": "broker-a"})
    assert (resp["code"], resp["extFields"]) == (0, {"addTopicCount": "2"})
    assert fake.only("WipeWritePerm") == fake.only("AddWritePerm") == api_pb2.BrokerPermRequest(broker_name="broker-a")


def test_216_delete_topic(client: Client, fake: FakeNameServer) -> None:
    resp, _ = client.call(216, {"topic": "T", "clusterName": "DefaultCluster"})
    assert resp["code"] == 0
    assert fake.only("DeleteTopic") == api_pb2.DeleteTopicRequest(topic="T", cluster_name="DefaultCluster")


def test_217_register_topic_reads_a_fastjson_route_body(client: Client, fake: FakeNameServer) -> None:
    resp, _ = client.call(217, {"topic": "T"}, FASTJSON_ROUTE, version=63)
    assert resp["code"] == 0
    assert fake.only("RegisterTopic") == api_pb2.RegisterTopicRequest(topic="T", queue_datas=[QUEUE_A])


def test_217_naming_an_unknown_broker_is_success_as_in_rocketmq(client: Client, fake: FakeNameServer) -> None:
    fake.fail["RegisterTopic"] = (grpc.StatusCode.INVALID_ARGUMENT,
                                  "queue_datas[0].broker_name: broker 'broker-a' is not registered")
    resp, _ = client.call(217, {"topic": "T"}, FASTJSON_ROUTE, version=63)
    assert resp["code"] == 0
    fake.fail["RegisterTopic"] = (grpc.StatusCode.INVALID_ARGUMENT, "topic: topic name must not be empty")
    resp, _ = client.call(217, {"topic": "T"}, FASTJSON_ROUTE, version=63)
    assert resp["code"] == 1  # any other refusal still says why


# ---- configuration, unknown codes -------------------------------------------------------------------

def test_318_update_config_writes_replicated_settings(client: Client, fake: FakeNameServer) -> None:
    resp, _ = client.call(318, None, b"# by mqadmin\norderMessageEnable=true\nenableTopicList : false\n")
    assert resp["code"] == 0
    assert dict(fake.only("UpdateSettings").settings) == {"orderMessageEnable": "true", "enableTopicList": "false"}
    resp, _ = client.call(318, None, b"")  # nothing to change: SUCCESS, as RocketMQ
    assert resp["code"] == 0 and len([m for m, _ in fake.calls if m == "UpdateSettings"]) == 1
    resp, _ = client.call(318, None, b"kvConfigPath=/tmp/x\n")  # RocketMQ's black list
    assert (resp["code"], resp["remark"]) == (16, "Can not update config in black list.")
    # RocketMQ's other keys, and keys it does not know, are accepted with a remark; only settings are written
    resp, _ = client.call(318, None, b"clientRequestThreadPoolNums=4\nlistenPort=9876\n")
    assert resp["code"] == 0 and len([m for m, _ in fake.calls if m == "UpdateSettings"]) == 1
    assert "no effect here: clientRequestThreadPoolNums" in resp["remark"] and "ignored" in resp["remark"]
    fake.fail["UpdateSettings"] = (grpc.StatusCode.INVALID_ARGUMENT, "settings: 'enableTopicList' takes true or false")
    resp, _ = client.call(318, None, b"enableTopicList=yes\n")
    assert resp["code"] == 1 and "enableTopicList" in resp["remark"]


def test_319_get_config_is_properties_text_without_secrets(client: Client, server: RemotingServer) -> None:
    resp, body = client.call(319)
    text = body.decode()
    assert resp["code"] == 0
    assert "remoting_addr=127.0.0.1:0\n" in text and "default_timeout_ms=120000\n" in text
    # the replicated settings, under RocketMQ's names, as the (fake) cluster holds them
    assert "orderMessageEnable=true\n" in text and "enableTopicList=false\n" in text
    assert "password" not in text and "secret" not in text
    assert all("=" in line for line in text.splitlines())


@pytest.mark.parametrize("code", [10, 34, 9999, -1])
def test_unknown_codes_are_3(client: Client, fake: FakeNameServer, code: int) -> None:
    resp, _ = client.call(code, {"topic": "T"})
    assert (resp["code"], resp["remark"]) == (3, f" request type {code} not supported")
    assert fake.calls == []


def _documented_codes() -> dict[int, str]:
    """docs/remoting.md's "Request codes" table: code -> RocketMQ's name (a row may hold several)."""
    with open(os.path.join(ROOT, "docs", "remoting.md")) as f:
        section = f.read().split("\n## Request codes\n", 1)[1].split("\n## ", 1)[0]
    out: dict[int, str] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("| ") and cells[0][:1].isdigit():
            numbers, names = cells[0].split(", "), cells[1].split(", ")
            assert len(numbers) == len(names), line
            out.update(zip(map(int, numbers), names, strict=True))
    return out


def test_every_documented_code_is_served_and_every_served_code_documented(server: RemotingServer) -> None:
    """The handler table (REQUESTS) against docs/remoting.md's table, by number and RocketMQ name."""
    documented = _documented_codes()
    assert set(REQUESTS) == set(documented) == set(server.handlers.supported_codes)
    assert all(getattr(codes, name) == code for code, name in documented.items()), documented
    assert set(INLINE_CODES) == {codes.GET_ROUTEINFO_BY_TOPIC}  # answered on the event loop (docs: "How it works")


def test_compressed_body_golden_bytes(client: Client, fake: FakeNameServer) -> None:
    # A compressed body written out field by field (RegisterBrokerBody.encode), not by the fake broker.
    raw = (struct.pack(">i", 46) + b'{"counter":3,"stateVersion":0,"timestamp":123}'
           + struct.pack(">i", 1) + struct.pack(">i", 26) + b"TopicZ 8 8 6 SINGLE_TAG {}"
           + struct.pack(">i", 2) + b"[]" + struct.pack(">i", 0))
    body = zlib.compress(raw)
    resp, _ = client.call(103, REGISTER_EXT | {"compressed": "true", "bodyCrc32": str(zlib.crc32(body) & 0x7FFFFFFF)},
                          body)
    assert resp["code"] == 0
    req = fake.only("RegisterBroker")
    assert (req.data_version.counter, req.data_version.timestamp) == (3, 123)
    assert [(t.topic_name, t.read_queue_nums, t.perm) for t in req.topics] == [("TopicZ", 8, 6)]


@pytest.mark.parametrize("value", ["9" * 70_000, "x" * 70_000])
def test_a_huge_number_field_is_quoted_short_in_the_remark(value: str) -> None:
    """A 70,000-digit brokerId was quoted whole in the remark: the reply's header passed its 64 KiB bound
    (found by the handlers' fuzz test)."""
    from nameserver.remoting.command import Command
    from nameserver.remoting.request import RequestError, int_field

    with pytest.raises(RequestError) as err:
        int_field(Command(code=codes.REGISTER_BROKER, ext_fields={"brokerId": value}), "brokerId")
    assert "<brokerId>" in str(err.value) and len(str(err.value)) < 300
