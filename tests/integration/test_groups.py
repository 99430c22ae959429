"""Sharding's processes (docs/scaling.md, "Sharding", Step 2) on a real 3-node cluster with [sharding]
groups = 2 and one worker per node: each node's core (group 0) starts and watches a group-1 core, a process
of its own with group 1's Raft (ports raft_port_step apart) and data under data_dir/g1; group 1 elects its
own leader. A fleet of FakeBrokers (remoting) and gRPC registrations lands in both groups, each set in the
group the directory names (read from each group core's own, unmerged, cluster info), and every route and
the cluster info, over gRPC and remoting, equal a one-group node's for the same fleet: the differential of
tests/unit/test_shards_merge.py on real processes. A group core killed with SIGKILL is started again by its
node's core and rejoins its group, and the cluster keeps answering meanwhile.

A group core has no public port: the tests reach it on its private socket, as the node's workers do
(corelink.own_channel with config.group_config).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from nameserver import config
from nameserver.chunking import register_chunks
from nameserver.cli import nsctl
from nameserver.cli.nsctl_shard import NOT_ENABLED
from nameserver.pb import api_pb2, api_pb2_grpc, state_pb2
from nameserver.remoting import codes
from nameserver.state.shards.directory import default_group
from tests.cluster import Cluster, NodeProc, register_request, retry, running
from tests.fakebroker import FakeBroker
from tests.integration.groupcores import (
    answers_equal,
    children_running,
    group_core_channel,
    group_core_pids,
    group_leader,
    group_status,
    own_cluster_info,
)
from tests.integration.groupcores import remoting_answer as _remoting
from tests.integration.groupcores import route_of as _route
from tests.unit.test_metrics import ensure_promtool

GROUPS = 2
pytestmark = pytest.mark.slow  # a 3-node cluster of 9 processes, started once for the module (~40 s here)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(str(tmp_path_factory.mktemp("groups")), size=3, worker_processes=1, groups=GROUPS, remoting=True,
                metrics=True)
    with running(c, timeout=c.ready_timeout) as started:
        yield started


# Broker names by the group their hash gives with 2 groups (directory.default_group), two of each, and the
# topics they share: a route of a shared topic is merged from both groups.
NAMES = {0: [], 1: []}  # type: dict[int, list[str]]
for _i in range(40):
    _name = f"broker-{_i}"
    if len(NAMES[default_group(_name, GROUPS)]) < 2:
        NAMES[default_group(_name, GROUPS)].append(_name)
FLEET = [name for group in sorted(NAMES) for name in NAMES[group]]
TOPICS = {name: ["Shared", f"Own-{name}"] + (["Pair"] if i % 2 else []) for i, name in enumerate(FLEET)}
GRPC_BROKERS = {"grpc-a": ["Shared", "ViaGrpc"], "grpc-b": ["ViaGrpc"]}  # registered over gRPC
# registered over gRPC in chunks (RegisterBrokerStream), a set of group 1: placed by its header chunk
STREAMED = next(f"streamed-{i}" for i in range(40) if default_group(f"streamed-{i}", GROUPS) == 1)
GRPC_BROKERS[STREAMED] = ["Shared", "ViaStream"]
ALL_TOPICS = sorted({t for ts in [*TOPICS.values(), *GRPC_BROKERS.values()] for t in ts})


@pytest.fixture(scope="module")
def one_group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The reference: a one-group node with a worker, as today's product."""
    c = Cluster(str(tmp_path_factory.mktemp("one-group")), size=1, worker_processes=1, remoting=True)
    with running(c, timeout=c.ready_timeout) as started:
        yield started


@pytest.fixture(scope="module")
def fleet(sharded: Cluster, one_group: Cluster) -> Iterator[list[FakeBroker]]:
    """The same fleet registered with both clusters: each FakeBroker on its connection to n1's remoting port
    (a worker) and to the reference's; two more brokers over gRPC."""
    brokers = [FakeBroker(name, cluster="ShardCluster").start() for name in FLEET]
    try:
        for broker in brokers:
            for cluster in (sharded, one_group):
                resp = broker.register(cluster.nodes[0].remoting_addr, TOPICS[broker.name])
                assert resp.code == codes.SUCCESS, resp.remark
        for i, (name, topics) in enumerate(GRPC_BROKERS.items()):
            for cluster in (sharded, one_group):
                request = register_request("ShardCluster", name, f"10.7.0.{i + 1}:10911", topics)
                if name == STREAMED:
                    retry(lambda c=cluster, r=request: c.nodes[0].ns.RegisterBrokerStream(
                        iter(register_chunks(r, per_chunk=1)), timeout=10), timeout=30)
                else:
                    retry(lambda c=cluster, r=request: c.nodes[0].ns.RegisterBroker(r, timeout=10), timeout=30)
        yield brokers
    finally:
        for broker in brokers:
            broker.stop()


