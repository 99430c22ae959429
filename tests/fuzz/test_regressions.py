"""Regression tests for the bugs the fuzzers found, one per bug, each with what went wrong.

All run without a cluster: the real code paths over in-memory fakes, or an in-process gRPC server.
"""

from __future__ import annotations

from concurrent import futures
from typing import Any

import grpc
import pytest

from nameserver import validation
from nameserver.api import rpc
from nameserver.api.adminservice import AdminService
from nameserver.api.service import NameServerService
from nameserver.core.forwarder import LeaderForwarder
from nameserver.pb import api_pb2, api_pb2_grpc
from nameserver.remoting import bodies, codes, header, registerbody
from nameserver.remoting.bodies import BodyError
from nameserver.remoting.command import Command, FrameError
from tests.fuzz import remotingharness, statecheck
from tests.fuzz.inprocess import Aborted, FakeContext, LocalNode, Servicer

# ---- remoting decoders ------------------------------------------------------------------------------


@pytest.mark.parametrize("deep", [b"[" * 5000 + b"]" * 5000, b'{"a":' * 5000 + b"1" + b"}" * 5000])
def test_json_nested_past_the_recursion_limit_is_a_decode_error(deep: bytes) -> None:
    # Bug: json.loads raised RecursionError, which neither the remoting server (FrameError) nor the
    # handlers (BodyError) catch: the connection task died with a traceback, or the request got
    # "internal error". Found by test_remoting_props (NASTY_JSON) and the remoting_frame target.
    with pytest.raises(FrameError, match="nested too deeply"):
        header.decode_json(b'{"code":105,"extFields":{"topic":' + deep + b"}}")
    with pytest.raises(BodyError, match="nested too deeply"):
        registerbody.decode(deep, compressed=False)


def test_lone_surrogate_escape_is_a_decode_error() -> None:
    # Bug: "\ud800" in a JSON header or body decoded to a Python string no UTF-8 encoder accepts; the
    # UnicodeEncodeError surfaced later, building the gRPC request (handlers) or writing the response.
    with pytest.raises(FrameError, match="lone surrogate"):
        header.decode_json(b'{"code":105,"extFields":{"topic":"\\ud800"}}')
    with pytest.raises(BodyError, match="lone surrogate"):
        bodies.parse_queue_datas(b'{"queueDatas":[{"brokerName":"a\\udfffb"}]}')
    ok = header.decode_json(b'{"code":105,"remark":"\\ud83d\\ude00"}')  # a surrogate pair is a character
    assert ok.remark == "\U0001f600"


def test_integers_beyond_the_java_type_are_body_errors() -> None:
    # Bug: readQueueNums 2^31 or a DataVersion counter 2^63 passed the body parser and then made
    # protobuf raise ValueError ("Value out of range"), which the handlers do not catch.
    with pytest.raises(BodyError, match="out of range"):
        registerbody.decode(b'{"topicConfigTable":{"T":{"readQueueNums":2147483648}}}', compressed=False)
    with pytest.raises(BodyError, match="out of range"):
        bodies.parse_data_version({"counter": 1 << 63})
    assert bodies.parse_data_version({"counter": (1 << 63) - 1}).counter == (1 << 63) - 1


def test_ext_field_integer_beyond_a_long_answers_system_error() -> None:
    # Bug: brokerId "9223372036854775808" reached the protobuf request and raised ValueError out of
    # Handlers.handle: the server logged a traceback and answered "internal error: ...".
    h = remotingharness.handlers()
    req = Command(code=codes.UNREGISTER_BROKER, opaque=9, ext_fields={
        "clusterName": "c1", "brokerName": "b", "brokerAddr": "10.0.0.1:10911", "brokerId": str(1 << 63)})
    resp = h.handle(req)
    assert (resp.code, resp.remark) == (codes.SYSTEM_ERROR, f"the custom field <brokerId> is out of range: {1 << 63}")


# ---- validation and the state -----------------------------------------------------------------------


