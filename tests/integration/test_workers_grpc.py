"""gRPC served by worker processes ([node] worker_processes = 2) on a real 3-node cluster in secure mode:
mutual TLS with the node's certificate, roles from client certificates, tokens on top.

The core serves gRPC only on its private socket; the workers hold the public port. A read answered by a
worker is proven its own by the core's gRPC counter (which counts every call the core serves, the
forwarded ones included) and by the worker's CPU time; which process holds a connection is read from
the kernel (/proc: the server end of the connection's port among a process's descriptors).
"""

from __future__ import annotations

import os
import secrets
import signal
import stat
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from nameserver import headers, tlsconf
from nameserver.api.auth import hash_token
from nameserver.pb import api_pb2, api_pb2_grpc
from tests.certs import CertFiles, TestCA, write_private
from tests.cluster import Cluster, NodeProc, register_request
from tests.procnet import children, listener_pids, socket_inodes, tcp_sockets

pytestmark = pytest.mark.cluster

WORKERS = 2
ESTABLISHED = 0x01
NS = api_pb2.DESCRIPTOR.services_by_name["NameServer"].full_name


@dataclass
class Env:
    cluster: Cluster
    ca_file: str
    certs: dict[str, CertFiles]
    admin_token: str

    def channel(self, node: NodeProc, who: str, token: str | None = None, fresh: bool = False) -> grpc.Channel:
        """A channel presenting `who`'s certificate (and `token`); `fresh`: its own connection, not one
        shared with other channels to the same address."""
        opts = [("grpc.use_local_subchannel_pool", 1)] if fresh else []
        return tlsconf.open_channel(node.grpc_addr, tls=True, ca_file=self.ca_file, cert_file=self.certs[who].cert,
                                    key_file=self.certs[who].key, token=token, options=opts)

    def ns(self, node: NodeProc, who: str, token: str | None = None, fresh: bool = False) -> Any:
        return api_pb2_grpc.NameServerStub(self.channel(node, who, token, fresh))


def port_of(node: NodeProc) -> int:
    return int(node.grpc_addr.rsplit(":", 1)[1])


def grpc_listeners(node: NodeProc) -> list[int]:
    assert node.proc is not None
    return listener_pids(node.proc.pid, port_of(node))


def served_by(node: NodeProc) -> dict[int, int]:
    """Of this test process's connections to the node's gRPC port: how many each of its processes holds."""
    assert node.proc is not None
    mine = socket_inodes(os.getpid())
    ports = {lport for lport, rport, state, inode in tcp_sockets()
             if rport == port_of(node) and state == ESTABLISHED and inode in mine}
    ends = {inode for lport, rport, state, inode in tcp_sockets()
            if lport == port_of(node) and rport in ports and state == ESTABLISHED}
    return {pid: len(socket_inodes(pid) & ends) for pid in [node.proc.pid, *children(node.proc.pid)]}


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def core_calls(node: NodeProc, method: str) -> float:
    """Calls of `method` the node's core served (its /metrics), whatever their status."""
    total = 0.0
    with urllib.request.urlopen(f"http://{node.metrics_addr}/metrics", timeout=5) as resp:
        for family in text_string_to_metric_families(resp.read().decode()):
            for sample in family.samples:
                if sample.name == "nameserver_grpc_handled_total" and sample.labels.get("method") == method:
                    total += sample.value
    return total