def test_each_node_runs_a_group_core_and_the_group_elects_its_own_leader(sharded: Cluster) -> None:
    sharded.wait_for("group 1 ready on every node with a leader", lambda: group_leader(sharded, 1) and all(
        (st := group_status(n, 1)) is not None and st.ready for n in sharded.nodes), timeout=60)
    for node in sharded.nodes:
        assert len(group_core_pids(node)) == GROUPS - 1
        st = group_status(node, 1)
        assert st is not None
        # group 1's Raft address is the node's shifted by the step; its data under data_dir/g1
        assert st.node_id == config.group_raft_addr(node.raft_addr, 1, sharded.raft_port_step)
        assert os.path.isdir(os.path.join(sharded.root, f"{node.name}-data", "g1", "raft"))
    members = {st.node_id for st in (group_status(n, 1) for n in sharded.nodes) if st is not None}
    assert len(members) == 3 and not members & {n.raft_addr for n in sharded.nodes}


def test_each_set_lands_in_the_group_the_directory_names(sharded: Cluster, fleet: list[FakeBroker]) -> None:
    expected = {group: sorted(names) for group, names in NAMES.items()}
    for name in GRPC_BROKERS:
        expected[default_group(name, GROUPS)] = sorted([*expected[default_group(name, GROUPS)], name])

    def landed() -> bool:
        return all(sorted(own_cluster_info(node, group).broker_addr_table) == expected[group]
                   for node in sharded.nodes for group in range(GROUPS))

    sharded.wait_for("every set in its hash group on every node", landed, timeout=30)
    assert expected[0] and expected[1]


def test_routes_and_cluster_info_equal_one_group_s_over_grpc_and_remoting(
        sharded: Cluster, one_group: Cluster, fleet: list[FakeBroker]) -> None:
    reference = one_group.nodes[0]

    def equal_everywhere() -> bool:
        for node in sharded.nodes:
            if not answers_equal(node, reference, [*ALL_TOPICS, "NoSuchTopic"]):
                return False
            for name in [*FLEET, *GRPC_BROKERS]:
                ask = api_pb2.GetBrokerMemberGroupRequest(cluster_name="ShardCluster", broker_name=name)
                got = node.ns.GetBrokerMemberGroup(ask, timeout=5)
                want = reference.ns.GetBrokerMemberGroup(ask, timeout=5)
                got.apply_offset = want.apply_offset = 0
                if got != want:
                    return False
        return True

    sharded.wait_for("every node's routes and cluster info equal to the one-group node's", equal_everywhere,
                     timeout=30, every=0.5)
    shared = _route(sharded.nodes[1], "Shared")
    assert shared is not None and len(shared.broker_datas) == len(FLEET) + 2  # both groups' brokers
    listed = sharded.nodes[2].ns.GetTopicList(api_pb2.GetTopicListRequest(kind=api_pb2.TOPIC_LIST_ALL), timeout=5)
    assert set(ALL_TOPICS) <= set(listed.topics)


def test_a_heartbeat_batch_is_split_to_each_set_s_group(sharded: Cluster, fleet: list[FakeBroker]) -> None:
    """Each broker's heartbeat reaches its set's group (which alone knows its address): none is unknown."""
    beats = [api_pb2.BrokerHeartbeat(cluster_name="ShardCluster", broker_name=b.name, broker_addr=b.addr)
             for b in fleet]
    reply = retry(lambda: sharded.nodes[1].ns.Heartbeat(api_pb2.HeartbeatRequest(heartbeats=beats), timeout=5))
    assert list(reply.unknown_addrs) == []
    assert set(reply.data_versions) == {b.addr for b in fleet}


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape_text(node: NodeProc) -> str:
    with urllib.request.urlopen(f"http://{node.metrics_addr}/metrics", timeout=15) as resp:
        return resp.read().decode()


