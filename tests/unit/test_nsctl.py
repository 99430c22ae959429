"""nsctl against in-process fake NameServer/Admin servicers that record requests and return canned replies."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest

from nameserver.chunking import register_chunks
from nameserver.cli import nsctl, render
from nameserver.pb import api_pb2, api_pb2_grpc, state_pb2

DIGEST = "0123456789abcdef0123456789abcdef"
Capsys = pytest.CaptureFixture[str]


class FakeNameServer(api_pb2_grpc.NameServerServicer):
    """Records (method, request) pairs; `fail` maps a method to a status code to abort with."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.fail: dict[str, grpc.StatusCode] = {}
        self.delay: dict[str, float] = {}  # seconds to stall before answering (deadline tests)
        self.kv: dict[tuple[str, str], str] = {}
        self.offset = 100

    def _record(self, method: str, request: Any, context: grpc.ServicerContext) -> None:
        self.calls.append((method, request))
        time.sleep(self.delay.get(method, 0.0))
        if method in self.fail:
            context.abort(self.fail[method], f"fake {method} failure")

    def methods(self) -> list[str]:
        return [method for method, _ in self.calls]

    def _write(self, records: int) -> api_pb2.WriteReply:
        self.offset += 1
        return api_pb2.WriteReply(offset=self.offset, records=records)

    def UpdateSettings(self, request: Any, context: grpc.ServicerContext) -> api_pb2.WriteReply:
        self._record("UpdateSettings", request, context)
        return self._write(len(request.settings))

    def GetSettings(self, request: Any, context: grpc.ServicerContext) -> api_pb2.GetSettingsReply:
        self._record("GetSettings", request, context)
        return api_pb2.GetSettingsReply(settings={"orderMessageEnable": True, "enableTopicList": True},
                                        stored=["orderMessageEnable"], apply_offset=12)

    def RegisterBroker(self, request: Any, context: grpc.ServicerContext) -> api_pb2.RegisterBrokerReply:
        self._record("RegisterBroker", request, context)
        return api_pb2.RegisterBrokerReply(offset=7, records=len(request.topics) + 2)

    def RegisterBrokerStream(
        self, request_iterator: Iterator[api_pb2.RegisterBrokerChunk], context: grpc.ServicerContext
    ) -> api_pb2.RegisterBrokerReply:
        chunks = list(request_iterator)
        self._record("RegisterBrokerStream", chunks, context)
        topics = sum(len(c.topics.topics) for c in chunks)
        return api_pb2.RegisterBrokerReply(offset=8, records=topics + 2)

    def Heartbeat(self, request: Any, context: grpc.ServicerContext) -> api_pb2.HeartbeatReply:
        self._record("Heartbeat", request, context)
        unknown = [hb.broker_addr for hb in request.heartbeats if hb.broker_name == "ghost"]
        return api_pb2.HeartbeatReply(unknown_addrs=unknown)

    def GetRoute(self, request: Any, context: grpc.ServicerContext) -> api_pb2.GetRouteReply:
        self._record("GetRoute", request, context)
        if request.topic != "TopicA":
            context.abort(grpc.StatusCode.NOT_FOUND, f"no route for {request.topic}")
        route = api_pb2.TopicRoute(
            queue_datas=[
                state_pb2.QueueData(broker_name="broker-a", read_queue_nums=4, write_queue_nums=4, perm=6)
            ],
            broker_datas=[
                state_pb2.BrokerData(
                    cluster="DefaultCluster",
                    broker_name="broker-a",
                    addrs=[state_pb2.BrokerAddr(broker_id=0, addr="10.0.0.1:10911")],
                )
            ],
        )
        return api_pb2.GetRouteReply(route=route, apply_offset=42)

    def GetClusterInfo(self, request: Any, context: grpc.ServicerContext) -> api_pb2.GetClusterInfoReply:
        self._record("GetClusterInfo", request, context)
        data = state_pb2.BrokerData(
            cluster="c1",
            broker_name="b1",
            addrs=[
                state_pb2.BrokerAddr(broker_id=1, addr="10.0.0.2:10911"),
                state_pb2.BrokerAddr(broker_id=0, addr="10.0.0.1:10911"),
            ],
        )
        return api_pb2.GetClusterInfoReply(
            broker_addr_table={"b1": data},
            cluster_addr_table={"c1": api_pb2.BrokerNames(names=["b1"])},
            apply_offset=9,
        )

    def GetTopicList(self, request: Any, context: grpc.ServicerContext) -> api_pb2.GetTopicListReply:
        self._record("GetTopicList", request, context)
        return api_pb2.GetTopicListReply(topics=["t1", "t2"], apply_offset=11)

    def PutKv(self, request: Any, context: grpc.ServicerContext) -> api_pb2.WriteReply:
        self._record("PutKv", request, context)
        self.kv[(request.namespace, request.key)] = request.value
        return self._write(1)

    def GetKv(self, request: Any, context: grpc.ServicerContext) -> api_pb2.GetKvReply:
        self._record("GetKv", request, context)
        value = self.kv.get((request.namespace, request.key))
        if value is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no key {request.namespace}/{request.key}")
        return api_pb2.GetKvReply(value=value, apply_offset=self.offset)

    def DeleteKv(self, request: Any, context: grpc.ServicerContext) -> api_pb2.WriteReply:
        self._record("DeleteKv", request, context)
        existed = self.kv.pop((request.namespace, request.key), None) is not None
        return self._write(1 if existed else 0)

    def ListKv(self, request: Any, context: grpc.ServicerContext) -> api_pb2.ListKvReply:
        self._record("ListKv", request, context)
        table = {k: v for (ns, k), v in self.kv.items() if ns == request.namespace}
        return api_pb2.ListKvReply(table=table, apply_offset=self.offset)

    def WipeWritePerm(self, request: Any, context: grpc.ServicerContext) -> api_pb2.BrokerPermReply:
        self._record("WipeWritePerm", request, context)
        return api_pb2.BrokerPermReply(topic_count=3, offset=55)

    def RegisterTopic(self, request: Any, context: grpc.ServicerContext) -> api_pb2.WriteReply:
        self._record("RegisterTopic", request, context)
        return self._write(len(request.queue_datas))


