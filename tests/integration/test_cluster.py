"""The core issue's done-criteria, on real 3-process clusters on 127.0.0.1."""

from __future__ import annotations

import contextlib
import glob
import os
import signal
import threading
import time
import urllib.request
from collections.abc import Iterator

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from nameserver.pb import api_pb2, state_pb2
from nameserver.validation import MAX_NAME_BYTES
from tests.cluster import Cluster, NodeProc, register_request, retry, running
from tests.integration.reflected import CORE_SERVICES, listed_and_answering

pytestmark = pytest.mark.cluster


def topics(prefix: str, n: int) -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


@pytest.fixture(scope="module")
def three(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One 3-node cluster shared by the tests that kill nothing and write names of their own (cluster
    DefaultCluster with broker-a and broker-b, topics TopicTest*; cluster C with broker-kv, topics T1 and
    T2, namespace ORDER_TOPIC_CONFIG), so they pass in any order."""
    with running(Cluster(str(tmp_path_factory.mktemp("three")), 3)) as c:
        yield c


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One 1-node cluster shared by the tests whose calls are all refused or read-only: none changes its
    state (each checks that itself), so they do not disturb one another."""
    with running(Cluster(str(tmp_path_factory.mktemp("single")), 1)) as c:
        yield c


def test_routes_registered_through_a_follower_are_readable_on_every_node(three: Cluster) -> None:
    c = three
    c.wait_ready()
    sts = c.wait_converged()
    assert sum(s.role == api_pb2.ROLE_LEADER for s in sts) == 1
    follower = c.followers()[0]
    topics_before = set(follower.ns.GetTopicList(api_pb2.GetTopicListRequest(), timeout=5).topics)
    keys_before = sts[0].keys
    offsets = []
    for name, addr in (("broker-a", "10.0.0.1:10911"), ("broker-b", "10.0.0.2:10911")):
        reply = retry(lambda n=name, a=addr: follower.ns.RegisterBroker(
            register_request("DefaultCluster", n, a, topics("TopicTest", 100)), timeout=10))
        assert reply.records > 100  # broker, live, and 100 queue data records
        offsets.append(reply.offset)
    for node in c.nodes:
        route = node.ns.GetRoute(api_pb2.GetRouteRequest(topic="TopicTest42", min_offset=max(offsets)), timeout=10)
        assert route.apply_offset >= max(offsets)
        assert [b.broker_name for b in route.route.broker_datas] == ["broker-a", "broker-b"]
        assert [(q.broker_name, q.read_queue_nums, q.perm) for q in route.route.queue_datas] == [
            ("broker-a", 4, 6), ("broker-b", 4, 6)]
        info = node.ns.GetClusterInfo(api_pb2.GetClusterInfoRequest(min_offset=max(offsets)), timeout=5)
        assert sorted(info.cluster_addr_table["DefaultCluster"].names) == ["broker-a", "broker-b"]
        listed = node.ns.GetTopicList(api_pb2.GetTopicListRequest(min_offset=max(offsets)), timeout=5)
        assert set(listed.topics) - topics_before == set(topics("TopicTest", 100))
    sts = c.wait_converged()
    assert len({s.digest for s in sts}) == 1 and sts[0].keys > keys_before + 200
    # Members, as the leader sees them: every link up, every follower's log matched up to the writes
    leader = c.leader()
    assert leader is not None
    members = leader.admin.Members(api_pb2.MembersRequest(), timeout=5).members
    assert sorted(m.node_id for m in members) == sorted(n.raft_addr for n in c.nodes)
    c.wait_for("every member connected and matched", lambda: all(
        m.connected and m.match_offset >= max(offsets)
        for m in leader.admin.Members(api_pb2.MembersRequest(), timeout=5).members), timeout=10)


def _forwarded_registrations(node) -> float:
    with urllib.request.urlopen(f"http://{node.metrics_addr}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == "nameserver_forwarded_requests_received_total"
               and sample.labels.get("method") in ("RegisterBroker", "RegisterBrokerStream"))


def test_reregistration_writes_only_what_changed(make_cluster) -> None:
    c = make_cluster(metrics=True, scan_interval_ms=500)
    leader = c.wait_ready()
    ns = c.followers()[0].ns
    timeout_ms = 3000
    req = register_request("C", "broker-a", "10.0.0.1:10911", topics("T", 50), timeout_ms=timeout_ms)
    first = retry(lambda: ns.RegisterBroker(req, timeout=10))
    c.wait_converged()
    digest_before = leader.status().digest
    forwarded_before = _forwarded_registrations(leader)
    # Unchanged re-registrations through a follower, past the broker's heartbeat timeout: answered by
    # the follower itself (never forwarded), nothing enters the log, and they keep the broker alive.
    t_end = time.monotonic() + 2 * timeout_ms / 1000
    while time.monotonic() < t_end:
        again = ns.RegisterBroker(req, timeout=10)
        assert again.records == 0 and again.offset >= first.offset
        time.sleep(0.5)
    assert _forwarded_registrations(leader) == forwarded_before
    route = leader.ns.GetRoute(api_pb2.GetRouteRequest(topic="T1"), timeout=5)
    assert [b.broker_name for b in route.route.broker_datas] == ["broker-a"]
    assert leader.status().digest == digest_before  # no record changed (the log holds idle no-ops only)
    changed = register_request("C", "broker-a", "10.0.0.1:10911", topics("T", 50) + ["T-new"], counter=2)
    changed.topics[3].perm = 4
    reply = ns.RegisterBroker(changed, timeout=10)
    # the live record (new DataVersion), the new topic, and the topic whose perm changed
    assert reply.records == 3 and reply.offset > first.offset
    route = ns.GetRoute(api_pb2.GetRouteRequest(topic="T3", min_offset=reply.offset), timeout=5)
    assert route.route.queue_datas[0].perm == 4


@pytest.mark.parametrize("mutate, field", [
    (lambda r: setattr(r, "cluster_name", ""), "cluster_name"),
    (lambda r: setattr(r, "broker_name", "b" * (MAX_NAME_BYTES + 1)), "broker_name"),
    (lambda r: setattr(r, "broker_addr", "no-port"), "broker_addr"),
    (lambda r: setattr(r, "broker_addr", "10.0.0.1:70000"), "broker_addr"),
    (lambda r: setattr(r, "broker_id", -1), "broker_id"),
    (lambda r: setattr(r.topics[1], "topic_name", "bad/topic"), "topics[1].topic_name"),
    (lambda r: setattr(r.topics[2], "topic_name", "x" * 301), "topics[2].topic_name"),
    (lambda r: setattr(r.topics[0], "perm", 9), "topics[0].perm"),
    (lambda r: setattr(r.topics[0], "read_queue_nums", -1), "topics[0].read_queue_nums"),
    (lambda r: setattr(r, "zone_name", "z" * (MAX_NAME_BYTES + 1)), "zone_name"),
])
def test_bad_registrations_name_the_field_and_change_nothing(single, mutate, field) -> None:
    node = single.nodes[0]
    before = node.status()
    req = register_request("C", "broker-a", "10.0.0.1:10911", topics("T", 3))
    mutate(req)
    with pytest.raises(grpc.RpcError) as err:
        node.ns.RegisterBroker(req, timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in err.value.details()
    after = node.status()
    assert (after.end_offset, after.commit_offset, after.apply_offset) == (
        before.end_offset, before.commit_offset, before.apply_offset)
    assert node.status().ready  # still serving


def test_other_bad_inputs_name_the_field(single) -> None:
    c = single
    ns = c.nodes[0].ns
    before = c.nodes[0].status().end_offset
    cases = [
        (lambda: ns.GetRoute(api_pb2.GetRouteRequest(topic=""), timeout=5), "topic"),
        (lambda: ns.PutKv(api_pb2.PutKvRequest(namespace="", key="k", value="v"), timeout=5), "namespace"),
        (lambda: ns.PutKv(api_pb2.PutKvRequest(namespace="ns", key="", value="v"), timeout=5), "key"),
        (lambda: ns.DeleteTopic(api_pb2.DeleteTopicRequest(topic="a/b"), timeout=5), "topic"),
        (lambda: ns.WipeWritePerm(api_pb2.BrokerPermRequest(broker_name=""), timeout=5), "broker_name"),
        (lambda: ns.RegisterTopic(api_pb2.RegisterTopicRequest(topic="T", queue_datas=[
            state_pb2.QueueData(broker_name="nope", read_queue_nums=1, write_queue_nums=1, perm=6)]),
            timeout=5), "broker_name"),
    ]
    for call, field in cases:
        with pytest.raises(grpc.RpcError) as err:
            call()
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
        assert field in err.value.details()
    assert c.nodes[0].status().end_offset == before
    with pytest.raises(grpc.RpcError) as err:
        ns.PutKv(api_pb2.PutKvRequest(namespace="ns", key="k", value="v" * (2 << 20)), timeout=5)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_kv_and_topic_admin_round_trip(three: Cluster) -> None:
    c = three
    c.wait_ready()
    a, b = c.followers()[0], c.leader()
    put = retry(lambda: a.ns.PutKv(api_pb2.PutKvRequest(namespace="ORDER_TOPIC_CONFIG", key="T1", value="broker-a:4"),
                                   timeout=10))
    got = b.ns.GetKv(api_pb2.GetKvRequest(namespace="ORDER_TOPIC_CONFIG", key="T1", min_offset=put.offset), timeout=5)
    assert got.value == "broker-a:4"
    listed = a.ns.ListKv(api_pb2.ListKvRequest(namespace="ORDER_TOPIC_CONFIG", min_offset=put.offset), timeout=5)
    assert dict(listed.table) == {"T1": "broker-a:4"}
    # a value of 100 KB, all bytes >= 0x80 in UTF-8: an entry pysyncobj's leader sends in pieces, two or more
    # labelled last (raftlog/chunkedappend.py); before the fix it never committed (nor any write after it)
    big = "名" * 34_000
    put = a.ns.PutKv(api_pb2.PutKvRequest(namespace="ORDER_TOPIC_CONFIG", key="big", value=big), timeout=10)
    assert all(n.ns.GetKv(api_pb2.GetKvRequest(namespace="ORDER_TOPIC_CONFIG", key="big", min_offset=put.offset),
                          timeout=5).value == big for n in c.nodes)
    reg = a.ns.RegisterBroker(register_request("C", "broker-kv", "10.0.0.9:10911", ["T1", "T2"]), timeout=10)
    group = b.ns.GetBrokerMemberGroup(api_pb2.GetBrokerMemberGroupRequest(
        cluster_name="C", broker_name="broker-kv", min_offset=reg.offset), timeout=5)
    assert [(x.broker_id, x.addr) for x in group.addrs] == [(0, "10.0.0.9:10911")]
    assert group.apply_offset >= reg.offset
    wiped = a.ns.WipeWritePerm(api_pb2.BrokerPermRequest(broker_name="broker-kv"), timeout=10)
    assert wiped.topic_count == 2
    route = b.ns.GetRoute(api_pb2.GetRouteRequest(topic="T1", min_offset=wiped.offset), timeout=5)
    assert route.route.queue_datas[0].perm == 4
    added = a.ns.AddWritePerm(api_pb2.BrokerPermRequest(broker_name="broker-kv"), timeout=10)
    assert added.topic_count == 2
    deleted = a.ns.DeleteTopic(api_pb2.DeleteTopicRequest(topic="T2"), timeout=10)
    assert deleted.offset > reg.offset
    with pytest.raises(grpc.RpcError) as err:
        b.ns.GetRoute(api_pb2.GetRouteRequest(topic="T2", min_offset=deleted.offset), timeout=5)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    gone = a.ns.DeleteKv(api_pb2.DeleteKvRequest(namespace="ORDER_TOPIC_CONFIG", key="T1"), timeout=10)
    with pytest.raises(grpc.RpcError) as err:
        b.ns.GetKv(api_pb2.GetKvRequest(namespace="ORDER_TOPIC_CONFIG", key="T1", min_offset=gone.offset), timeout=5)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_leader_kill_failover_catch_up_and_full_restart(make_cluster) -> None:
    c = make_cluster()
    leader = c.wait_ready()
    acked: dict[str, int] = {}

    def write(node, key: str) -> None:
        reply = retry(lambda: node.ns.PutKv(api_pb2.PutKvRequest(namespace="acks", key=key, value=key), timeout=2),
                      timeout=15)
        acked[key] = reply.offset

    for i in range(20):
        write(c.followers()[i % 2], f"before-{i}")
    c.kill(leader)
    survivors = [n for n in c.nodes if n is not leader]
    t0 = time.monotonic()
    write(survivors[0], "after-kill")
    failover_s = time.monotonic() - t0
    assert failover_s < 3.0, f"writes resumed only after {failover_s:.2f}s"
    for i in range(20):
        write(survivors[i % 2], f"during-{i}")
    c.start(leader)  # the killed node comes back and catches up
    sts = c.wait_converged(c.nodes)
    assert len({s.digest for s in sts}) == 1
    # the whole cluster restarted keeps every acknowledged write
    for n in c.nodes:
        c.kill(n, signal.SIGTERM)
    c.start()
    c.wait_ready(c.nodes)
    c.wait_converged(c.nodes)
    for n in c.nodes:
        table = n.ns.ListKv(api_pb2.ListKvRequest(namespace="acks"), timeout=5).table
        assert set(table) == set(acked), f"{n.name} lost {set(acked) - set(table)}"


def test_silent_broker_expires_and_failover_keeps_live_ones(make_cluster) -> None:
    c = make_cluster(scan_interval_ms=500)
    leader = c.wait_ready()
    ns = c.followers()[0].ns
    timeout_ms = 3000
    retry(lambda: ns.RegisterBroker(register_request("C", "broker-dead", "10.0.0.9:10911", ["T"],
                                                     timeout_ms=timeout_ms), timeout=10))
    reply = ns.RegisterBroker(register_request("C", "broker-live", "10.0.0.8:10911", ["T"], timeout_ms=timeout_ms),
                              timeout=10)
    beat = api_pb2.HeartbeatRequest(heartbeats=[api_pb2.BrokerHeartbeat(
        cluster_name="C", broker_name="broker-live", broker_addr="10.0.0.8:10911")])

    def names(node) -> list[str]:
        route = node.ns.GetRoute(api_pb2.GetRouteRequest(topic="T", min_offset=reply.offset), timeout=5)
        return [b.broker_name for b in route.route.broker_datas]

    t0 = time.monotonic()
    while "broker-dead" in names(c.followers()[1]):
        for n in c.followers():  # heartbeats through followers reach the leader in batches
            n.ns.Heartbeat(beat, timeout=5)
        assert time.monotonic() - t0 < (timeout_ms + 500) / 1000 + 1.5, "dead broker kept past timeout + scan"
        time.sleep(0.2)
    assert names(leader) == ["broker-live"]
    # a leader change must not expel the live broker: keep heartbeating through the survivors
    c.kill(leader)
    survivors = [n for n in c.nodes if n is not leader]
    end = time.monotonic() + 2 * timeout_ms / 1000
    while time.monotonic() < end:
        for n in survivors:
            with contextlib.suppress(grpc.RpcError):  # no leader for a moment
                n.ns.Heartbeat(beat, timeout=2)
        time.sleep(0.3)
    new_leader = c.wait_ready(survivors)
    assert names(new_leader) == ["broker-live"]


def test_follower_down_during_compaction_catches_up_from_snapshot(make_cluster) -> None:
    c = make_cluster(snapshot_every_entries=50)
    c.wait_ready()
    lagging = c.followers()[0]
    c.kill(lagging)
    live = [n for n in c.nodes if n is not lagging]
    for i in range(300):
        retry(lambda i=i: live[i % 2].ns.PutKv(api_pb2.PutKvRequest(namespace="bulk", key=f"k{i % 100}",
                                                                   value=str(i)), timeout=5))
    c.wait_for("a snapshot on the leader", lambda: (c.leader(live).status().snapshot_offset or 0) > 100)
    c.start(lagging)
    sts = c.wait_converged(c.nodes, timeout=40)
    assert len({s.digest for s in sts}) == 1
    # it was handed the leader's snapshot: the entries it missed were compacted away
    with open(lagging.log_path) as f:
        assert "restored snapshot at offset" in f.read()
    assert lagging.status().snapshot_offset > 0
    assert lagging.ns.GetKv(api_pb2.GetKvRequest(namespace="bulk", key="k99"), timeout=5).value == "299"


def test_broker_with_70000_topics_registers_over_the_stream(make_cluster) -> None:
    c = make_cluster()
    c.wait_ready()
    follower = c.followers()[0]
    req = register_request("C", "broker-huge", "10.0.0.1:10911", topics("HugeTopic-", 70000))

    def chunks():
        header = api_pb2.RegisterBrokerRequest()
        header.CopyFrom(req)
        del header.topics[:]
        yield api_pb2.RegisterBrokerChunk(header=header)
        for i in range(0, 70000, 5000):
            yield api_pb2.RegisterBrokerChunk(topics=api_pb2.TopicConfigs(topics=req.topics[i:i + 5000]))

    reply = retry(lambda: follower.ns.RegisterBrokerStream(chunks(), timeout=60), timeout=60)
    assert reply.records == 70002
    for n in c.nodes:
        route = n.ns.GetRoute(api_pb2.GetRouteRequest(topic="HugeTopic-69999", min_offset=reply.offset), timeout=30)
        assert route.route.queue_datas[0].broker_name == "broker-huge"
    sts = c.wait_converged(timeout=60)
    assert len({s.digest for s in sts}) == 1


def _one_node_with_a_snapshot(make_cluster) -> tuple[Cluster, NodeProc, api_pb2.TakeSnapshotReply]:
    """A 1-node cluster with 60 keys n/k0..k59 and a snapshot taken after them."""
    c = make_cluster(1, snapshot_every_entries=20)
    c.wait_ready()
    node = c.nodes[0]
    for i in range(60):
        node.ns.PutKv(api_pb2.PutKvRequest(namespace="n", key=f"k{i}", value="v" * 100), timeout=5)
    snap = node.admin.TakeSnapshot(api_pb2.TakeSnapshotRequest(), timeout=30)
    assert snap.offset > 0
    return c, node, snap


def test_corrupt_snapshot_on_restart_is_refused_loudly(make_cluster) -> None:
    c, node, snap = _one_node_with_a_snapshot(make_cluster)
    c.kill(node, signal.SIGTERM)
    snaps = sorted(glob.glob(f"{c.root}/n1-data/snapshots/snap-*.mdb"))
    with open(snaps[-1], "r+b") as f:  # flip bytes in the middle of the newest snapshot
        f.seek(os.path.getsize(snaps[-1]) // 2)
        f.write(b"\xff" * 64)
    c.start(node)
    st = c.wait_for("the node to report the bad snapshot", lambda: (s := node.status()) and s.apply_error and s)
    assert "snapshot" in st.apply_error and not st.ready
    with pytest.raises(grpc.RpcError) as err:  # reads refuse rather than serve a state it cannot trust
        node.ns.GetKv(api_pb2.GetKvRequest(namespace="n", key="k1"), timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_a_restart_loads_its_own_snapshot_in_place_without_warnings(make_cluster) -> None:
    # A node restarts from its newest snapshot, which its Raft dump is a hard link of: the store verifies
    # that file in place. Once it re-imported it, leaving a .tmp-import-* link behind, and every restart
    # logged "replacing existing snapshot" and "removed leftover temp file".
    c, node, snap = _one_node_with_a_snapshot(make_cluster)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        c.kill(node, sig)
        c.start(node)
        st = c.wait_for("the restarted node ready", lambda: (s := node.status()) and s.ready and s)
        assert st.snapshot_offset >= snap.offset
        assert node.ns.GetKv(api_pb2.GetKvRequest(namespace="n", key="k59"), timeout=5).value == "v" * 100
    left = os.listdir(f"{c.root}/n1-data/snapshots")
    assert not [name for name in left if name.startswith(".tmp-")], left
    with open(node.log_path, errors="replace") as f:
        log = f.read()
    for warning in ("replacing existing snapshot", "removed leftover temp file"):
        assert warning not in log, warning
    assert "already held here; verified it in place" in log


def test_health_check_of_a_restarting_node_goes_not_serving_then_serving(make_cluster) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    c = make_cluster()
    c.wait_ready()
    for i in range(200):
        c.leader().ns.PutKv(api_pb2.PutKvRequest(namespace="h", key=f"k{i}", value="v" * 200), timeout=5)
    node, others = c.nodes[0], c.nodes[1:]
    for n in c.nodes:
        c.kill(n, signal.SIGTERM)
    c.start(node)  # back alone: it cannot know it has caught up until a quorum answers
    statuses: list[int] = []
    opts = [("grpc.initial_reconnect_backoff_ms", 20), ("grpc.max_reconnect_backoff_ms", 100)]
    with grpc.insecure_channel(node.grpc_addr, options=opts) as ch:
        stub = health_pb2_grpc.HealthStub(ch)  # the standard service any gRPC tool or balancer asks
        request = health_pb2.HealthCheckRequest(service="")
        c.wait_for("the restarted node to answer health checks",
                   lambda: _health(stub, request) is not None, timeout=30)
        stream = stub.Watch(request, timeout=60)
        statuses.append(next(stream).status)
        time.sleep(1.0)  # still alone: still not serving
        for n in others:
            c.start(n)
        for msg in stream:
            statuses.append(msg.status)
            if msg.status == health_pb2.HealthCheckResponse.SERVING:
                break
        stream.cancel()
    assert statuses[0] == health_pb2.HealthCheckResponse.NOT_SERVING, statuses
    assert statuses[-1] == health_pb2.HealthCheckResponse.SERVING, statuses
    st = node.status()
    assert st.ready and st.apply_offset >= 200


def _health(stub, request):
    try:
        return stub.Check(request, timeout=1).status
    except grpc.RpcError:
        return None


def test_server_reflection_lets_generic_tools_discover_and_call_the_api(single) -> None:
    """What grpcurl does: discover services and message types by reflection, then call one."""
    from google.protobuf import descriptor_pool, message_factory
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

    c = single
    with grpc.insecure_channel(c.nodes[0].grpc_addr) as ch:
        db = ProtoReflectionDescriptorDatabase(ch)
        services = set(db.get_services())
        assert {"rip18.nameserver.v1.NameServer", "rip18.nameserver.v1.Admin", "grpc.health.v1.Health"} <= services
        pool = descriptor_pool.DescriptorPool(db)  # a fresh pool: nothing known but what reflection says
        method = pool.FindServiceByName("rip18.nameserver.v1.Admin").methods_by_name["Status"]
        req_cls = message_factory.GetMessageClass(method.input_type)
        resp_cls = message_factory.GetMessageClass(method.output_type)
        call = ch.unary_unary("/rip18.nameserver.v1.Admin/Status", request_serializer=req_cls.SerializeToString,
                              response_deserializer=resp_cls.FromString)
        status = call(req_cls(), timeout=5)
        assert status.ready and status.node_id == c.nodes[0].raft_addr
        # exactly the services the node answers (Log too), each answering a call made from reflection alone
        assert listed_and_answering(ch) == CORE_SERVICES


def test_nsctl_shard_on_a_node_with_one_group_says_sharding_is_not_enabled(single, capsys) -> None:
    """Until sharding's processes serve the Shards calls, a real node refuses them and nsctl says why,
    writing nothing (not an empty directory printed as if every set were placed)."""
    from nameserver.cli import nsctl
    from nameserver.cli.nsctl_shard import NOT_ENABLED

    node = single.nodes[0]
    before = node.status().end_offset
    for args in (("list",), ("assign", "b1", "1"), ("move", "b1", "1")):
        code = nsctl.main(["--endpoints", node.grpc_addr, "--timeout", "5", "shard", *args])
        out, err = capsys.readouterr()
        assert (code, out, err) == (1, "", f"error: UNIMPLEMENTED: {NOT_ENABLED}\n"), args
    assert node.status().end_offset == before


def test_a_node_with_one_group_refuses_the_move_duty_s_admin_calls_by_field(single) -> None:
    """Admin.MoveSet, a pinning AssignSet and ProposeStep (a move's step, written as made) belong to a
    sharded node's cores: a one-group node refuses them naming the field, and nothing enters its log."""
    from nameserver.pb import shards_pb2
    from raftlog.pb import entry_pb2

    node = single.nodes[0]
    before = node.status().end_offset
    step = entry_pb2.Batch(records=[entry_pb2.Record(type=1, op=entry_pb2.OP_PUT, key="shard/b1", value=b"")])
    for call, request, field_name in (
            (node.admin.MoveSet, shards_pb2.ShardPlacement(broker_name="b1", group=1), "broker_name"),
            (node.admin.AssignSet, api_pb2.AssignSetRequest(broker_name="b1", pin=True, group=1), "broker_name"),
            (node.admin.ProposeStep, api_pb2.ProposeStepRequest(batch=step.SerializeToString()), "batch"),
            (node.admin.MoveSet, shards_pb2.ShardPlacement(broker_name="", group=1), "broker_name")):
        with pytest.raises(grpc.RpcError) as err:
            call(request, timeout=5)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert (err.value.details() or "").startswith(f"{field_name}: "), err.value.details()
    assert node.status().end_offset == before


def _counter(node, name: str) -> float:
    with urllib.request.urlopen(f"http://{node.metrics_addr}/metrics", timeout=5) as resp:
        return sum(s.value for f in text_string_to_metric_families(resp.read().decode())
                   for s in f.samples if s.name == name)


def test_a_dead_leaders_closed_links_start_the_election_not_the_followers_timers(make_cluster) -> None:
    """A leader process that exits closes its Raft links at once. Its followers then campaign a minimum
    election timeout (plus a heartbeat) after its last append, instead of waiting out random timers,
    here drawn from 0.4-8 s: without the link check, both survivors' timers are past 3 s more often
    than not."""
    c = make_cluster(metrics=True, security={"raft": {"election_max_ms": 8000}})
    leader = c.wait_ready()
    term = leader.status().term
    survivors = [n for n in c.nodes if n is not leader]
    c.kill(leader)
    t0 = time.monotonic()
    new = c.wait_ready(survivors, timeout=30)
    elected_after = time.monotonic() - t0
    assert new.status().term == term + 1  # one election, no split vote
    assert all(_counter(n, "nameserver_leader_links_lost_total") >= 1 for n in survivors)
    assert elected_after < 3.0, f"a new leader only after {elected_after:.2f} s: the followers' timers ran out"


def test_a_follower_paused_past_the_election_timeout_does_not_depose_the_leader(make_cluster) -> None:
    """Pre-vote: a starved or cut-off follower asks before campaigning, and a live leader says no."""
    c = make_cluster()
    leader = c.wait_ready()
    term = leader.status().term
    follower = c.followers()[0]
    follower.proc.send_signal(signal.SIGSTOP)
    time.sleep(5.0)  # past the election timeout and pysyncobj's 3.5 s link timeout: the leader drops the link
    retry(lambda: leader.ns.PutKv(api_pb2.PutKvRequest(namespace="p", key="during", value="v"), timeout=2))
    follower.proc.send_signal(signal.SIGCONT)
    time.sleep(3.0)  # its timer has long expired: without pre-vote it would campaign at term + 1
    sts = c.wait_converged(c.nodes)
    assert {s.term for s in sts} == {term}, [s.term for s in sts]
    assert leader.status().role == api_pb2.ROLE_LEADER


# `make test-slow` (~20 s): make test checks the same rule on the liveness table with an injected clock
# (tests/unit/test_liveness.py: a 3-node rotation every 1.2 s under a 3 s timeout).
@pytest.mark.slow
def test_elections_faster_than_a_timeout_neither_keep_a_dead_broker_nor_expel_a_live_one(make_cluster) -> None:
    """Leadership moves every 1.2 s (a SIGKILL first, then transfers), under the brokers' 3 s timeout. The
    broker that went silent is still expired within its timeout plus SLACK_S (a scan interval, the
    followers' sync interval, an election and the removal's commit); the one that beats a single
    node (a follower at first) survives every change. Before followers synced the leader's silences, each
    new leader restarted every clock and the silent broker stayed routed as long as the elections went on."""
    timeout_ms, every_s, slack_s = 3000, 1.2, 2.0
    c = make_cluster(scan_interval_ms=500)
    leader = c.wait_ready()
    beaten = c.followers()[0]  # the only node the live broker talks to
    reg = lambda name, addr: retry(lambda: beaten.ns.RegisterBroker(  # noqa: E731
        register_request("C", name, addr, ["T"], timeout_ms=timeout_ms), timeout=10))
    reg("broker-live", "10.0.0.8:10911")
    beat = api_pb2.HeartbeatRequest(heartbeats=[api_pb2.BrokerHeartbeat(
        cluster_name="C", broker_name="broker-live", broker_addr="10.0.0.8:10911")])
    stop = threading.Event()

    def beat_loop() -> None:
        while not stop.wait(0.3):
            with contextlib.suppress(grpc.RpcError):
                beaten.ns.Heartbeat(beat, timeout=1)

    beater = threading.Thread(target=beat_loop, daemon=True)
    beater.start()
    try:
        offset = reg("broker-dead", "10.0.0.9:10911").offset
        silent_from = time.monotonic()

        def names() -> list[str] | None:
            with contextlib.suppress(grpc.RpcError):
                route = beaten.ns.GetRoute(api_pb2.GetRouteRequest(topic="T", min_offset=offset), timeout=2)
                return sorted(b.broker_name for b in route.route.broker_datas)
            return None

        changes, next_change, expired_after = 0, silent_from + 1.0, None
        while time.monotonic() - silent_from < 4 * timeout_ms / 1000:
            now = time.monotonic()
            if now >= next_change:
                current = c.leader()
                if current is not None and changes == 0 and current is not beaten:
                    c.kill(current)  # the first change: the leader dies
                elif current is not None:
                    target = next(n for n in c.nodes if n.alive and n is not current)
                    with contextlib.suppress(grpc.RpcError):
                        target.admin.TransferLeadership(
                            api_pb2.TransferLeadershipRequest(node_id=target.raft_addr), timeout=2)
                changes += current is not None
                next_change = now + every_s
            seen = names()
            if seen is not None and "broker-dead" not in seen:
                assert seen == ["broker-live"], seen
                expired_after = time.monotonic() - silent_from
                break
            time.sleep(0.1)
        assert expired_after is not None, f"silent broker still routed after {changes} leader changes"
        assert expired_after <= timeout_ms / 1000 + slack_s, f"expired only after {expired_after:.1f} s"
        assert changes >= 2, "the leader changed too seldom to test anything"
        end = time.monotonic() + timeout_ms / 1000  # more changes: the live broker survives them all
        while time.monotonic() < end:
            if time.monotonic() >= next_change and (current := c.leader()) is not None:
                target = next(n for n in c.nodes if n.alive and n is not current)
                with contextlib.suppress(grpc.RpcError):
                    target.admin.TransferLeadership(
                        api_pb2.TransferLeadershipRequest(node_id=target.raft_addr), timeout=2)
                next_change = time.monotonic() + every_s
            assert names() in (None, ["broker-live"])
            time.sleep(0.2)
        assert leader is not None
    finally:
        stop.set()
        beater.join()