def refused(call: Callable[[], Any]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as err:
        call()
    return err.value.code(), err.value.details() or ""


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    root = str(tmp_path_factory.mktemp("workers-grpc"))
    ca = TestCA(os.path.join(root, "pki"))
    certs = {"node": ca.node("node")} | {cn: ca.issue(cn) for cn in ("broker", "client", "admin", "nobody")}
    admin_token = secrets.token_urlsafe(24)
    password = write_private(root, "raft.pw", secrets.token_urlsafe(24))
    tokens = write_private(root, "tokens.toml", f'[tokens]\n"{hash_token(admin_token)}" = "admin"\n')
    security = {"security": {"mode": "secure"}, "raft": {"password_file": password},
                "tls": {"cert_file": certs["node"].cert, "key_file": certs["node"].key, "ca_file": ca.ca_file,
                        "client_auth": "require"},
                "auth": {"cert_roles": {"broker": "broker", "client": "client", "admin": "admin", "node": "peer"},
                         "tokens_file": tokens}}
    cluster = Cluster(root, 3, metrics=True, security=security, worker_processes=WORKERS,
                      connect=lambda addr, opts=(): tlsconf.open_channel(
                          addr, tls=True, ca_file=ca.ca_file, cert_file=certs["admin"].cert,
                          key_file=certs["admin"].key, options=opts))
    cluster.start()
    try:
        cluster.wait_ready(timeout=60)
        for n in cluster.nodes:
            cluster.wait_for(f"{n.name}'s {WORKERS} workers on its gRPC port",
                             lambda n=n: len(grpc_listeners(n)) == WORKERS, timeout=60)
        e = Env(cluster, ca.ca_file, certs, admin_token)
        reg = e.ns(cluster.nodes[0], "broker").RegisterBroker(
            register_request("CG", "bg", "127.0.0.1:10911", ["TopicG"]), timeout=10)
        cluster.wait_for("every node applied the seed", lambda: all(
            st is not None and st.apply_offset >= reg.offset for st in cluster.statuses()))
        yield e
    finally:
        cluster.stop()


def test_reads_are_answered_by_the_workers_and_the_core_holds_no_public_port(env: Env) -> None:
    for node in env.cluster.nodes:
        assert node.proc is not None
        core, workers = node.proc.pid, children(node.proc.pid)
        assert sorted(grpc_listeners(node)) == sorted(workers), "only the workers listen on the gRPC port"
        sock = os.path.join(env.cluster.root, f"{node.name}-data", "channel", "grpc.sock")
        assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(os.path.dirname(sock)).st_mode) == 0o700
        stubs = [env.ns(node, "client", fresh=True) for _ in range(12)]
        for stub in stubs:  # each its own connection, spread by the kernel over the workers
            stub.GetClusterInfo(api_pb2.GetClusterInfoRequest(), timeout=10)
        spread = served_by(node)
        assert spread[core] == 0 and all(spread[w] >= 1 for w in workers), spread
        before, cpu = core_calls(node, "GetRoute"), {w: cpu_s(w) for w in workers}
        for _ in range(25):
            for stub in stubs:
                reply = stub.GetRoute(api_pb2.GetRouteRequest(topic="TopicG"), timeout=10)
                assert [b.broker_name for b in reply.route.broker_datas] == ["bg"]
        # the core served none of them (its counter counts every call it serves, forwarded or not) ...
        assert core_calls(node, "GetRoute") == before
        # ... and every worker worked
        assert all(cpu_s(w) > cpu[w] for w in workers), {w: cpu_s(w) - cpu[w] for w in workers}
        missing = refused(lambda stub=stubs[0]: stub.GetRoute(api_pb2.GetRouteRequest(topic="NoSuchTopicG"),
                                                               timeout=10))
        assert missing == (grpc.StatusCode.NOT_FOUND, "topic NoSuchTopicG does not exist")


def test_calls_through_workers_are_decided_as_direct_ones(env: Env) -> None:
    """Refusals are the core's own words; a write from a client certificate's caller reaches the core
    with that caller's identity (the core refuses calls it cannot attribute), and a stream passes through."""
    node = env.cluster.nodes[1]
    put = api_pb2.PutKvRequest(namespace="wg", key="k", value="v")
    assert refused(lambda: env.ns(node, "nobody").GetRoute(api_pb2.GetRouteRequest(topic="TopicG"), timeout=10)) == (
        grpc.StatusCode.PERMISSION_DENIED, "certificate 'nobody' has no role")
    assert refused(lambda: env.ns(node, "client").PutKv(put, timeout=10)) == (
        grpc.StatusCode.PERMISSION_DENIED, f"role client (cert:client) may not call /{NS}/PutKv")
    assert refused(lambda: env.ns(node, "admin", token="wrong").PutKv(put, timeout=10)) == (
        grpc.StatusCode.UNAUTHENTICATED, "unknown token")
    spoofed = env.channel(node, "broker").unary_unary(
        f"/{NS}/PutKv", request_serializer=api_pb2.PutKvRequest.SerializeToString,
        response_deserializer=api_pb2.WriteReply.FromString)
    assert refused(lambda: spoofed(put, timeout=10, metadata=((headers.FORWARDED, "1"),))) == (
        grpc.StatusCode.PERMISSION_DENIED, "only peer nodes may send forwarded calls")
    # forwarded to the core (on a follower, on to the leader), as the certificate's caller
    before = core_calls(node, "PutKv")
    assert env.ns(node, "admin").PutKv(put, timeout=10).offset > 0
    assert core_calls(node, "PutKv") == before + 1
    admin = api_pb2_grpc.AdminStub(env.channel(node, "client"))
    assert refused(lambda: admin.TakeSnapshot(api_pb2.TakeSnapshotRequest(), timeout=10))[0] == (
        grpc.StatusCode.PERMISSION_DENIED)
    assert api_pb2_grpc.AdminStub(env.channel(node, "admin")).Status(api_pb2.StatusRequest(), timeout=10).ready
    watch = env.ns(node, "client").Watch(api_pb2.WatchRequest(key_prefixes=["kv/wg/"]), timeout=10)
    first = next(iter(watch))
    assert first.initial_state and [e.key for e in first.events] == ["kv/wg/k"]
    watch.cancel()