class FakeAdmin(api_pb2_grpc.AdminServicer):
    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.calls: list[str] = []
        self.groups: list[api_pb2.NodeStatus] = []  # a sharded node's: each group core's status

    def Status(self, request: Any, context: grpc.ServicerContext) -> api_pb2.NodeStatus:
        self.calls.append("Status")
        return api_pb2.NodeStatus(
            groups=self.groups,
            node_id=self.node_id,
            grpc_addr="127.0.0.1:9101",
            role=api_pb2.ROLE_LEADER,
            leader_id=self.node_id,
            term=3,
            end_offset=120,
            commit_offset=119,
            apply_offset=118,
            digest=DIGEST,
            ready=True,
            keys=5_000_000_000,  # past 2**32: proves the int64 round trip
            has_quorum=True,
        )

    def Members(self, request: Any, context: grpc.ServicerContext) -> api_pb2.MembersReply:
        self.calls.append("Members")
        return api_pb2.MembersReply(
            members=[
                api_pb2.Member(
                    node_id=self.node_id, grpc_addr="g1", is_self=True, is_leader=True, connected=True
                ),
                api_pb2.Member(node_id="n2:7001", grpc_addr="g2", connected=False, match_offset=2**33),
            ]
        )

    def TakeSnapshot(self, request: Any, context: grpc.ServicerContext) -> api_pb2.TakeSnapshotReply:
        self.calls.append("TakeSnapshot")
        return api_pb2.TakeSnapshotReply(offset=118)