def test_kv_key_no_snapshot_could_hold_is_refused() -> None:
    # Bug: keys up to 4096 bytes were accepted, but LMDB keys hold 511 bytes: after one PutKv with a
    # 600-byte key ("kv/ns/" + key), every snapshot on every node failed from then on. Found by the
    # oversized-key check of test_state_props and the grpc_requests target.
    limit = statecheck.snapshot_max_key()
    room = limit - len("kv/ns/")
    with pytest.raises(validation.TooLargeError) as err:
        validation.validate_put_kv(api_pb2.PutKvRequest(namespace="ns", key="é" * 300))
    assert err.value.field == "key"
    with pytest.raises(validation.ValidationError) as err2:
        validation.validate_put_kv(api_pb2.PutKvRequest(namespace="é" * 200, key="k"))
    assert err2.value.field == "namespace"
    svc = Servicer()  # the longest key still accepted fits a real snapshot
    assert svc.call("PutKv", api_pb2.PutKvRequest(namespace="ns", key="k" * room, value="v")).code == grpc.StatusCode.OK
    assert svc.call("PutKv", api_pb2.PutKvRequest(namespace="ns", key="k" * (room + 1))).code == \
        grpc.StatusCode.RESOURCE_EXHAUSTED
    assert statecheck.reads(statecheck.restored_from_lmdb(svc.node.state)) == statecheck.reads(svc.node.state)


@pytest.mark.parametrize("consistency", [api_pb2.LINEARIZABLE, api_pb2.SERIALIZABLE])
def test_negative_min_offset_is_refused_before_any_read_index(consistency: int) -> None:
    # Bug: GetBinding/ListBindings with a negative min_offset answered OK when LINEARIZABLE (the read
    # index masked it), INVALID_ARGUMENT when SERIALIZABLE, and in the first case paid a barrier
    # entry in the Raft log for it.
    svc = Servicer()
    for method, req in (("GetBinding", api_pb2.GetBindingRequest(topic="T", min_offset=-1, consistency=consistency)),
                        ("ListBindings", api_pb2.ListBindingsRequest(topic="T", min_offset=-1,
                                                                     consistency=consistency))):
        out = svc.call(method, req)
        assert (out.code, out.details) == (grpc.StatusCode.INVALID_ARGUMENT, "min_offset: must be >= 0")
    assert svc.node.entries == []


# ---- TransferLeadership -----------------------------------------------------------------------------


class _Log:
    def __init__(self) -> None:
        self.transfers: list[str | None] = []
        self.leading = True

    def is_leader(self) -> bool:
        return self.leading

    def members(self) -> list[str]:
        return ["10.0.0.1:1", "10.0.0.2:1", "10.0.0.3:1"]

    def transfer_leadership(self, addr: str | None, timeout: float) -> None:
        self.transfers.append(addr)
        self.leading = False

    def leader(self) -> str:
        return "10.0.0.2:1"


class _Node:
    def __init__(self) -> None:
        self.log = _Log()
        self.cfg = LocalNode().cfg
        self.cfg.raft_addr = "10.0.0.1:1"
        self.forwarder = LeaderForwarder(self.cfg, self.log.leader, self.log.is_leader, lambda _: None)


def _transfer(node_id: str) -> tuple[grpc.StatusCode, Any, list]:
    node = _Node()
    try:
        reply = AdminService(node).TransferLeadership(  # type: ignore[arg-type]
            api_pb2.TransferLeadershipRequest(node_id=node_id), FakeContext())
    except Aborted as exc:
        return exc.code, exc.details, node.log.transfers
    return grpc.StatusCode.OK, reply, node.log.transfers


def test_transfer_leadership_to_a_non_member_is_failed_precondition() -> None:
    # Bug: Raft refuses an unknown target with the same code as "busy", which the service answered
    # UNAVAILABLE ("another change in progress"): clients retried a request that can never succeed.
    code, details, transfers = _transfer("10.9.9.9:1")
    assert (code, details, transfers) == (grpc.StatusCode.FAILED_PRECONDITION, "10.9.9.9:1 is not a member", [])


def test_transfer_leadership_to_the_leader_itself_is_a_no_op() -> None:
    # Bug: same refusal (UNAVAILABLE, retry forever) when the target was already the leader.
    code, reply, transfers = _transfer("10.0.0.1:1")
    assert (code, reply.leader_id, transfers) == (grpc.StatusCode.OK, "10.0.0.1:1", [])
    code, reply, transfers = _transfer("10.0.0.2:1")
    assert (code, reply.leader_id, transfers) == (grpc.StatusCode.OK, "10.0.0.2:1", ["10.0.0.2:1"])


