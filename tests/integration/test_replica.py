"""Read replicas (nameserver/replica) following real node processes over Log.Follow: the same state and
digest at the same offset as the core, the core's read answers through NameServerService(ReplicaNode),
and recovery when the core is killed, restarted or has compacted its log."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator

import grpc
import pytest

from nameserver.api.auth import NAMESERVER_SERVICE
from nameserver.api.inprocess import InProcessStub
from nameserver.api.service import NameServerService
from nameserver.config import Member, NodeConfig
from nameserver.pb import api_pb2, api_pb2_grpc
from nameserver.replica import ReadReplica, ReplicaNode
from tests.cluster import Cluster, NodeProc, register_request, retry, running

pytestmark = pytest.mark.cluster

SNAPSHOT_EVERY = 150  # small: a restarted core starts from a snapshot newer than a stopped replica


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running(Cluster(str(tmp_path_factory.mktemp("replica")), 3, snapshot_every_entries=SNAPSHOT_EVERY)) as c:
        yield c


def channel_to(addr: str) -> grpc.Channel:
    return grpc.insecure_channel(addr, options=[("grpc.initial_reconnect_backoff_ms", 100),
                                                ("grpc.min_reconnect_backoff_ms", 100),
                                                ("grpc.max_reconnect_backoff_ms", 500)])


def log_stub(node: NodeProc) -> api_pb2_grpc.LogStub:
    return api_pb2_grpc.LogStub(node._channel())


def core_digest(node: NodeProc, offset: int) -> str:
    return retry(lambda: log_stub(node).DigestAt(api_pb2.DigestAtRequest(offset=offset), timeout=5)).digest


def wait_until(what: str, cond: Callable[[], object], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def caught_up(replica: ReadReplica, offset: int) -> Callable[[], bool]:
    return lambda: replica.ready and replica.offset >= offset and replica.lag == 0


def replica_digest_at(replica: ReadReplica, offset: int) -> str | None:
    with replica.lock:
        return replica.state.kv.digest_at(offset)


class Writes:
    """Registrations and KV puts through the leader on two threads; the highest offset acknowledged."""

    def __init__(self, c: Cluster, tag: str) -> None:
        self.c, self.tag = c, tag
        self.stop = threading.Event()
        self.top = 0
        self.errors: list[BaseException] = []
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(fn,), daemon=True)
                         for fn in (self._register, self._put_kv)]

    def _note(self, offset: int) -> None:
        with self._lock:
            self.top = max(self.top, offset)

    def _register(self, i: int) -> int:
        leader = self.c.leader() or self.c.nodes[0]
        req = register_request("C", f"{self.tag}-b{i % 7}", f"10.0.{i % 7}.1:10911",
                               [f"{self.tag}-t{i % 11}", f"{self.tag}-t{(i + 3) % 11}"], counter=i + 1)
        return retry(lambda: leader.ns.RegisterBroker(req, timeout=10)).offset

    def _put_kv(self, i: int) -> int:
        leader = self.c.leader() or self.c.nodes[0]
        req = api_pb2.PutKvRequest(namespace=f"{self.tag}-ns", key=f"k{i % 13}", value=f"v{i}")
        return retry(lambda: leader.ns.PutKv(req, timeout=10)).offset

    def _run(self, fn: Callable[[int], int]) -> None:
        i = 0
        while not self.stop.is_set():
            try:
                self._note(fn(i))
            except BaseException as exc:  # reported by the test
                self.errors.append(exc)
                return
            i += 1

    def __enter__(self) -> Writes:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self._threads:
            t.join(timeout=20)
        assert not self.errors, self.errors


def replica_of(node: NodeProc, name: str) -> ReadReplica:
    r = ReadReplica(node.grpc_addr, channel_to, name=name)
    r.start()
    return r


def read_stub(replica: ReadReplica, node: NodeProc) -> InProcessStub:
    cfg = NodeConfig(raft_addr=node.raft_addr, grpc_addr=node.grpc_addr, data_dir="unused",
                     members=[Member(node.raft_addr, node.grpc_addr)])
    # NameServerService is annotated with NameServerNode; its read handlers use only what ReplicaNode has
    return InProcessStub(NameServerService(ReplicaNode(replica, cfg)), NAMESERVER_SERVICE)  # type: ignore[arg-type]


def test_replicas_of_leader_and_follower_match_the_core_digest_under_writes(cluster: Cluster) -> None:
    c = cluster
    leader = c.wait_ready()
    follower = c.followers()[0]
    of_leader, of_follower = replica_of(leader, "of-leader"), replica_of(follower, "of-follower")
    try:
        samples: list[tuple[ReadReplica, int, str]] = []
        with Writes(c, "w") as writes:
            deadline = time.monotonic() + 2.5
            while time.monotonic() < deadline:  # (offset, digest) as each replica saw them mid-stream
                for r in (of_leader, of_follower):
                    with r.lock:
                        if r.state.kv.offset:
                            samples.append((r, r.state.kv.offset, r.state.kv.digest_hex))
                time.sleep(0.1)
        top = writes.top
        assert top > 2 * SNAPSHOT_EVERY // 3, "the writers wrote too little to mean anything"
        for r in (of_leader, of_follower):
            wait_until(f"{r.name} at {top}", caught_up(r, top))
            assert replica_digest_at(r, top) == core_digest(leader, top) == core_digest(follower, top)
        assert len({s[1] for s in samples}) > 5
        for r, offset, digest in samples:  # the same digest at the same offset, all along
            assert digest == core_digest(r is of_leader and leader or follower, offset), (r.name, offset)
    finally:
        of_leader.stop()
        of_follower.stop()


def test_reads_through_replica_node_answer_as_the_core(cluster: Cluster) -> None:
    c = cluster
    leader = c.wait_ready()
    follower = c.followers()[0]
    reg = retry(lambda: leader.ns.RegisterBroker(
        register_request("RC", "rb", "10.1.0.1:10911", ["RT1", "RT2"], queues=8), timeout=10))
    put = retry(lambda: leader.ns.PutKv(api_pb2.PutKvRequest(namespace="rns", key="k", value="v"), timeout=10))
    replica = replica_of(follower, "reads")
    try:
        ns = read_stub(replica, follower)
        top = max(reg.offset, put.offset)
        # a read with min_offset waits for the replica to load and apply it (a retry while not ready)
        got = retry(lambda: ns.GetKv(api_pb2.GetKvRequest(namespace="rns", key="k", min_offset=top), timeout=10))
        assert got.value == "v" and got.apply_offset >= top
        core = follower.ns
        for topic in ("RT1", "RT2"):
            a = ns.GetRoute(api_pb2.GetRouteRequest(topic=topic, min_offset=top), timeout=5)
            b = core.GetRoute(api_pb2.GetRouteRequest(topic=topic, min_offset=top), timeout=5)
            assert a.route == b.route and len(a.route.queue_datas) == 1
        with pytest.raises(grpc.RpcError) as err:
            ns.GetRoute(api_pb2.GetRouteRequest(topic="no-such-topic"), timeout=5)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND

        def same(method: str, request: object) -> None:
            a, b = getattr(ns, method)(request, timeout=5), getattr(core, method)(request, timeout=5)
            a.ClearField("apply_offset")
            b.ClearField("apply_offset")
            assert a == b, method

        same("GetClusterInfo", api_pb2.GetClusterInfoRequest(min_offset=top))
        same("GetTopicList", api_pb2.GetTopicListRequest(kind=api_pb2.TOPIC_LIST_ALL, min_offset=top))
        same("ListKv", api_pb2.ListKvRequest(namespace="rns", min_offset=top))
        same("GetBrokerMemberGroup", api_pb2.GetBrokerMemberGroupRequest(cluster_name="RC", broker_name="rb",
                                                                         min_offset=top))
        # read-your-writes: a write on the leader, then a read at its offset on the replica waits for it
        put2 = leader.ns.PutKv(api_pb2.PutKvRequest(namespace="rns", key="k", value="v2"), timeout=10)
        got = ns.GetKv(api_pb2.GetKvRequest(namespace="rns", key="k", min_offset=put2.offset), timeout=5)
        assert got.value == "v2" and got.apply_offset >= put2.offset
        # an offset nobody wrote: refused at the call's deadline with the replica's offset in the trailer
        with pytest.raises(grpc.RpcError) as err:
            ns.GetKv(api_pb2.GetKvRequest(namespace="rns", key="k", min_offset=put2.offset + 10_000), timeout=0.5)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "below min_offset" in (err.value.details() or "")
        # bindings: SERIALIZABLE from the replica; LINEARIZABLE refused, naming why, rather than stale
        bound = retry(lambda: leader.ns.BindQueue(api_pb2.BindQueueRequest(topic="RT1", queue_id=0, owner="o"),
                                                  timeout=10))
        got_binding = ns.GetBinding(api_pb2.GetBindingRequest(topic="RT1", queue_id=0, min_offset=bound.offset,
                                                              consistency=api_pb2.SERIALIZABLE), timeout=5)
        assert got_binding.found and got_binding.binding.owner == "o"
        with pytest.raises(grpc.RpcError) as err:
            ns.GetBinding(api_pb2.GetBindingRequest(topic="RT1", queue_id=0), timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "SERIALIZABLE" in (err.value.details() or "")
        # a route cached on the replica is dropped when a record feeding it is applied
        before = ns.GetRoute(api_pb2.GetRouteRequest(topic="RT1"), timeout=5)
        reg2 = leader.ns.RegisterBroker(register_request("RC", "rb2", "10.1.0.2:10911", ["RT1"]), timeout=10)
        after = ns.GetRoute(api_pb2.GetRouteRequest(topic="RT1", min_offset=reg2.offset), timeout=5)
        assert len(before.route.queue_datas) == 1 and len(after.route.queue_datas) == 2
    finally:
        replica.stop()
    # a stopped replica is not ready: reads fail UNAVAILABLE, not stale
    stopped = read_stub(replica, follower)
    replica.max_silence_s = 0.0
    with pytest.raises(grpc.RpcError) as err:
        stopped.GetKv(api_pb2.GetKvRequest(namespace="rns", key="k"), timeout=1)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "not ready" in (err.value.details() or "")


def test_replica_survives_core_kill_and_rebootstraps_after_compaction(cluster: Cluster) -> None:
    c = cluster
    leader = c.wait_ready()
    core = c.followers()[0]
    replica = replica_of(core, "killed")
    try:
        with Writes(c, "k") as writes:
            time.sleep(0.5)
        wait_until("replica caught up", caught_up(replica, writes.top))
        assert replica.bootstraps == 1
        # the core is killed while the replica follows it, and the cluster writes on without it
        c.kill(core, signal.SIGKILL)
        with Writes(c, "k2") as writes:
            time.sleep(0.5)
        wait_until("the replica notices", lambda: not replica.ready, timeout=replica.max_silence_s + 5)
        c.start(core)
        wait_until("replica caught up after the restart", caught_up(replica, writes.top), timeout=30)
        digest = core_digest(core, writes.top)
        assert replica_digest_at(replica, writes.top) == digest == core_digest(leader, writes.top)
        assert replica.reconnects >= 1
        stopped_at, bootstraps = replica.offset, replica.bootstraps
    finally:
        replica.stop()
    # More than a snapshot's worth of writes, then a restart: the core's history starts at its snapshot,
    # newer than the stopped replica's offset, so the replica is sent a snapshot again.
    with Writes(c, "k3") as writes:
        wait_until("a snapshot's worth of writes", lambda: writes.top > stopped_at + 2 * SNAPSHOT_EVERY, timeout=30)
    c.kill(core, signal.SIGKILL)
    c.start(core)
    c.wait_converged()
    status = core.status()
    assert status is not None and status.snapshot_offset > stopped_at
    late = replica_of(core, "late")  # a new replica after the compaction
    replica.start()  # the old one resumes from its offset, older than the core's history
    try:
        for r in (replica, late):
            wait_until(f"{r.name} caught up after compaction", caught_up(r, writes.top))
            assert replica_digest_at(r, writes.top) == core_digest(core, writes.top)
        assert replica.bootstraps == bootstraps + 1 and late.bootstraps == 1
    finally:
        replica.stop()
        late.stop()


def test_in_secure_mode_only_the_peer_role_may_follow(tmp_path) -> None:
    from tests.security.attacks import secure_cluster, started

    with started(secure_cluster(str(tmp_path))) as s:
        core = s.cluster.nodes[0]
        peer = ReadReplica(core.grpc_addr, lambda addr: s.channel(core, "peer"), name="peer")
        admin = ReadReplica(core.grpc_addr, lambda addr: s.channel(core, "admin"), name="admin")
        peer.start()
        admin.start()
        try:
            status = core.status()
            assert status is not None
            wait_until("the peer's replica", caught_up(peer, status.apply_offset), timeout=30)
            assert replica_digest_at(peer, status.apply_offset) == core_digest(core, status.apply_offset)
            wait_until("the admin's refusal", lambda: "PERMISSION_DENIED" in admin.not_ready_reason())
            assert not admin.ready and admin.bootstraps == 0
            assert "may not call /rip18.nameserver.v1.Log/Follow" in admin.not_ready_reason()
        finally:
            peer.stop()
            admin.stop()