class FakeNode:
    def __init__(self, name: str) -> None:
        self.ns = FakeNameServer()
        self.admin = FakeAdmin(name)
        self.server = grpc.server(ThreadPoolExecutor(max_workers=4))
        api_pb2_grpc.add_NameServerServicer_to_server(self.ns, self.server)
        api_pb2_grpc.add_AdminServicer_to_server(self.admin, self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.endpoint = f"127.0.0.1:{port}"
        self.server.start()


MakeNode = Callable[[str], FakeNode]


@pytest.fixture
def make_node() -> Iterator[Callable[[str], FakeNode]]:
    nodes: list[FakeNode] = []

    def make(name: str = "127.0.0.1:7001") -> FakeNode:
        node = FakeNode(name)
        nodes.append(node)
        return node

    yield make
    for node in nodes:
        node.server.stop(0)


@pytest.fixture
def node(make_node: MakeNode) -> FakeNode:
    return make_node("127.0.0.1:7001")


@pytest.fixture
def dead_endpoint() -> str:
    """An address nothing listens on: the connection is refused (UNAVAILABLE)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"127.0.0.1:{port}"


def run(capsys: Capsys, endpoints: str, *args: str) -> tuple[int, str, str]:
    code = nsctl.main(["--endpoints", endpoints, "--timeout", "5", *args])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


# ---- status ----


def test_status_with_one_unreachable_endpoint(capsys: Capsys, node: FakeNode, dead_endpoint: str) -> None:
    code, out, err = run(capsys, f"{node.endpoint},{dead_endpoint}", "--json", "status")
    assert code == 1
    nodes = json.loads(out)["nodes"]
    assert len(nodes) == 2
    up, down = nodes
    assert up["node_id"] == "127.0.0.1:7001"
    assert up["endpoint"] == node.endpoint
    assert up["role"] == "leader"
    assert up["digest"] == DIGEST
    assert up["keys"] == 5_000_000_000 and isinstance(up["keys"], int)
    for field in ("term", "end_offset", "commit_offset", "apply_offset", "snapshot_offset"):
        assert isinstance(up[field], int) and not isinstance(up[field], bool), field
    assert (up["end_offset"], up["commit_offset"], up["apply_offset"]) == (120, 119, 118)
    assert up["ready"] is True and up["has_quorum"] is True
    assert set(down) == {"endpoint", "error"}
    assert down["endpoint"] == dead_endpoint
    assert down["error"].startswith("UNAVAILABLE")


def test_status_table_shortens_digest_and_exits_zero(capsys: Capsys, make_node: MakeNode) -> None:
    a, b = make_node("n1:7001"), make_node("n2:7001")
    code, out, _ = run(capsys, f"{a.endpoint},{b.endpoint}", "status")
    assert code == 0
    assert DIGEST[:12] in out and DIGEST not in out
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["NODE", "GRPC", "ADDR"]
    assert [line.split()[0] for line in lines[1:]] == ["n1:7001", "n2:7001"]
    assert a.admin.calls == ["Status"] and b.admin.calls == ["Status"]


def test_status_table_marks_unreachable_row(capsys: Capsys, node: FakeNode, dead_endpoint: str) -> None:
    code, out, err = run(capsys, f"{dead_endpoint},{node.endpoint}", "status")
    assert code == 1
    row = next(line for line in out.splitlines() if dead_endpoint in line)
    assert "unreachable (UNAVAILABLE)" in row
    assert err.startswith("error: UNAVAILABLE: ")


def _group_core(raft_addr: str, role: int, leader: str, apply_offset: int, digest: str) -> api_pb2.NodeStatus:
    return api_pb2.NodeStatus(node_id=raft_addr, grpc_addr="127.0.0.1:9101", role=role, leader_grpc_addr=leader,
                              term=2, apply_offset=apply_offset, commit_offset=apply_offset, digest=digest, ready=True)


def test_status_of_a_sharded_node_has_a_row_per_group_core(capsys: Capsys, make_node: MakeNode,
                                                            dead_endpoint: str) -> None:
    """Admin.Status's `groups` (a sharded node's workers fill it): a GROUP column, a row per group core; a core
    that did not answer is listed not ready with its reason; digests are compared within a group."""
    a, b = make_node("n1:7001"), make_node("n2:7001")
    a.admin.groups = [_group_core("n1:7001", api_pb2.ROLE_LEADER, "a:9101", 118, "0" * 64),
                      _group_core("n1:7101", api_pb2.ROLE_FOLLOWER, "b:9101", 7, "1" * 64)]
    b.admin.groups = [_group_core("n2:7001", api_pb2.ROLE_FOLLOWER, "a:9101", 118, "0" * 64),
                      api_pb2.NodeStatus(node_id="n2:7101", not_ready_reason="group 1's core did not answer: x")]
    code, out, err = run(capsys, f"{a.endpoint},{b.endpoint},{dead_endpoint}", "status")
    lines = out.splitlines()
    assert code == 1
    assert lines[0].split()[:6] == ["NODE", "GRPC", "ADDR", "GROUP", "ROLE", "LEADER"]
    assert [line.split()[:5] for line in lines[1:5]] == [
        ["n1:7001", "127.0.0.1:9101", "0", "leader", "a:9101"],
        ["n1:7101", "127.0.0.1:9101", "1", "follower", "b:9101"],
        ["n2:7001", "127.0.0.1:9101", "0", "follower", "a:9101"],
        ["n2:7101", "127.0.0.1:9101", "1", "unknown", "-"]]
    assert lines[5].split()[:4] == ["-", dead_endpoint, "-", "unreachable"]
    assert "127.0.0.1:9101: group 1's core did not answer: x" in lines
    assert "digests differ" not in err  # group 1's cores are at different offsets; group 0's agree
    code, out, _ = run(capsys, f"{a.endpoint}", "--json", "status")
    [doc] = json.loads(out)["nodes"]
    assert [(g["node_id"], g["role"]) for g in doc["groups"]] == [("n1:7001", "leader"), ("n1:7101", "follower")]
    b.admin.groups[1] = _group_core("n2:7101", api_pb2.ROLE_FOLLOWER, "b:9101", 7, "2" * 64)
    _, _, err = run(capsys, f"{a.endpoint},{b.endpoint}", "status")
    assert f"warning: digests differ at group 1's apply offset 7: {['1' * 64, '2' * 64]}" in err


# ---- failover and errors ----


def test_failover_to_second_endpoint(capsys: Capsys, node: FakeNode, dead_endpoint: str) -> None:
    node.ns.kv[("ns", "k")] = "v1"
    code, out, _ = run(capsys, f"{dead_endpoint},{node.endpoint}", "kv", "get", "ns", "k")
    assert code == 0
    assert out.splitlines() == ["v1", f"served at apply offset {node.ns.offset}"]
    assert node.ns.methods() == ["GetKv"]


def test_non_retryable_error_is_final(capsys: Capsys, make_node: MakeNode) -> None:
    first, second = make_node("n1"), make_node("n2")
    first.ns.fail["PutKv"] = grpc.StatusCode.PERMISSION_DENIED
    code, out, err = run(capsys, f"{first.endpoint},{second.endpoint}", "kv", "put", "ns", "k", "v")
    assert code == 1
    assert out == ""
    assert err.strip() == "error: PERMISSION_DENIED: fake PutKv failure"
    assert second.ns.calls == []


def test_retryable_server_error_moves_on(capsys: Capsys, make_node: MakeNode) -> None:
    first, second = make_node("n1"), make_node("n2")
    first.ns.fail["PutKv"] = grpc.StatusCode.UNAVAILABLE  # e.g. a node that is not ready yet
    code, _, _ = run(capsys, f"{first.endpoint},{second.endpoint}", "kv", "put", "ns", "k", "v")
    assert code == 0
    assert first.ns.methods() == ["PutKv"] and second.ns.methods() == ["PutKv"]


def test_deadline_exceeded_moves_on(capsys: Capsys, make_node: MakeNode) -> None:
    slow, fast = make_node("n1"), make_node("n2")
    slow.ns.delay["GetTopicList"] = 3.0  # e.g. a paused node
    started = time.monotonic()
    code = nsctl.main(["--endpoints", f"{slow.endpoint},{fast.endpoint}", "--timeout", "1.0", "topics"])
    # The slow node had half of the 1 s, the fast one the rest: well before the slow node's 3 s answer
    # (not "< 1.0": a loaded machine took 1.29 s of wall time for the same calls)
    assert time.monotonic() - started < 2.5
    assert code == 0
    assert fast.ns.methods() == ["GetTopicList"]
    assert capsys.readouterr().out.splitlines()[-1] == "2 topics, served at apply offset 11"


def test_all_endpoints_down(capsys: Capsys, dead_endpoint: str) -> None:
    # Passes over the endpoints repeat until --timeout; 1 s (the later --timeout wins) is several passes.
    code, out, err = run(capsys, dead_endpoint, "--timeout", "1", "topics")
    assert code == 1
    assert out == ""
    assert err.startswith("error: UNAVAILABLE: no endpoint answered")
    assert dead_endpoint in err


def test_endpoints_from_environment(capsys: Capsys, monkeypatch: pytest.MonkeyPatch, node: FakeNode) -> None:
    monkeypatch.setenv(nsctl.ENDPOINTS_ENV, node.endpoint)
    assert nsctl.main(["topics"]) == 0
    assert node.ns.methods() == ["GetTopicList"]


def test_usage_errors_exit_2(capsys: Capsys, node: FakeNode) -> None:
    assert run(capsys, node.endpoint, "topics", "--kind", "cluster")[0] == 2
    assert run(capsys, node.endpoint, "no-such-command")[0] == 2
    assert run(capsys, node.endpoint, "broker", "register", "--cluster", "c")[0] == 2
    assert node.ns.calls == []


def test_members_json_and_table(capsys: Capsys, node: FakeNode) -> None:
    code, out, _ = run(capsys, node.endpoint, "members", "--json")
    assert code == 0
    members = json.loads(out)["members"]
    assert [m["node_id"] for m in members] == ["127.0.0.1:7001", "n2:7001"]
    assert members[1]["match_offset"] == 2**33 and members[1]["connected"] is False
    code, out, _ = run(capsys, node.endpoint, "members")
    assert code == 0
    assert out.splitlines()[1].split() == ["127.0.0.1:7001", "g1", "yes", "yes", "yes", "0"]
    assert out.splitlines()[-1] == f"answered by {node.endpoint}"


# ---- reads ----


def test_route_not_found(capsys: Capsys, node: FakeNode) -> None:
    code, out, err = run(capsys, node.endpoint, "route", "Missing")
    assert code == 1
    assert out == ""
    assert "topic Missing not found" in err
    assert err.startswith("error: NOT_FOUND: ")


def test_route_tables_and_request_fields(capsys: Capsys, node: FakeNode) -> None:
    code, out, _ = run(capsys, node.endpoint, "route", "TopicA", "--min-offset", "40", "--zone", "z1")
    assert code == 0
    ((method, request),) = node.ns.calls
    assert (method, request.topic, request.min_offset, request.zone_name) == ("GetRoute", "TopicA", 40, "z1")
    assert "queue datas:" in out and "broker datas:" in out
    assert "10.0.0.1:10911" in out and "6 (RW)" in out
    assert out.splitlines()[-1] == "served at apply offset 42"


def test_route_json_has_ints(capsys: Capsys, node: FakeNode) -> None:
    code, out, _ = run(capsys, node.endpoint, "route", "TopicA", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["apply_offset"] == 42
    addr = data["route"]["broker_datas"][0]["addrs"][0]
    assert addr == {"broker_id": 0, "addr": "10.0.0.1:10911"}
    assert data["route"]["queue_datas"][0]["perm"] == 6
    assert list(data) == sorted(data)  # sorted keys


def test_clusters_table_sorted_by_broker_id(capsys: Capsys, node: FakeNode) -> None:
    code, out, _ = run(capsys, node.endpoint, "clusters")
    assert code == 0
    rows = [line.split() for line in out.splitlines()[1:-1]]
    assert rows == [["c1", "b1", "0", "10.0.0.1:10911"], ["c1", "b1", "1", "10.0.0.2:10911"]]
    assert out.splitlines()[-1] == "served at apply offset 9"


def test_topics_cluster_implies_kind(capsys: Capsys, node: FakeNode) -> None:
    code, out, _ = run(capsys, node.endpoint, "topics", "--cluster", "c1")
    assert code == 0
    ((_, request),) = node.ns.calls
    assert request.kind == api_pb2.TOPIC_LIST_BY_CLUSTER and request.cluster_name == "c1"
    assert out.splitlines() == ["t1", "t2", "2 topics, served at apply offset 11"]


# ---- settings ----


def test_settings_set_and_get(capsys: Capsys, node: FakeNode) -> None:
    code, out, _ = run(capsys, node.endpoint, "settings", "set", "orderMessageEnable=true", "enableTopicList = false")
    assert code == 0 and out.strip() == "offset 101 (2 records)"
    ((_, request),) = node.ns.calls
    assert dict(request.settings) == {"orderMessageEnable": "true", "enableTopicList": "false"}
    code, out, _ = run(capsys, node.endpoint, "settings", "get")
    assert code == 0
    assert [ln.split() for ln in out.splitlines()[1:3]] == [["enableTopicList", "true", "default"],
                                                             ["orderMessageEnable", "true", "log"]]
    assert out.splitlines()[-1] == "served at apply offset 12"


# ---- kv ----


def test_kv_round_trip(capsys: Capsys, node: FakeNode) -> None:
    ep = node.endpoint
    assert run(capsys, ep, "kv", "put", "ORDER_TOPIC_CONFIG", "TopicA", "broker-a:4")[1].strip() == (
        "offset 101 (1 record)"
    )
    got = run(capsys, ep, "kv", "get", "ORDER_TOPIC_CONFIG", "TopicA")[1]
    assert got.splitlines()[0] == "broker-a:4"
    listed = run(capsys, ep, "kv", "list", "ORDER_TOPIC_CONFIG")[1]
    assert "TopicA  broker-a:4" in listed
    deleted = run(capsys, ep, "kv", "delete", "ORDER_TOPIC_CONFIG", "TopicA")[1]
    assert deleted.strip() == "offset 102 (1 record)"
    code, _, err = run(capsys, ep, "kv", "get", "ORDER_TOPIC_CONFIG", "TopicA")
    assert code == 1 and err.startswith("error: NOT_FOUND: ")

    methods = node.ns.methods()
    assert methods == ["PutKv", "GetKv", "ListKv", "DeleteKv", "GetKv"]
    put, get, listing, delete = (request for _, request in node.ns.calls[:4])
    assert (put.namespace, put.key, put.value) == ("ORDER_TOPIC_CONFIG", "TopicA", "broker-a:4")
    assert (get.namespace, get.key) == ("ORDER_TOPIC_CONFIG", "TopicA")
    assert listing.namespace == "ORDER_TOPIC_CONFIG"
    assert (delete.namespace, delete.key) == ("ORDER_TOPIC_CONFIG", "TopicA")


def test_write_json_is_reply_with_ints(capsys: Capsys, node: FakeNode) -> None:
    code, out, _ = run(capsys, node.endpoint, "kv", "put", "ns", "k", "v", "--json")
    assert code == 0
    assert json.loads(out) == {"offset": 101, "records": 1}


# ---- broker registration ----


def register_args(*extra: str) -> list[str]:
    return ["broker", "register", "--cluster", "c1", "--name", "broker-a", "--addr", "10.0.0.1:10911", *extra]


def test_register_70000_topics_streams_in_5000_topic_chunks(capsys: Capsys, node: FakeNode) -> None:
    # Realistic topic names (~40 bytes) put 70,000 topics past the 3 MiB unary limit.
    prefix = "benchmark-topic-with-a-realistic-name-"
    args = register_args("--topic-prefix", prefix, "--topic-count", "70000")
    code, out, _ = run(capsys, node.endpoint, *args)
    assert code == 0
    assert node.ns.methods() == ["RegisterBrokerStream"]
    chunks = node.ns.calls[0][1]
    assert [c.WhichOneof("part") for c in chunks] == ["header"] + ["topics"] * 14
    header = chunks[0].header
    identity = (header.cluster_name, header.broker_name, header.broker_addr)
    assert identity == ("c1", "broker-a", "10.0.0.1:10911")
    assert (header.data_version.counter, header.data_version.timestamp) == (1, 0)
    assert len(header.topics) == 0
    assert all(len(c.topics.topics) == 5000 for c in chunks[1:])
    names = [t.topic_name for c in chunks[1:] for t in c.topics.topics]
    assert names == [f"{prefix}{i}" for i in range(70000)]
    first = chunks[1].topics.topics[0]
    assert (first.read_queue_nums, first.write_queue_nums, first.perm) == (4, 4, 6)
    assert out.strip() == "offset 8 (70002 records)"


def test_small_register_is_unary_and_merges_sources(capsys: Capsys, node: FakeNode, tmp_path: Path) -> None:
    topics_file = tmp_path / "topics.txt"
    topics_file.write_text("t2\n\nt3\n")
    flags = "--id 1 --ha-addr 10.0.0.1:10912 --timeout-ms 30000 --data-version 5 --topic t1 --topic t2"
    args = register_args(*flags.split(), "--topics-file", str(topics_file), "--queues", "8", "--perm", "4")
    code, out, _ = run(capsys, node.endpoint, *args)
    assert code == 0
    assert node.ns.methods() == ["RegisterBroker"]
    request = node.ns.calls[0][1]
    assert [t.topic_name for t in request.topics] == ["t1", "t2", "t3"]
    assert {(t.read_queue_nums, t.write_queue_nums, t.perm) for t in request.topics} == {(8, 8, 4)}
    assert request.broker_id == 1
    assert (request.ha_server_addr, request.heartbeat_timeout_ms) == ("10.0.0.1:10912", 30000)
    assert (request.data_version.counter, request.data_version.timestamp) == (5, 0)
    assert out.strip() == "offset 7 (5 records)"


def test_stream_chunks_split_exactly() -> None:
    request = api_pb2.RegisterBrokerRequest(
        broker_name="b", topics=[api_pb2.TopicConfig(topic_name=f"t{i}") for i in range(5001)]
    )
    chunks = register_chunks(request)
    assert [len(c.topics.topics) for c in chunks[1:]] == [5000, 1]
    assert chunks[0].header.broker_name == "b" and len(chunks[0].header.topics) == 0
    assert len(request.topics) == 5001  # the caller's request is left intact


def test_heartbeat_unknown_broker_exits_1(capsys: Capsys, node: FakeNode) -> None:
    args = ["broker", "heartbeat", "--cluster", "c1", "--name", "ghost", "--addr", "10.0.0.9:10911"]
    code, out, _ = run(capsys, node.endpoint, *args)
    assert code == 1
    assert "10.0.0.9:10911" in out


# ---- admin writes ----


def test_perm_wipe_prints_count_and_offset(capsys: Capsys, node: FakeNode) -> None:
    code, out, _ = run(capsys, node.endpoint, "perm", "wipe", "broker-a")
    assert code == 0
    assert out.strip() == "3 topics, offset 55"
    assert node.ns.calls[0][1].broker_name == "broker-a"


def test_topic_register_builds_queue_datas(capsys: Capsys, node: FakeNode) -> None:
    args = ["topic", "register", "T", "--broker", "b1", "--broker", "b2", "--queues", "2", "--json"]
    code, out, _ = run(capsys, node.endpoint, *args)
    assert code == 0
    request = node.ns.calls[0][1]
    assert [(q.broker_name, q.read_queue_nums, q.write_queue_nums, q.perm) for q in request.queue_datas] == [
        ("b1", 2, 2, 6),
        ("b2", 2, 2, 6),
    ]
    assert json.loads(out) == {"offset": 101, "records": 2}


def test_unimplemented_is_a_clean_error(capsys: Capsys, node: FakeNode) -> None:
    code, _, err = run(capsys, node.endpoint, "perm", "add", "broker-a")
    assert code == 1
    assert err.startswith("error: UNIMPLEMENTED: ")


# ---- rendering ----


def test_table_aligns_columns() -> None:
    text = render.table(("NAME", "N"), [["a", 1], ["long-name", 100]])
    assert text.splitlines() == ["NAME         N", "a            1", "long-name  100"]
    assert render.table(("A", "B"), []).splitlines() == ["A  B", "(none)"]


def test_to_dict_converts_int64_in_maps_and_lists() -> None:
    reply = api_pb2.GetClusterInfoReply(
        broker_addr_table={
            "b": state_pb2.BrokerData(addrs=[state_pb2.BrokerAddr(broker_id=2**40, addr="x")])
        },
        apply_offset=3,
    )
    data = render.to_dict(reply)
    assert data["apply_offset"] == 3
    assert data["broker_addr_table"]["b"]["addrs"] == [{"broker_id": 2**40, "addr": "x"}]
    assert data["cluster_addr_table"] == {}