def scrape(node: NodeProc) -> Samples:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(scrape_text(node)) for s in family.samples}


def of_group(samples: Samples, name: str, group: int, **labels: str) -> float | None:
    return samples.get((name, frozenset({**labels, "group": str(group)}.items())))


def _queue_datas_body(brokers: list[str]) -> bytes:
    """A 217 body (TopicRouteData) naming a queue data on each of `brokers`."""
    return json.dumps({"queueDatas": [{"brokerName": name, "readQueueNums": 2, "writeQueueNums": 2, "perm": 6,
                                       "topicSysFlag": 0} for name in brokers]}).encode()


def _own_route_brokers(node: NodeProc, group: int, topic: str) -> list[str] | None:
    """The brokers of `topic`'s queue datas in group `group`'s own (unmerged) state on `node`; None: no route."""
    with group_core_channel(node, group) as channel:
        try:
            route = api_pb2_grpc.NameServerStub(channel).GetRoute(api_pb2.GetRouteRequest(topic=topic), timeout=5).route
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise
    return sorted(qd.broker_name for qd in route.queue_datas)


def test_a_remoting_217_is_split_to_each_set_s_group_as_grpc_s_register_topic(
        sharded: Cluster, one_group: Cluster, fleet: list[FakeBroker]) -> None:
    """A REGISTER_TOPIC_IN_NAMESRV naming sets of both groups: each group holds its own sets' queue datas, and
    the route (gRPC and 105) equals the one-group node's. One naming a broker no group holds (no directory
    record: group 0's part, refused there) writes nothing in any group, as on one group: SUCCESS, no route.
    One with a bad queue data in group 1's part is refused naming it, and group 0 writes nothing either."""
    broker, node, reference = fleet[0], sharded.nodes[0], one_group.nodes[0]
    split = [NAMES[0][0], NAMES[1][0]]
    bad = "queue_datas[2].broker_name: duplicate broker"
    for topic, brokers, answer in (("Via217", split, None), ("Via217Ghost", [NAMES[1][1], "ghost-217"], None),
                                   ("Via217Bad", [NAMES[0][1], NAMES[1][0], NAMES[1][0]], bad)):
        for target in (node, reference):
            resp = broker.call(target.remoting_addr, codes.REGISTER_TOPIC_IN_NAMESRV, {"topic": topic},
                               _queue_datas_body(brokers))
            assert resp is not None
            if answer is None:
                assert (resp.code, resp.remark) == (codes.SUCCESS, None), resp.remark
            else:
                assert resp.code == codes.SYSTEM_ERROR and resp.remark.startswith(answer), resp.remark
    # answered once this worker's replicas held it: the same connection reads it at once
    routed = broker.call(node.remoting_addr, codes.GET_ROUTEINFO_BY_TOPIC, {"topic": "Via217"})
    assert routed is not None and routed.code == codes.SUCCESS
    for topic in ("Via217Ghost", "Via217Bad"):
        none = broker.call(node.remoting_addr, codes.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
        assert none is not None and none.code == codes.TOPIC_NOT_EXIST
        assert _route(reference, topic) is None

    def landed() -> bool:
        return all(_own_route_brokers(n, group, "Via217") == [NAMES[group][0]]
                   and _own_route_brokers(n, group, "Via217Ghost") is None
                   and _own_route_brokers(n, group, "Via217Bad") is None
                   for n in sharded.nodes for group in range(GROUPS))

    sharded.wait_for("each group holding its own set's queue data of the topic on every node", landed, timeout=30)

    def equal_everywhere() -> bool:
        ext = {"topic": "Via217"}
        return all(_route(n, "Via217") == _route(reference, "Via217") and _remoting(
            n, codes.GET_ROUTEINFO_BY_TOPIC, ext) == _remoting(reference, codes.GET_ROUTEINFO_BY_TOPIC, ext)
            for n in sharded.nodes)

    sharded.wait_for("the topic's route on every node equal to the one-group node's", equal_everywhere, timeout=30)
    route = _route(node, "Via217")
    assert route is not None and sorted(qd.broker_name for qd in route.queue_datas) == sorted(split)


def test_a_grpc_split_request_with_a_bad_part_is_refused_whole(sharded: Cluster, one_group: Cluster) -> None:
    """A RegisterTopic the router splits over both groups, its bad queue data in group 1's part: refused
    naming the field as the one-group node refuses it, and group 0 writes nothing of it either (each part
    was checked by its own group's core alone: group 0's part was written)."""
    node, reference = sharded.nodes[0], one_group.nodes[0]
    qds = [state_pb2.QueueData(broker_name=name, read_queue_nums=2, write_queue_nums=2, perm=6)
           for name in (NAMES[0][1], NAMES[1][0], NAMES[1][0])]
    for target in (node, reference):
        with pytest.raises(grpc.RpcError) as err:
            target.ns.RegisterTopic(api_pb2.RegisterTopicRequest(topic="GrpcSplitBad", queue_datas=qds), timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert (err.value.details() or "").startswith("queue_datas[2].broker_name: duplicate"), err.value.details()
    # a write after it through the same node: once its groups have applied it, the bad one is not there
    ok = node.ns.RegisterTopic(api_pb2.RegisterTopicRequest(topic="GrpcSplitGood", queue_datas=qds[:2]), timeout=10)
    assert ok.offset > 0
    sharded.wait_for("the good split topic in both groups", lambda: all(
        _own_route_brokers(node, group, "GrpcSplitGood") == [NAMES[group][1 - group]] for group in range(GROUPS)),
        timeout=30)
    for group in range(GROUPS):
        assert _own_route_brokers(node, group, "GrpcSplitBad") is None, group


def test_an_unchanged_reregistration_of_a_group_1_set_is_answered_by_the_worker(
        sharded: Cluster, fleet: list[FakeBroker]) -> None:
    """A stock broker re-registers every 30 s, mostly unchanged: n1's worker answers a group-1 set's from its
    group-1 replica (counted; group 1 applies nothing for it) and notes the broker's liveness at n1's group-1
    core, which keeps it alive in group 1 (past its heartbeat timeout) until it goes silent."""
    node = sharded.nodes[0]
    # the module's other brokers heartbeated now: none of them expires (a write in group 1) meanwhile
    others = [api_pb2.BrokerHeartbeat(cluster_name="ShardCluster", broker_name=b.name, broker_addr=b.addr)
              for b in fleet] + [api_pb2.BrokerHeartbeat(cluster_name="ShardCluster", broker_name=name,
                                                         broker_addr=f"10.7.0.{i + 1}:10911")
                                 for i, name in enumerate(GRPC_BROKERS)]
    retry(lambda: node.ns.Heartbeat(api_pb2.HeartbeatRequest(heartbeats=others), timeout=5))
    name = next(f"unchanged-{i}" for i in range(40) if default_group(f"unchanged-{i}", GROUPS) == 1)
    broker = FakeBroker(name, cluster="ShardCluster").start()
    try:
        timeout = {"heartbeatTimeoutMillis": "3000"}
        assert broker.register(node.remoting_addr, ["Unchanged1"], extra=timeout).code == codes.SUCCESS
        # the connection's next read waits for the worker's replicas to have it
        assert broker.call(node.remoting_addr, codes.GET_ROUTEINFO_BY_TOPIC, {"topic": "Unchanged1"}).code == 0
        before = scrape(node)
        sent = 0
        for _ in range(9):  # 4.5 s: past the heartbeat timeout
            assert broker.register(node.remoting_addr, ["Unchanged1"], extra=timeout).code == codes.SUCCESS
            sent += 1
            time.sleep(0.5)
        # group 1 wrote nothing for them (read before the broker, now silent, expires: a write)
        assert applied_records(scrape(node), 1) == applied_records(before, 1)
        for n in sharded.nodes:  # still alive in group 1, past its timeout
            assert name in own_cluster_info(n, 1).broker_addr_table
            assert name not in own_cluster_info(n, 0).broker_addr_table

        def counted() -> bool:
            answered = ("nameserver_worker_unchanged_registrations_total", frozenset())
            return scrape(node).get(answered, 0) == before.get(answered, 0) + sent

        sharded.wait_for("the worker's count of registrations it answered", counted, timeout=10)
        # silent now: group 1's leader expires it after its timeout (the notes were what kept it)
        sharded.wait_for("the silent broker expired in group 1", lambda: all(
            name not in own_cluster_info(n, 1).broker_addr_table for n in sharded.nodes), timeout=15)
    finally:
        broker.stop()


def applied_records(samples: Samples, group: int) -> float:
    """Every record group `group` applied on the node, of any type and operation."""
    return sum(value for (metric, labels), value in samples.items()
               if metric == "nameserver_records_applied_total" and ("group", str(group)) in labels)


def test_every_group_s_raft_and_apply_metrics_are_on_the_node_s_one_metrics(sharded: Cluster) -> None:
    """Each node's /metrics (its group 0 core's) shows every group's Raft and apply metrics labelled `group`,
    its group core's read over their private socket: one leader a group, and a write landing in group 1
    (a re-registration of a group-1 set with a new topic) is applied in group 1 on every node and counted
    there, while group 0 applies no such record."""
    def every_group_led() -> list[Samples] | None:
        found = [scrape(node) for node in sharded.nodes]
        for group in range(GROUPS):
            if any(of_group(samples, "nameserver_group_metrics_read", group) != 1
                   or of_group(samples, "nameserver_ready", group) != 1 for samples in found):
                return None
            if sum(of_group(samples, "nameserver_is_leader", group) or 0 for samples in found) != 1:
                return None
        return found

    found = sharded.wait_for("every node's metrics of both groups, one leader each", every_group_led, timeout=60)
    for node, samples in zip(sharded.nodes, found, strict=True):
        for group in range(GROUPS):
            raft_addr = config.group_raft_addr(node.raft_addr, group, sharded.raft_port_step)
            assert of_group(samples, "nameserver_node_info", group, node_id=raft_addr, grpc_addr=node.grpc_addr) == 1
            assert (of_group(samples, "nameserver_raft_term", group) or 0) >= 1
            assert of_group(samples, "process_resident_memory_bytes", group), "each group core's process"
        assert ("nameserver_worker_processes", frozenset()) in samples  # the node's, not a group's
    text = scrape_text(sharded.nodes[0])
    lint = subprocess.run([ensure_promtool(), "check", "metrics"], input=text, capture_output=True, text=True,
                          timeout=60)
    assert not [line for line in (lint.stdout + lint.stderr).splitlines() if line.startswith("nameserver_")]
    assert "duplicate" not in lint.stdout + lint.stderr

    name = next(f"metrics-{i}" for i in range(40) if default_group(f"metrics-{i}", GROUPS) == 1)
    first = register_request("MetricsCluster", name, "10.8.0.1:10911", ["M0"])
    retry(lambda: sharded.nodes[0].ns.RegisterBroker(first, timeout=10), timeout=30)

    def topic_upserts(samples: Samples, group: int) -> float:
        return of_group(samples, "nameserver_records_applied_total", group, type="TOPIC_QUEUE", op="upsert") or 0

    def assigned_everywhere() -> list[Samples] | None:
        found = [scrape(node) for node in sharded.nodes]
        return found if all(of_group(samples, "nameserver_records_applied_total", 0, type="SHARD_SET", op="upsert")
                            for samples in found) else None

    before = sharded.wait_for("the set assigned on every node", assigned_everywhere, timeout=30)
    second = register_request("MetricsCluster", name, "10.8.0.1:10911", ["M0", "M1"], counter=2)
    reply = retry(lambda: sharded.nodes[1].ns.RegisterBroker(second, timeout=10), timeout=30)

    def applied_in_group_1() -> list[Samples] | None:
        found = [scrape(node) for node in sharded.nodes]
        return found if all((of_group(samples, "nameserver_apply_offset", 1) or 0) >= reply.offset
                            and topic_upserts(samples, 1) > topic_upserts(was, 1)
                            for samples, was in zip(found, before, strict=True)) else None

    after = sharded.wait_for("the write applied in group 1 on every node", applied_in_group_1, timeout=30)
    for samples, was in zip(after, before, strict=True):
        assert topic_upserts(samples, 0) == topic_upserts(was, 0)
        shard = {"type": "SHARD_SET", "op": "upsert"}
        assert of_group(samples, "nameserver_records_applied_total", 0, **shard) == of_group(
            was, "nameserver_records_applied_total", 0, **shard)
    proposed = [(of_group(samples, "nameserver_proposals_total", 1) or 0) - (
        of_group(was, "nameserver_proposals_total", 1) or 0) for samples, was in zip(after, before, strict=True)]
    assert sum(proposed) >= 1  # by group 1's leader


def run_nsctl(capsys: pytest.CaptureFixture[str], cluster: Cluster, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = nsctl.main(["--endpoints", ",".join(n.grpc_addr for n in cluster.nodes), "--timeout", "10", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_nsctl_shard_list_names_each_registered_set_s_group(
        sharded: Cluster, one_group: Cluster, fleet: list[FakeBroker], capsys: pytest.CaptureFixture[str]) -> None:
    """The nodes' workers serve Shards.ListShards from group 0's directory; a bad pin is refused by field. A
    one-group node serves no Shards: nsctl says sharding is not enabled, and its status has no GROUP column."""
    code, out, err = run_nsctl(capsys, one_group, "shard", "list")
    assert (code, out, err) == (1, "", f"error: UNIMPLEMENTED: {NOT_ENABLED}\n")
    code, out, _ = run_nsctl(capsys, one_group, "status")
    assert code == 0 and out.split()[:4] == ["NODE", "GRPC", "ADDR", "ROLE"]
    expected = {name: default_group(name, GROUPS) for name in [*FLEET, *GRPC_BROKERS]}
    code, out, err = run_nsctl(capsys, sharded, "--json", "shard", "list")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["groups"] == GROUPS and len(doc["apply_offsets"]) == GROUPS
    listed = {entry["broker_name"]: entry["set"]["group"] for entry in doc["sets"]}
    assert {name: listed.get(name) for name in expected} == expected
    code, out, err = run_nsctl(capsys, sharded, "shard", "list", STREAMED)
    assert code == 0, err
    assert out.splitlines()[1].split()[:2] == [STREAMED, "1"]
    assert out.splitlines()[2].startswith("2 groups; 1 set with a record (group 0: 0, group 1: 1)")
    code, out, err = run_nsctl(capsys, sharded, "shard", "assign", STREAMED, "0")  # pinned where it is not: moved
    assert (code, out) == (1, "") and err == (f"error: INVALID_ARGUMENT: group: set {STREAMED!r} is in group 1: "
                                              "move it instead\n")
    code, _, err = run_nsctl(capsys, sharded, "shard", "move", STREAMED, "2")
    assert (code, err) == (1, "error: INVALID_ARGUMENT: group: 2 is not one of this cluster's groups (0 to 1)\n")


def test_nsctl_status_shows_every_group_core_of_every_node(
        sharded: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    """Each node's workers answer Admin.Status with each of its group cores' own: a row per group per node."""
    def each_group_led() -> dict | None:
        code, out, _ = run_nsctl(capsys, sharded, "--json", "status")
        nodes = json.loads(out)["nodes"] if code == 0 else []
        if not all(len(node["groups"]) == GROUPS and all(g["ready"] for g in node["groups"]) for node in nodes):
            return None
        leaders = [[g["role"] for g in node["groups"]].count("leader") for node in nodes]
        led = {group: [n["grpc_addr"] for n in nodes if n["groups"][group]["role"] == "leader"]
               for group in range(GROUPS)}
        return led if all(len(found) == 1 for found in led.values()) and sum(leaders) == GROUPS else None

    led = sharded.wait_for("a leader in each group, every group core ready", each_group_led, timeout=30)
    code, out, _ = run_nsctl(capsys, sharded, "status")
    assert code == 0
    header, *rows = out.splitlines()[:1 + GROUPS * len(sharded.nodes)]
    assert header.split()[:4] == ["NODE", "GRPC", "ADDR", "GROUP"]
    for node in sharded.nodes:
        mine = [row.split() for row in rows if row.split()[1] == node.grpc_addr]
        assert [(cells[0], cells[2]) for cells in mine] == [
            (config.group_raft_addr(node.raft_addr, group, sharded.raft_port_step), str(group))
            for group in range(GROUPS)]
        for cells in mine:  # ROLE, and LEADER: the gRPC address of the node whose core leads that group
            assert cells[3] in ("leader", "follower") and cells[4] == led[int(cells[2])][0]


def _answers_route(node: NodeProc, topic: str, name: str) -> bool:
    try:
        found = _route(node, topic)
    except grpc.RpcError:  # UNAVAILABLE while a replica of it is not ready
        return False
    return found is not None and [bd.broker_name for bd in found.broker_datas] == [name]


def test_a_killed_group_core_is_started_again_and_the_cluster_keeps_answering(sharded: Cluster) -> None:
    node, others = sharded.nodes[0], sharded.nodes[1:]
    sharded.wait_for("n1's group core", lambda: group_core_pids(node))
    [victim] = group_core_pids(node)
    # a load balancer watching n1's health (grpc.health.v1 Watch) is told as Admin.Status says: NOT_SERVING
    # while its group 1 core is down, SERVING once it is back (group 0's health alone stayed SERVING)
    watch = health_pb2_grpc.HealthStub(node._channel()).Watch(health_pb2.HealthCheckRequest(), timeout=150)
    assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
    os.kill(victim, signal.SIGKILL)
    assert next(watch).status == health_pb2.HealthCheckResponse.NOT_SERVING
    # n1 says it is not ready while its group 1 core is down (its group 1 writes need it), its group 0 core
    # ready all along
    sharded.wait_for("n1 not ready without its group 1 core", lambda: (st := node.status(timeout=5)) is not None
                     and not st.ready and st.groups[0].ready, timeout=20)
    # while n1's group 1 core is down, the other nodes take a registration of a group-1 set (group 1 elects
    # a new leader if n1's led it) and answer its route
    name = next(f"kill-{i}" for i in range(40) if default_group(f"kill-{i}", GROUPS) == 1)
    retry(lambda: others[0].ns.RegisterBroker(register_request("c", name, "10.9.0.1:10911", ["TopicK"]), timeout=5),
          timeout=15)
    sharded.wait_for("n3's route of it", lambda: _answers_route(others[1], "TopicK", name), timeout=15)
    restarted = sharded.wait_for("n1's group core started again",
                                 lambda: [p for p in group_core_pids(node) if p != victim], timeout=30)
    assert victim not in restarted
    sharded.wait_for("n1's group 1 core ready again",
                     lambda: (st := group_status(node, 1)) is not None and st.ready, timeout=60)
    sharded.wait_for("n1 ready again", lambda: (st := node.status(timeout=5)) is not None and st.ready, timeout=30)
    assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
    watch.cancel()
    # n1 catches up in group 1: its workers answer the route with the set written while its core was down
    sharded.wait_for("n1's route of the set written meanwhile", lambda: _answers_route(node, "TopicK", name),
                     timeout=30)
    assert node.alive


def test_brokers_connected_through_a_dead_worker_are_released_in_every_group(
        sharded: Cluster, fleet: list[FakeBroker]) -> None:
    """Last (it drops the fleet's connections): n1's worker holds the FakeBrokers' connections; killed, each
    group releases its own sets' brokers (RocketMQ unregisters a broker whose channel closed). Group 0's core
    hears it from its supervisor, a group core finds the worker gone itself (groupcore.release_dead_workers)."""
    node = sharded.nodes[0]
    # their periodic registration (every 30 s), as stock brokers: a group core restarted since (the test
    # above) learns its brokers' connections from it
    for broker in fleet:
        assert broker.register(node.remoting_addr, TOPICS[broker.name]).code == codes.SUCCESS
    landed = {group: sorted(own_cluster_info(node, group).broker_addr_table) for group in range(GROUPS)}
    assert set(NAMES[1]) <= set(landed[1]) and set(NAMES[0]) <= set(landed[0])
    [worker] = children_running(node, b"nameserver.worker")
    os.kill(worker, signal.SIGKILL)

    def released() -> bool:
        return all(not set(NAMES[group]) & set(own_cluster_info(n, group).broker_addr_table)
                   for n in sharded.nodes for group in range(GROUPS))

    try:
        sharded.wait_for("the fleet's brokers released in both groups", released, timeout=30)
    except AssertionError:
        left = {(n.name, group): sorted(set(NAMES[group]) & set(own_cluster_info(n, group).broker_addr_table))
                for n in sharded.nodes for group in range(GROUPS)}
        raise AssertionError(f"not released: {left}") from None
