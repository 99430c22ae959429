"""A small fixed state, and valid requests for every NameServer method against it.

The atheris gRPC target serves each input over this state, and make_corpus.py writes these requests
as its seed corpus, so the fuzzer starts from inputs that get past validation.
"""

from __future__ import annotations

import functools

from google.protobuf.message import Message

from nameserver.pb import api_pb2, state_pb2
from nameserver.state import keys
from tests.fuzz.inprocess import Servicer, methods, replay

A, B = "10.0.0.1:10911", "10.0.0.2:10911"
# The gRPC target's input: one byte picking the method in this order, then the request bytes
# (RegisterBrokerStream: its chunks joined by STREAM_SEPARATOR).
METHOD_NAMES = sorted(methods())
STREAM_SEPARATOR = b"\xff\xfe"


def _register(name: str, addr: str, bid: int, topics: list[str], counter: int = 1) -> api_pb2.RegisterBrokerRequest:
    return api_pb2.RegisterBrokerRequest(
        cluster_name="c1", broker_name=name, broker_addr=addr, broker_id=bid, ha_server_addr=addr,
        data_version=state_pb2.DataVersion(counter=counter, timestamp=1_700_000_000_000),
        topics=[api_pb2.TopicConfig(topic_name=t, read_queue_nums=4, write_queue_nums=4, perm=6,
                                    topic_sys_flag=i % 3) for i, t in enumerate(topics)])


SETUP: list[tuple[str, Message]] = [
    ("RegisterBroker", _register("broker-a", A, 0, ["TopicA", "TopicB", "%RETRY%g1"])),
    ("RegisterBroker", _register("broker-a", B, 1, ["TopicA"])),
    ("RegisterBroker", _register("broker-b", "10.0.0.3:10911", 0, ["TopicA"])),
    ("PutKv", api_pb2.PutKvRequest(namespace="ORDER_TOPIC_CONFIG", key="TopicA", value="broker-a:4")),
    ("BindQueue", api_pb2.BindQueueRequest(topic="TopicA", queue_id=0, owner="consumer-1")),
]


@functools.cache
def seed_entries() -> list[tuple[int, bytes]]:
    svc = Servicer()
    for name, request in SETUP:
        out = svc.call(name, request)
        assert out.code.name == "OK", (name, out)
    return list(svc.node.entries)


def seed_requests() -> dict[str, list[Message | list[Message]]]:
    """Valid (mostly) requests per method; RegisterBrokerStream gets lists of chunks."""
    bind_version = replay(seed_entries()).kv.version(keys.bind_key("TopicA", 0))
    topics = [api_pb2.TopicConfig(topic_name=f"Big{i}", read_queue_nums=8, write_queue_nums=8, perm=6)
              for i in range(3)]
    stream_head = _register("broker-c", "10.0.0.5:10911", 0, [])
    return {
        "RegisterBroker": [_register("broker-a", A, 0, ["TopicA", "TopicC"], counter=2),
                           _register("broker-z", "[::1]:10911", 2, [])],
        "RegisterBrokerStream": [[api_pb2.RegisterBrokerChunk(header=stream_head),
                                  api_pb2.RegisterBrokerChunk(topics=api_pb2.TopicConfigs(topics=topics))]],
        "UnregisterBroker": [api_pb2.UnregisterBrokerRequest(cluster_name="c1", broker_name="broker-a",
                                                             broker_addr=B, broker_id=1)],
        "Heartbeat": [api_pb2.HeartbeatRequest(heartbeats=[api_pb2.BrokerHeartbeat(
            cluster_name="c1", broker_name="broker-a", broker_addr=A)])],
        "GetRoute": [api_pb2.GetRouteRequest(topic="TopicA"), api_pb2.GetRouteRequest(topic="Nope", zone_name="z")],
        "GetClusterInfo": [api_pb2.GetClusterInfoRequest(min_offset=1)],
        "GetTopicList": [api_pb2.GetTopicListRequest(kind=k, cluster_name="c1")
                         for k in api_pb2.TopicListKind.values()],
        "GetBrokerMemberGroup": [api_pb2.GetBrokerMemberGroupRequest(cluster_name="c1", broker_name="broker-a")],
        "PutKv": [api_pb2.PutKvRequest(namespace="ns", key="k/with/slash", value="v")],
        "GetKv": [api_pb2.GetKvRequest(namespace="ORDER_TOPIC_CONFIG", key="TopicA")],
        "DeleteKv": [api_pb2.DeleteKvRequest(namespace="ORDER_TOPIC_CONFIG", key="TopicA")],
        "ListKv": [api_pb2.ListKvRequest(namespace="ORDER_TOPIC_CONFIG")],
        "WipeWritePerm": [api_pb2.BrokerPermRequest(broker_name="broker-a")],
        "AddWritePerm": [api_pb2.BrokerPermRequest(broker_name="broker-b")],
        "RegisterTopic": [api_pb2.RegisterTopicRequest(topic="TopicR", queue_datas=[state_pb2.QueueData(
            broker_name="broker-b", read_queue_nums=2, write_queue_nums=2, perm=6)])],
        "DeleteTopic": [api_pb2.DeleteTopicRequest(topic="TopicB"),
                        api_pb2.DeleteTopicRequest(topic="TopicA", cluster_name="c1")],
        "BindQueue": [api_pb2.BindQueueRequest(topic="TopicA", queue_id=0, owner="consumer-2",
                                               expected_version=bind_version),
                      api_pb2.BindQueueRequest(topic="TopicA", queue_id=3, owner="consumer-2")],
        "ReleaseQueue": [api_pb2.ReleaseQueueRequest(topic="TopicA", queue_id=0, expected_version=bind_version)],
        "GetBinding": [api_pb2.GetBindingRequest(topic="TopicA", queue_id=0, consistency=api_pb2.SERIALIZABLE)],
        "ListBindings": [api_pb2.ListBindingsRequest(topic="TopicA")],
    }