# ---- undecodable request bytes ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def guarded_server() -> Any:
    """The real NameServerService over an in-memory node, behind DecodeGuard, on a loopback port."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), interceptors=[rpc.DecodeGuard()])
    api_pb2_grpc.add_NameServerServicer_to_server(NameServerService(LocalNode()), server)  # type: ignore[arg-type]
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield channel
    channel.close()
    server.stop(0).wait()


@pytest.mark.parametrize("kind", ["unary", "client_stream", "server_stream"])
def test_undecodable_request_is_invalid_argument(guarded_server: grpc.Channel, kind: str) -> None:
    # Bug: bytes that do not parse as the request type made gRPC answer INTERNAL ("Exception
    # deserializing request!") and log an ERROR traceback per call. Found by test_garbage_bytes.
    garbage = b"\x0a\x05ab"  # a string field claiming 5 bytes, with 2
    ns = "/rip18.nameserver.v1.NameServer/"
    with pytest.raises(grpc.RpcError) as err:
        if kind == "unary":
            guarded_server.unary_unary(ns + "GetRoute")(garbage, timeout=5)
        elif kind == "client_stream":
            guarded_server.stream_unary(ns + "RegisterBrokerStream")(iter([garbage]), timeout=5)
        else:
            list(guarded_server.unary_stream(ns + "Watch")(garbage, timeout=5))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith("request: not a valid ")
    # and a good request on the same server still works
    reply = api_pb2_grpc.NameServerStub(guarded_server).GetClusterInfo(api_pb2.GetClusterInfoRequest(), timeout=5)
    assert reply.apply_offset == 0


def test_error_detail_for_a_huge_value_stays_small(guarded_server: grpc.Channel) -> None:
    # Bug: validation quoted the whole bad value. An address of 70,000 control characters made a
    # detail bigger than gRPC's 16 KiB metadata limit: the client got RESOURCE_EXHAUSTED "Stream
    # removed (received metadata size exceeds hard limit)" instead of INVALID_ARGUMENT naming the
    # field. Found by test_transfer_leadership in the long profile.
    with pytest.raises(validation.ValidationError) as err:
        validation.check_addr("node_id", "\x1f" * 70_000)
    assert len(str(err.value)) < 400 and "(70000 characters)" in str(err.value)
    stub = api_pb2_grpc.NameServerStub(guarded_server)
    with pytest.raises(grpc.RpcError) as rpc_err:
        stub.Heartbeat(api_pb2.HeartbeatRequest(heartbeats=[api_pb2.BrokerHeartbeat(broker_addr="\x1f" * 70_000)]),
                       timeout=5)
    assert rpc_err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert rpc_err.value.details().startswith("heartbeats[0].broker_addr: address ")


def test_ipv6_scope_id_is_bounded() -> None:
    # Bug: Python's IPv6Address accepts a scope ID of any length and content, so a broker address
    # "[fe80::1%<600 characters>]:10911" passed validation and its live/<addr> key was too long for
    # every later snapshot (the same failure as the long KV key).
    svc = Servicer()
    addr = "[fe80::1%" + "a" * 600 + "]:10911"
    out = svc.call("RegisterBroker", api_pb2.RegisterBrokerRequest(
        cluster_name="c1", broker_name="b", broker_addr=addr, broker_id=0))
    assert out.code == grpc.StatusCode.INVALID_ARGUMENT and out.details.startswith("broker_addr: ")
    assert svc.node.entries == []
    validation.check_addr("broker_addr", "[fe80::1%eth0]:10911")  # an interface name is still fine


@pytest.mark.parametrize("method, request_, field", [
    ("GetRoute", api_pb2.GetRouteRequest(topic="T", zone_name="z" * (validation.MAX_NAME_BYTES + 1)), "zone_name"),
    ("GetTopicList", api_pb2.GetTopicListRequest(kind=99), "kind"),
    ("GetBrokerMemberGroup", api_pb2.GetBrokerMemberGroupRequest(
        broker_name="b", cluster_name="c" * (validation.MAX_NAME_BYTES + 1)), "cluster_name"),
])
def test_the_live_path_runs_the_request_validators(method: str, request_: Any, field: str) -> None:
    """The service validates with the same per-request validators the tests exercise (once, GetRoute
    never checked zone_name and an unknown topic-list kind read as an empty list)."""
    out = Servicer().call(method, request_)
    assert out.code == grpc.StatusCode.INVALID_ARGUMENT and out.details.startswith(f"{field}:"), out
