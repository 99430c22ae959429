"""A read replica on another machine (`nameserver replica --config`, docs/operations.md "Read replicas on
other machines"): real processes, a 3-voter cluster and a replica following all three voters.

It answers reads as the voters do (the same digest at the same offset), passes a write on and reads it back,
moves to another voter when its own is killed, is listed by `nsctl status` while it runs (and not once it
stopped), and refuses reads naming why while its voters are silent, then answers again."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc
import pytest
from fakebroker import read_frame
from grpc_health.v1 import health_pb2, health_pb2_grpc

from nameserver.localports import free_ports
from nameserver.pb import api_pb2, api_pb2_grpc
from nameserver.remoting import codes, frame
from nameserver.remoting.command import Command
from nameserver.replica.voters import FollowerPreference
from tests.cluster import ROOT, Cluster, NodeProc, register_request, retry, running

pytestmark = pytest.mark.cluster

SILENCE_MS = 1500  # [replica] max_silence_ms: short, so a paused cluster is noticed within seconds


@dataclass
class Replica:
    grpc_addr: str
    remoting_addr: str
    log_path: str
    proc: subprocess.Popen
    channel: grpc.Channel

    @property
    def ns(self) -> api_pb2_grpc.NameServerStub:
        return api_pb2_grpc.NameServerStub(self.channel)

    def health(self) -> int:
        return int(health_pb2_grpc.HealthStub(self.channel).Check(health_pb2.HealthCheckRequest(), timeout=2).status)

    def status(self) -> api_pb2.NodeStatus:
        return api_pb2_grpc.AdminStub(self.channel).Status(api_pb2.StatusRequest(), timeout=2)

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        self.channel.close()


def start_replica(root: str, name: str, voters: list[NodeProc], extra: str = "",
                  connect: Callable[[str, list], grpc.Channel] | None = None, remoting_role: str = "") -> Replica:
    """A read replica process following `voters`; `extra`: more of its TOML (security); `connect(addr,
    options)`: how the test reaches it (default plaintext)."""
    grpc_port, remoting_port = free_ports(2)
    config = os.path.join(root, f"{name}.toml")
    with open(config, "w") as f:
        role = f'role = "{remoting_role}"\n' if remoting_role else ""
        f.write(f'[node]\ngrpc_addr = "127.0.0.1:{grpc_port}"\n\n'
                f'[remoting]\nlisten = "127.0.0.1:{remoting_port}"\n{role}\n'
                f'[replica]\nfollow = {json.dumps([v.grpc_addr for v in voters])}\nmax_silence_ms = {SILENCE_MS}\n\n'
                + extra)
    log_path = os.path.join(root, f"{name}.log")
    with open(log_path, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "nameserver.cli.serve", "replica", "--config", config],
                                stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=os.environ | {"PYTHONPATH": ROOT})
    opts = [("grpc.initial_reconnect_backoff_ms", 100), ("grpc.max_reconnect_backoff_ms", 500)]
    addr = f"127.0.0.1:{grpc_port}"
    channel = connect(addr, opts) if connect is not None else grpc.insecure_channel(addr, options=opts)
    return Replica(addr, f"127.0.0.1:{remoting_port}", log_path, proc, channel)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running(Cluster(str(tmp_path_factory.mktemp("remote-replica")), 3, remoting=True), timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def replica(cluster: Cluster) -> Iterator[Replica]:
    r = start_replica(cluster.root, "replica", cluster.nodes)
    try:
        wait_until("the replica is ready", lambda: _ready(r))
        yield r
    finally:
        r.stop()


def _ready(r: Replica) -> bool:
    try:
        return r.status().ready
    except grpc.RpcError:
        return False


def wait_until(what: str, cond: Callable[[], object], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def remoting_call(addr: str, code: int, ext: dict[str, str]) -> Command:
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(frame.encode(Command(code=code, version=479, opaque=1, ext_fields=ext)))
        payload = read_frame(sock)
    assert payload is not None
    return frame.decode(payload)


def register(node: api_pb2_grpc.NameServerStub, broker: str, topic: str) -> int:
    req = register_request("CR", broker, f"10.9.0.{ord(broker[-1])}:10911", [topic])
    return int(retry(lambda: node.RegisterBroker(req, timeout=10)).offset)


def route(stub: api_pb2_grpc.NameServerStub, topic: str, min_offset: int) -> api_pb2.TopicRoute:
    return retry(lambda: stub.GetRoute(api_pb2.GetRouteRequest(topic=topic, min_offset=min_offset), timeout=5)).route


def nsctl_status(nodes: list[NodeProc]) -> list[dict]:
    cmd = [sys.executable, "-m", "nameserver.cli.nsctl", "--endpoints", ",".join(n.grpc_addr for n in nodes),
           "--json", "status"]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=60,
                         env=os.environ | {"PYTHONPATH": ROOT})
    return list(json.loads(res.stdout)["nodes"])


def test_replica_answers_reads_as_the_voters(cluster: Cluster, replica: Replica) -> None:
    leader = cluster.wait_ready()
    offset = register(leader.ns, "rr-a", "TopicRR1")
    assert route(replica.ns, "TopicRR1", offset) == route(leader.ns, "TopicRR1", offset)
    st = replica.status()
    assert st.role == api_pb2.ROLE_REPLICA and st.apply_offset >= offset and st.ready
    assert replica.health() == health_pb2.HealthCheckResponse.SERVING
    voter = next(n for n in cluster.nodes if n.grpc_addr == st.following)
    digest = api_pb2_grpc.LogStub(voter._channel()).DigestAt(api_pb2.DigestAtRequest(offset=st.apply_offset),
                                                              timeout=5).digest
    assert st.digest == digest
    # remoting: a route read answered from the replica as a voter answers it; a registration is for voters
    ours = remoting_call(replica.remoting_addr, codes.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicRR1"})
    theirs = remoting_call(leader.remoting_addr, codes.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicRR1"})
    assert ours.code == codes.SUCCESS and ours.body == theirs.body
    refused = remoting_call(replica.remoting_addr, codes.UNREGISTER_BROKER,
                            {"brokerName": "rr-a", "brokerAddr": f"10.9.0.{ord('a')}:10911", "clusterName": "CR",
                             "brokerId": "0"})
    assert refused.code == codes.SYSTEM_ERROR and "read replica" in (refused.remark or "")


def test_a_write_through_the_replica_is_read_back_there(replica: Replica) -> None:
    offset = register(replica.ns, "rr-b", "TopicRR2")  # passed on to the voter it follows
    assert offset > 0
    got = route(replica.ns, "TopicRR2", offset)
    assert [b.broker_name for b in got.broker_datas] == ["rr-b"]
    # a LINEARIZABLE read takes its read index from the voters' leader
    reply = replica.ns.GetBinding(api_pb2.GetBindingRequest(topic="TopicRR2", queue_id=0,
                                                            consistency=api_pb2.LINEARIZABLE), timeout=5)
    assert not reply.found


def listed(cluster: Cluster) -> set[str]:
    """The read replicas the live voters say follow them."""
    return {addr for n in cluster.nodes if n.alive for st in [n.status()] if st for addr in st.read_replicas}


def test_nsctl_status_lists_replicas_while_they_run(cluster: Cluster, replica: Replica) -> None:
    second = start_replica(cluster.root, "replica2", cluster.nodes)  # no voter's config names it
    try:
        wait_until("the voters list both replicas", lambda: listed(cluster) == {replica.grpc_addr, second.grpc_addr})
        rows = {n.get("grpc_addr"): n for n in nsctl_status(cluster.nodes) if n.get("role") == "replica"}
        assert set(rows) == {replica.grpc_addr, second.grpc_addr}
        row = rows[replica.grpc_addr]
        assert int(row["apply_offset"]) > 0 and row["digest"] and "lag" in row
        assert row["following"] in {n.grpc_addr for n in cluster.nodes}
    finally:
        second.stop()  # removing a replica: stop its process; the voters forget it when its stream ends
    wait_until("the stopped replica is no longer listed", lambda: listed(cluster) == {replica.grpc_addr})


def test_the_replica_moves_off_a_killed_voter(cluster: Cluster, replica: Replica) -> None:
    followed = replica.status().following
    victim = next(n for n in cluster.nodes if n.grpc_addr == followed)
    cluster.kill(victim)
    try:
        wait_until("the replica follows another voter", lambda: _ready(replica)
                   and replica.status().following != followed)
        survivor = next(n for n in cluster.nodes if n is not victim)
        offset = register(survivor.ns, "rr-c", "TopicRR3")
        assert [b.broker_name for b in route(replica.ns, "TopicRR3", offset).broker_datas] == ["rr-c"]
    finally:
        cluster.start(victim)
        cluster.wait_converged()


def test_the_replica_refuses_reads_while_its_voters_are_silent(cluster: Cluster, replica: Replica) -> None:
    for n in cluster.nodes:
        cluster.kill(n, signal.SIGSTOP)
    try:
        def refused() -> str:
            try:
                replica.ns.GetRoute(api_pb2.GetRouteRequest(topic="TopicRR1"), timeout=2)
            except grpc.RpcError as exc:
                return f"{exc.code().name}: {exc.details()}" if exc.code() == grpc.StatusCode.UNAVAILABLE else ""
            return ""
        wait_until("the replica refuses reads", refused, timeout=SILENCE_MS / 1000 + 10)
        assert "not ready" in refused() and "has not heard from" in refused()
        resp = remoting_call(replica.remoting_addr, codes.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicRR1"})
        assert resp.code != codes.SUCCESS and "has not heard from" in (resp.remark or "")
        assert "has not heard from" in replica.status().not_ready_reason
        assert replica.health() == health_pb2.HealthCheckResponse.NOT_SERVING  # a load balancer moves off it too
        # and the cause, once the silent stream is cut: the silence itself, not the cut's "CANCELLED"
        wait_until("the reason names the silence", lambda: "no message from" in replica.status().not_ready_reason,
                   timeout=10)
        wait_until("its log says why", lambda: "read replica refuses reads: replica has not heard" in replica.log())
    finally:
        for n in cluster.nodes:
            cluster.kill(n, signal.SIGCONT)
    wait_until("the replica answers again", lambda: _ready(replica), timeout=30)
    assert route(replica.ns, "TopicRR1", 0).broker_datas
    assert replica.health() == health_pb2.HealthCheckResponse.SERVING
    wait_until("its log says so", lambda: "read replica answers reads again" in replica.log())


def test_a_replica_moves_off_the_leader_unless_told_to_follow_it(cluster: Cluster) -> None:
    """[replica] follow_leader false (the default): a replica told to follow the leader first moves to a
    follower, which spares the leader a stream; with follow_leader = true it stays."""
    leader = cluster.wait_ready()
    order = [leader] + [n for n in cluster.nodes if n is not leader]
    moving = start_replica(cluster.root, "replica-moves", order)
    staying = start_replica(cluster.root, "replica-stays", order, extra="follow_leader = true\n")  # in [replica]
    try:
        wait_until("both replicas ready", lambda: _ready(moving) and _ready(staying), timeout=30)
        wait_until("the replica follows a follower", lambda: moving.status().following != leader.grpc_addr,
                   timeout=FollowerPreference.CHECK_S + 10)
        assert moving.status().following in {n.grpc_addr for n in order[1:]}
        assert f"moves from {leader.grpc_addr} (the leader)" in moving.log()
        offset = register(leader.ns, "rr-f", "TopicRR4")  # and it still sees the leader's writes
        assert [b.broker_name for b in route(moving.ns, "TopicRR4", offset).broker_datas] == ["rr-f"]
        time.sleep(FollowerPreference.CHECK_S + 1)  # a check has come by on the other one too
        assert staying.status().following == leader.grpc_addr and "moves from" not in staying.log()
    finally:
        moving.stop()
        staying.stop()