def test_exactly_once_sessions_through_workers(env: Env) -> None:
    """A retried write is replayed, not applied again, whichever worker or node the retry reaches; a
    session belongs to the caller the core saw (a certificate and a token of the same role are two)."""
    a, b = env.cluster.nodes[0], env.cluster.nodes[2]
    session = ((headers.CLIENT_ID, "wg-session"), (headers.CLIENT_SEQ, "1"))
    first = env.ns(a, "admin").PutKv(api_pb2.PutKvRequest(namespace="wgs", key="k", value="first"),
                                     timeout=10, metadata=session)
    later = env.ns(a, "admin").PutKv(api_pb2.PutKvRequest(namespace="wgs", key="k", value="later"), timeout=10)
    for node in (a, b):  # the retry, through other connections (other workers, another node)
        retry = env.ns(node, "admin", fresh=True).PutKv(api_pb2.PutKvRequest(namespace="wgs", key="k", value="first"),
                                                        timeout=10, metadata=session)
        assert retry.offset == first.offset
    got = env.ns(b, "client").GetKv(api_pb2.GetKvRequest(namespace="wgs", key="k", min_offset=later.offset), timeout=10)
    assert got.value == "later", "the retry was applied again"
    # the caller the core sees is the worker's to say: a client's own claim is dropped (here: to be the
    # node itself, whose sessions are not this certificate's)
    spoofed = ((headers.WORKER_CALLER, '{"self": true}'), *session)
    for node in (a, b):
        retry = env.ns(node, "admin", fresh=True).PutKv(api_pb2.PutKvRequest(namespace="wgs", key="k", value="first"),
                                                        timeout=10, metadata=spoofed)
        assert retry.offset == first.offset
    other = env.ns(a, "nobody", token=env.admin_token).PutKv(
        api_pb2.PutKvRequest(namespace="wgs", key="k2", value="x"), timeout=10, metadata=session)
    assert other.offset > later.offset, "another caller's write was answered from the certificate's session"


def test_reads_through_a_worker_see_writes_acknowledged_before(env: Env) -> None:
    """LINEARIZABLE: a read index from the worker's core (on a follower: from the leader), then the
    replica waits for it. SERIALIZABLE on the connection that wrote: the answer left once the worker's
    replica had the core's state as it answered."""
    leader = env.cluster.leader()
    assert leader is not None
    followers = [n for n in env.cluster.nodes if n is not leader]
    writer = env.ns(leader, "admin")
    readers = [env.ns(n, "client") for n in env.cluster.nodes]
    for i in range(8):
        bound = writer.BindQueue(api_pb2.BindQueueRequest(topic="TopicLin", queue_id=i, owner=f"o{i}"), timeout=10)
        for reader in readers:
            got = reader.GetBinding(api_pb2.GetBindingRequest(topic="TopicLin", queue_id=i,
                                                              consistency=api_pb2.LINEARIZABLE), timeout=10)
            assert got.found and got.binding.owner == f"o{i}" and got.apply_offset >= bound.offset
    own = env.ns(followers[0], "admin")
    for i in range(10):
        own.PutKv(api_pb2.PutKvRequest(namespace="wgr", key="k", value=str(i)), timeout=10)
        assert own.GetKv(api_pb2.GetKvRequest(namespace="wgr", key="k"), timeout=10).value == str(i)


def test_a_killed_worker_is_restarted_and_grpc_clients_reconnect(env: Env) -> None:
    node = env.cluster.nodes[2]
    stubs = [env.ns(node, "client", fresh=True) for _ in range(8)]
    for stub in stubs:
        stub.GetRoute(api_pb2.GetRouteRequest(topic="TopicG"), timeout=10)
    victim = next(pid for pid, held in served_by(node).items() if held)
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 20
    for stub in stubs:  # each channel reconnects (to a worker alive) and its calls succeed again
        while True:
            try:
                stub.GetRoute(api_pb2.GetRouteRequest(topic="TopicG"), timeout=5)
                break
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.UNAVAILABLE and time.monotonic() < deadline, exc
                time.sleep(0.05)
    env.cluster.wait_for("the worker restarted and listening",
                         lambda: len(grpc_listeners(node)) == WORKERS and victim not in grpc_listeners(node))
    for _ in range(6):
        assert env.ns(node, "client", fresh=True).GetRoute(api_pb2.GetRouteRequest(topic="TopicG"), timeout=10)
