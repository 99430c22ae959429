"""Worker processes ([node] worker_processes = 2) on a real 3-node cluster in secure mode: mutual TLS with
the node's certificate, roles from client certificates (a token on top for one caller), remoting as
the peer role (every request, as a node without [auth] serves it).

Which process holds a connection is read from the kernel: the accepted socket's inode in /proc/net/tcp,
found among the descriptors of the core or of one of its workers (its child processes). A worker's
answers are proven its own by the kernel (which process holds the connection) and by the worker's CPU
time. The node's /metrics (the core's) sums the workers' request counters with the core's: each request
is counted once, by the process its client sent it to (nameserver/ops/workermetrics.py). The core
serves gRPC only on its private socket; the workers hold the public gRPC port.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import secrets
import signal
import socket
import stat
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from fakebroker import crc32, read_frame, register_body
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from bench.load import proc_cpu_s
from bench.procnet import children, is_worker, listener_pids, listening, socket_inodes, tcp_sockets
from nameserver import config, headers, tlsconf
from nameserver.api import corelink
from nameserver.api.auth import hash_token
from nameserver.chunking import register_chunks
from nameserver.ops.workers import loading_at_once
from nameserver.pb import api_pb2, api_pb2_grpc
from nameserver.remoting import codes, frame, registerbody
from nameserver.remoting.command import Command
from nameserver.remoting.corechannel import APPLIED_FIELD, CONN_FIELD, CONNECTION_CLOSED, NOTE_ALIVE
from nameserver.remoting.handlers import REPLICA_CODES, REQUESTS
from tests.certs import CertFiles, TestCA, write_private
from tests.cluster import Cluster, NodeProc, register_request
from tests.integration.reflected import CORE_SERVICES, WORKER_SERVICES, listed_and_answering

pytestmark = pytest.mark.cluster

WORKERS = 2
TOPICS = [f"TopicW{i}" for i in range(4)]
ESTABLISHED = 0x01
NS = api_pb2.DESCRIPTOR.services_by_name["NameServer"].full_name
_opaques = itertools.count(1)


def registration(broker: str, addr: str, topics: list[str], counter: int = 1,
                 broker_id: int = 0) -> tuple[dict[str, str], bytes]:
    """A REGISTER_BROKER's extFields and body."""
    body = register_body(topics, counter, compressed=False)
    return {"brokerName": broker, "brokerAddr": addr, "clusterName": "CW", "brokerId": str(broker_id),
            "haServerAddr": "127.0.0.1:10912", "compressed": "false", "bodyCrc32": str(crc32(body))}, body


def core_call(node: NodeProc, root: str, code: int, ext: dict[str, str], body: bytes = b"") -> Command:
    """A frame sent straight to the node's core on its private remoting socket, as a worker sends one."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(os.path.join(root, f"{node.name}-data", "channel", "remoting.sock"))
        req = Command(code=code, version=479, opaque=next(_opaques), ext_fields=ext, body=body)
        sock.sendall(frame.encode(req))
        payload = read_frame(sock)
    assert payload is not None, f"the core closed its socket instead of answering code {code}"
    return frame.decode(payload)


class Conn:
    """One client connection to a node's remoting port, one request at a time."""

    def __init__(self, addr: str) -> None:
        host, port = addr.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.local_port = self.sock.getsockname()[1]

    def call(self, code: int, ext: dict[str, str], body: bytes = b"",
             serialize_type: int = codes.SERIALIZE_JSON) -> Command:
        req = Command(code=code, version=479, opaque=next(_opaques), ext_fields=ext, body=body,
                      serialize_type=serialize_type)
        self.sock.sendall(frame.encode(req))
        payload = read_frame(self.sock)
        assert payload is not None, f"connection closed instead of answering code {code}"
        resp = frame.decode(payload)
        assert resp.opaque == req.opaque and resp.is_response
        return resp

    def register(self, broker: str, addr: str, topics: list[str], counter: int = 1,
                 serialize_type: int = codes.SERIALIZE_JSON, broker_id: int = 0) -> Command:
        return self.call(codes.REGISTER_BROKER, *registration(broker, addr, topics, counter, broker_id),
                         serialize_type)

    def close(self) -> None:
        self.sock.close()


# ---- which process holds what ------------------------------------------------------------------

def port_of(node: NodeProc) -> int:
    return int(node.remoting_addr.rsplit(":", 1)[1])


def listener_owners(node: NodeProc) -> list[int]:
    """The pids (the core and its children) with a socket listening on the node's remoting port."""
    assert node.proc is not None
    return listener_pids(node.proc.pid, port_of(node))


def owner(node: NodeProc, conn: Conn) -> int:
    """The pid of the core or worker that accepted `conn` (a connection still in the accept queue has
    no process yet: asked again for a while)."""
    assert node.proc is not None
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        inodes = {inode for lport, rport, _, inode in tcp_sockets()
                  if lport == port_of(node) and rport == conn.local_port}
        for pid in [node.proc.pid, *children(node.proc.pid)]:
            if socket_inodes(pid) & inodes:
                return pid
        time.sleep(0.01)
    raise AssertionError(f"no process of {node.name} holds the connection from port {conn.local_port}")


def conns_by_owner(node: NodeProc, want_each: int = 2, limit: int = 300) -> dict[int, list[Conn]]:
    """Connections opened until each worker holds `want_each` (the kernel picks)."""
    got: dict[int, list[Conn]] = {}
    for _ in range(limit):
        c = Conn(node.remoting_addr)
        got.setdefault(owner(node, c), []).append(c)
        if len(got) == WORKERS and all(len(v) >= want_each for v in got.values()):
            return got
    raise AssertionError(f"{limit} connections did not reach every process: {({k: len(v) for k, v in got.items()})}")


def samples(node: NodeProc) -> Iterator[Sample]:
    """The node's (the core's) /metrics."""
    with urllib.request.urlopen(f"http://{node.metrics_addr}/metrics", timeout=5) as resp:
        for family in text_string_to_metric_families(resp.read().decode()):
            yield from family.samples


def metric(node: NodeProc, name: str, **labels: str) -> float:
    """A sample of the node's (the core's) /metrics; 0 when it has none yet."""
    return next((s.value for s in samples(node)
                 if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())), 0.0)


def node_calls(node: NodeProc, method: str) -> float:
    """Calls of `method` the node served (its workers and its core), whatever their status."""
    return sum(s.value for s in samples(node)
               if s.name == "nameserver_grpc_handled_total" and s.labels.get("method") == method)


def reads_counted(node: NodeProc) -> float:
    return metric(node, "nameserver_remoting_handled_total", request="105", response="0")


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


# ---- gRPC ------------------------------------------------------------------------------------------

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


def grpc_port_of(node: NodeProc) -> int:
    return int(node.grpc_addr.rsplit(":", 1)[1])


def grpc_listeners(node: NodeProc) -> list[int]:
    assert node.proc is not None
    return listener_pids(node.proc.pid, grpc_port_of(node))


def served_by(node: NodeProc) -> dict[int, int]:
    """Of this test process's connections to the node's gRPC port: how many each of its processes holds."""
    return {pid: len(ports) for pid, ports in connections_by(node).items()}


def connections_by(node: NodeProc) -> dict[int, set[int]]:
    """Of this test process's connections to the node's gRPC port: each of its processes' (by our end's port)."""
    assert node.proc is not None
    mine = socket_inodes(os.getpid())
    ports = {lport for lport, rport, state, inode in tcp_sockets()
             if rport == grpc_port_of(node) and state == ESTABLISHED and inode in mine}
    ends = {inode: rport for lport, rport, state, inode in tcp_sockets()
            if lport == grpc_port_of(node) and rport in ports and state == ESTABLISHED}
    return {pid: {ends[i] for i in socket_inodes(pid) & ends.keys()}
            for pid in [node.proc.pid, *children(node.proc.pid)]}


def refused(call: Callable[[], Any]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as err:
        call()
    return err.value.code(), err.value.details() or ""


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    root = str(tmp_path_factory.mktemp("workers"))
    ca = TestCA(os.path.join(root, "pki"))
    certs = {"node": ca.node("node")} | {cn: ca.issue(cn) for cn in ("broker", "client", "admin", "nobody")}
    admin_token = secrets.token_urlsafe(24)
    password = write_private(root, "raft.pw", secrets.token_urlsafe(24))
    tokens = write_private(root, "tokens.toml", f'[tokens]\n"{hash_token(admin_token)}" = "admin"\n')
    security = {"security": {"mode": "secure"}, "raft": {"password_file": password},
                "tls": {"cert_file": certs["node"].cert, "key_file": certs["node"].key, "ca_file": ca.ca_file,
                        "client_auth": "require"},
                "auth": {"cert_roles": {"broker": "broker", "client": "client", "admin": "admin", "node": "peer"},
                         "tokens_file": tokens},
                "remoting": {"role": "peer"}}
    # grpcio's port (each worker's server, SO_REUSEPORT): which process holds a gRPC connection is the kernel's
    # here; the Go front end's (the default once built) is tests/integration/test_grpc_front_go.py's
    c = Cluster(root, remoting=True, metrics=True, worker_processes=WORKERS, security=security, grpc_front="grpcio",
                connect=lambda addr, opts=(): tlsconf.open_channel(
                    addr, tls=True, ca_file=ca.ca_file, cert_file=certs["admin"].cert, key_file=certs["admin"].key,
                    options=opts))
    c.start()
    try:
        c.wait_ready(timeout=60)
        for n in c.nodes:  # the workers bind once their replicas are ready
            c.wait_for(f"{n.name}'s core and {WORKERS} workers listening",
                       lambda n=n: len(listener_owners(n)) == WORKERS and len(grpc_listeners(n)) == WORKERS,
                       timeout=60)
        seed = Conn(c.nodes[0].remoting_addr)
        assert seed.register("broker-seed", "127.0.0.1:10911", TOPICS).code == codes.SUCCESS
        e = Env(c, ca.ca_file, certs, admin_token)
        e.ns(c.nodes[0], "broker").RegisterBroker(register_request("CG", "bg", "127.0.0.1:10921", ["TopicG"]),
                                                  timeout=10)
        c.wait_converged()
        yield e
    finally:
        c.stop(wait=False)  # the nodes shut down while the next test starts


@pytest.fixture(scope="module")
def cluster(env: Env) -> Cluster:
    return env.cluster


def test_replica_codes_are_reads_and_include_routes() -> None:
    assert codes.GET_ROUTEINFO_BY_TOPIC in REPLICA_CODES
    assert not REPLICA_CODES & {codes.REGISTER_BROKER, codes.UNREGISTER_BROKER, codes.BROKER_HEARTBEAT,
                                codes.QUERY_DATA_VERSION, codes.PUT_KV_CONFIG, codes.DELETE_KV_CONFIG,
                                codes.UPDATE_NAMESRV_CONFIG, codes.REGISTER_TOPIC_IN_NAMESRV,
                                codes.DELETE_TOPIC_IN_NAMESRV, codes.WIPE_WRITE_PERM_OF_BROKER,
                                codes.ADD_WRITE_PERM_OF_BROKER}
    assert REQUESTS.keys() >= REPLICA_CODES


def test_route_reads_are_answered_by_workers_as_the_core_answers(cluster: Cluster) -> None:
    for node in cluster.nodes:
        assert node.proc is not None
        by_owner = conns_by_owner(node)
        core = node.proc.pid
        assert set(by_owner) == set(children(core)), "the workers hold every public connection"
        before = reads_counted(node)
        timed = {le: metric(node, "nameserver_remoting_handling_seconds_bucket", request="105", le=le)
                 for le in ("0.001", "+Inf")}
        answers: dict[int, set[bytes]] = {}
        reads = 0
        for pid, conns in by_owner.items():
            for conn in conns:
                for topic in TOPICS:
                    resp = conn.call(codes.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
                    assert resp.code == codes.SUCCESS, (node.name, pid, resp.remark)
                    answers.setdefault(hash(topic), set()).add(resp.body)
                    reads += 1
        for topic in TOPICS:  # one answer per topic, whichever worker gave it
            assert len(answers[hash(topic)]) == 1, f"{node.name}: the workers answer {topic} differently"
        # The node's counter counts each read once, the workers' summed in the core's /metrics.
        assert reads_counted(node) - before == reads
        # and timed once: the histograms' buckets are summed too (each cumulative, the last holds every read)
        assert metric(node, "nameserver_remoting_handling_seconds_bucket", request="105", le="+Inf") == \
            timed["+Inf"] + reads
        assert timed["0.001"] <= metric(node, "nameserver_remoting_handling_seconds_bucket", request="105",
                                        le="0.001") <= timed["0.001"] + reads
        missing = Conn(node.remoting_addr).call(codes.GET_ROUTEINFO_BY_TOPIC, {"topic": "NoSuchTopicW"})
        assert missing.code == codes.TOPIC_NOT_EXIST
        for conns in by_owner.values():
            for conn in conns:
                conn.close()


def test_every_public_remoting_connection_lands_on_a_worker(cluster: Cluster) -> None:
    """The core holds no public remoting port (only its private channel socket): with workers, the
    kernel gives each connection to a worker and the core spends nothing on client connections."""
    node = cluster.nodes[2]
    assert node.proc is not None
    assert node.proc.pid not in listener_owners(node)
    conns = [Conn(node.remoting_addr) for _ in range(4 * WORKERS)]
    assert {owner(node, c) for c in conns} <= set(children(node.proc.pid))
    for conn in conns:
        assert conn.call(codes.GET_ROUTEINFO_BY_TOPIC, {"topic": TOPICS[0]}).code == codes.SUCCESS
        conn.close()


def unchanged_answered(node: NodeProc) -> float:
    return metric(node, "nameserver_worker_unchanged_registrations_total")


def test_an_unchanged_registration_is_answered_by_the_worker_as_the_core_answers(cluster: Cluster) -> None:
    """A re-registration that changes nothing is decided by the worker over its replica and answered
    there, byte for byte as the core answers it (masterAddr, haServerAddr, the order-topic table); the
    core only notes the broker alive."""
    node = cluster.nodes[0]
    conn = Conn(node.remoting_addr)
    ns = {"namespace": "ORDER_TOPIC_CONFIG", "key": "TopicSame", "value": "broker-same:4"}
    assert conn.call(codes.PUT_KV_CONFIG, ns).code == codes.SUCCESS
    assert conn.register("broker-same", "127.0.0.1:40911", ["TopicSame"], counter=3).code == codes.SUCCESS
    ext, body = registration("broker-same", "127.0.0.1:40912", ["TopicSame"], counter=5, broker_id=1)
    assert conn.call(codes.REGISTER_BROKER, ext, body).code == codes.SUCCESS  # a slave: told its master
    # the connection's next read waits for its replica to apply the writes: then the same frame is unchanged
    assert conn.call(codes.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicSame"}).code == codes.SUCCESS
    before = unchanged_answered(node)
    here = conn.call(codes.REGISTER_BROKER, ext, body)
    core = core_call(node, cluster.root, codes.REGISTER_BROKER, ext | {CONN_FIELD: "0:1"}, body)
    core.ext_fields.pop(APPLIED_FIELD)
    assert (here.code, here.remark, here.ext_fields, here.body) == (core.code, core.remark, core.ext_fields, core.body)
    assert here.ext_fields == {"masterAddr": "127.0.0.1:40911", "haServerAddr": "127.0.0.1:10912"}, here.ext_fields
    assert b"TopicSame" in here.body
    cluster.wait_for("the worker counted it answered here", lambda: unchanged_answered(node) == before + 1)
    conn.close()


def test_a_noted_registration_binds_the_broker_to_its_connection(cluster: Cluster) -> None:
    """The core binds a broker to the connection a worker answered its unchanged registration on (the
    note names it): when the connection it first registered on closes the broker stays; when that one
    closes, it leaves the routes."""
    node = cluster.nodes[2]
    first, second = Conn(node.remoting_addr), Conn(node.remoting_addr)
    assert first.register("broker-bound", "127.0.0.1:42911", ["TopicBound"], counter=9).code == codes.SUCCESS
    applied = metric(node, "nameserver_apply_offset")
    cluster.wait_for("every worker's replica applied it", lambda: min(worker_gauge(
        node, "nameserver_worker_replica_offset").values()) >= applied)
    before = unchanged_answered(node)
    assert second.register("broker-bound", "127.0.0.1:42911", ["TopicBound"], counter=9).code == codes.SUCCESS
    cluster.wait_for("answered by the worker", lambda: unchanged_answered(node) == before + 1)
    first.close()
    time.sleep(3)  # past the leader's grace for a closed connection (1 s here)
    probe = Conn(node.remoting_addr)
    assert probe.call(codes.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicBound"}).code == codes.SUCCESS
    second.close()
    deadline = time.monotonic() + 10
    while probe.call(codes.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicBound"}).code != codes.TOPIC_NOT_EXIST:
        assert time.monotonic() < deadline, "the broker is still routed 10 s after its connections closed"
        time.sleep(0.1)
    probe.close()


def test_the_core_sends_back_what_it_does_not_hold_as_noted(cluster: Cluster) -> None:
    """A worker's replica may be behind its core (which expired or changed the broker meanwhile): the
    core names each note whose broker it does not hold at that DataVersion, and the worker then passes
    the registration on whole."""
    node = cluster.nodes[1]
    conn = Conn(node.remoting_addr)
    assert conn.register("broker-noted", "127.0.0.1:41911", ["TopicNoted"], counter=7).code == codes.SUCCESS
    ext, body = registration("broker-noted", "127.0.0.1:41911", ["TopicNoted"], counter=7)
    held = core_call(node, cluster.root, codes.REGISTER_BROKER, ext | {CONN_FIELD: "0:2"}, body)
    assert held.code == codes.SUCCESS
    data_version = registerbody.decode(body, False).data_version.SerializeToString().hex()
    other = registerbody.decode(registration("x", "y", ["T"], counter=8)[1], False).data_version
    note = {"cluster": "CW", "broker": "broker-noted", "conn": "0:3"}
    notes = [note | {"addr": "127.0.0.1:41911", "version": data_version},
             note | {"addr": "127.0.0.1:49999", "version": data_version},  # not registered here
             note | {"addr": "127.0.0.1:41911", "version": other.SerializeToString().hex()}]  # changed here
    answer = core_call(node, cluster.root, NOTE_ALIVE, {}, json.dumps(notes).encode())
    assert (answer.code, json.loads(answer.body)) == (codes.SUCCESS, [1, 2])
    conn.close()


def test_the_remoting_limits_hold_in_workers(cluster: Cluster) -> None:
    """Workers run the core's listener code: a header past limits.remoting_max_header_bytes is refused
    naming the key and its connection closed; too many extFields are refused by name, and the worker
    does not pass such a request to the core."""
    node = cluster.nodes[0]
    assert node.proc is not None
    conns = [c for pid, cs in conns_by_owner(node, want_each=1).items() if pid != node.proc.pid for c in cs]
    big, many = conns[0], conns[1]
    big.sock.sendall(frame.encode(Command(code=codes.REGISTER_BROKER, opaque=1,
                                          ext_fields={"brokerName": "x" * (70 << 10)})))
    payload = read_frame(big.sock)
    assert payload is not None and "limits.remoting_max_header_bytes" in (frame.decode(payload).remark or "")
    assert read_frame(big.sock) is None, "the connection stays open after an oversize header"
    before = metric(node, "nameserver_remoting_handled_total", request="104", response="1")
    resp = many.call(codes.UNREGISTER_BROKER, {f"k{i}": "v" for i in range(300)})
    assert resp.code == codes.SYSTEM_ERROR and "limits.remoting_max_ext_fields" in (resp.remark or "")
    # counted once, by the worker that refused it
    assert metric(node, "nameserver_remoting_handled_total", request="104", response="1") == before + 1
    for conn in conns:
        conn.close()


def test_writes_through_a_worker_are_read_back_on_the_same_connection(cluster: Cluster) -> None:
    """A registration through a worker is passed to the core (on a follower, on to the leader); the next
    read on that connection, answered by the worker's replica, sees it. When every connection the
    broker spoke on closes, it leaves the routes (the core hears of the worker's client connections)."""
    held = []
    for i, node in enumerate(cluster.nodes):
        assert node.proc is not None
        conn = next(c for pid, cs in conns_by_owner(node, want_each=1).items() if pid != node.proc.pid for c in cs)
        registered = metric(node, "nameserver_remoting_handled_total", request="103", response="0")
        for round_ in range(10):
            topic = f"TopicRyw{i}x{round_}"
            resp = conn.register("broker-ryw", "127.0.0.1:20911", [topic], counter=10 * i + round_ + 2)
            assert resp.code == codes.SUCCESS, resp.remark
            assert CONN_FIELD not in resp.ext_fields and not any(k.startswith("__rip18") for k in resp.ext_fields)
            route = conn.call(codes.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
            assert route.code == codes.SUCCESS, (node.name, round_, route.remark)
            assert b"127.0.0.1:20911" in route.body
        # each passed on to the core and counted once, by the worker (the core's private socket counts nothing)
        assert metric(node, "nameserver_remoting_handled_total", request="103", response="0") == registered + 10
        # a client may not send the channel's own code through a worker
        assert conn.call(CONNECTION_CLOSED, {CONN_FIELD: "1:1"}).code == codes.REQUEST_CODE_NOT_SUPPORTED
        held.append(conn)
    leader = cluster.leader()
    assert leader is not None
    last = f"TopicRyw{len(cluster.nodes) - 1}x9"
    assert leader.ns.GetRoute(api_pb2.GetRouteRequest(topic=last), timeout=5).route.broker_datas
    for conn in held:  # the broker process exits
        conn.close()
    probe = Conn(leader.remoting_addr)
    deadline = time.monotonic() + 10
    while probe.call(codes.GET_ROUTEINFO_BY_TOPIC, {"topic": last}).code != codes.TOPIC_NOT_EXIST:
        assert time.monotonic() < deadline, "the broker is still routed 10 s after its connections closed"
        time.sleep(0.1)
    probe.close()


def test_binary_header_requests_are_answered_in_binary(cluster: Cluster) -> None:
    """A client started with rocketmq.serialize.type=ROCKETMQ sends binary headers; stock RocketMQ answers
    in the request's type. So do the core, a worker answering from its replica, and a worker passing a write
    to the core. A zero-length extFields value is null, as stock reads it."""
    binary = codes.SERIALIZE_ROCKETMQ
    node = cluster.nodes[1]
    assert node.proc is not None
    by_owner = conns_by_owner(node, want_each=1)
    for pid, conns in by_owner.items():
        conn, where = conns[0], "core" if pid == node.proc.pid else "worker"
        topic = f"TopicBin{pid}"
        resp = conn.register("broker-bin", "127.0.0.1:30911", [topic], serialize_type=binary)  # a write
        assert (resp.code, resp.serialize_type) == (codes.SUCCESS, binary), (where, resp)
        route = conn.call(codes.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}, serialize_type=binary)
        assert (route.code, route.serialize_type) == (codes.SUCCESS, binary), (where, route.remark)
        assert b"127.0.0.1:30911" in route.body
        null = conn.call(codes.GET_ROUTEINFO_BY_TOPIC, {"topic": ""}, serialize_type=binary)
        assert (null.code, null.remark, null.serialize_type) == (
            codes.SYSTEM_ERROR, "the custom field <topic> is null", binary), where
        plain = conn.call(codes.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})  # the same connection, in JSON
        assert (plain.code, plain.serialize_type, plain.body) == (codes.SUCCESS, codes.SERIALIZE_JSON, route.body)
    for conns in by_owner.values():
        for conn in conns:
            conn.close()


def test_a_killed_worker_is_restarted_and_clients_reconnect(cluster: Cluster) -> None:
    node = cluster.nodes[1]
    assert node.proc is not None
    by_owner = conns_by_owner(node, want_each=1)
    victim = next(pid for pid in by_owner if pid != node.proc.pid)
    restarts = metric(node, "nameserver_worker_restarts_total")
    before = reads_counted(node)
    for _ in range(25):  # counted by the victim, in its metric file
        assert by_owner[victim][0].call(codes.GET_ROUTEINFO_BY_TOPIC, {"topic": TOPICS[0]}).code == codes.SUCCESS
    assert reads_counted(node) == before + 25
    killed_at, made = before + 25, 0  # the node's count when the victim died; reads answered since
    os.kill(victim, signal.SIGKILL)
    for conn in by_owner[victim]:  # its clients lose their connection and open another
        with pytest.raises((OSError, AssertionError)):
            conn.call(codes.GET_ROUTEINFO_BY_TOPIC, {"topic": TOPICS[0]})
        conn.close()
    # Until the killed process's last thread has exited its listening socket is still in the port's group:
    # a connection the kernel queues on it then is reset when it closes (clients reconnect; Linux's
    # net.ipv4.tcp_migrate_req = 1 hands such connections to another listener instead).
    cluster.wait_for("the killed worker's socket closed", lambda: victim not in listener_owners(node))
    again = Conn(node.remoting_addr)
    assert again.call(codes.GET_ROUTEINFO_BY_TOPIC, {"topic": TOPICS[0]}).code == codes.SUCCESS
    made += 1

    def restarted() -> bool:
        nonlocal made
        # meanwhile, fresh connections' reads succeed: the new worker takes none before its replica is ready
        fresh = Conn(node.remoting_addr)
        resp = fresh.call(codes.GET_ROUTEINFO_BY_TOPIC, {"topic": TOPICS[0]})
        fresh.close()
        assert resp.code == codes.SUCCESS, resp.remark
        made += 1
        owners = listener_owners(node)
        return len(owners) == WORKERS and victim not in owners

    cluster.wait_for("the worker restarted and listening", restarted, every=0.02)
    assert metric(node, "nameserver_worker_restarts_total") == restarts + 1
    assert metric(node, "nameserver_worker_processes") == WORKERS
    # The victim's counts outlived it: kept by the core when it exited, its files gone.
    assert reads_counted(node) == killed_at + made
    folder = os.path.join(cluster.root, f"{node.name}-data", "channel", "metrics")
    assert {f.rsplit("_", 1)[1].removesuffix(".db") for f in os.listdir(folder)} <= {
        str(pid) for pid in children(node.proc.pid)}, os.listdir(folder)
    fresh = conns_by_owner(node, want_each=1)
    for conns in fresh.values():
        assert conns[0].call(codes.GET_ROUTEINFO_BY_TOPIC, {"topic": TOPICS[0]}).code == codes.SUCCESS
        for conn in conns:
            conn.close()
    again.close()


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
        before, cpu = node_calls(node, "GetRoute"), {w: proc_cpu_s([w]) for w in workers}
        for _ in range(25):
            for stub in stubs:
                reply = stub.GetRoute(api_pb2.GetRouteRequest(topic="TopicG"), timeout=10)
                assert [b.broker_name for b in reply.route.broker_datas] == ["bg"]
        # the node counted each once (the core has no public gRPC port: the workers counted them) ...
        assert node_calls(node, "GetRoute") == before + 25 * len(stubs)
        # ... and every worker worked
        assert all(proc_cpu_s([w]) > cpu[w] for w in workers), {w: proc_cpu_s([w]) - cpu[w] for w in workers}
        missing = refused(lambda stub=stubs[0]: stub.GetRoute(api_pb2.GetRouteRequest(topic="NoSuchTopicG"),
                                                               timeout=10))
        assert missing == (grpc.StatusCode.NOT_FOUND, "topic NoSuchTopicG does not exist")


def test_calls_through_workers_are_decided_as_direct_ones(env: Env) -> None:
    """Refusals are the core's own words; a write from a client certificate's caller reaches the core
    with that caller's identity (the core refuses calls it cannot attribute), and a stream passes through."""
    node = env.cluster.nodes[1]
    put = api_pb2.PutKvRequest(namespace="wg", key="k", value="v")
    denied = metric(node, "nameserver_grpc_handled_total", method="GetRoute", code="PERMISSION_DENIED")
    assert refused(lambda: env.ns(node, "nobody").GetRoute(api_pb2.GetRouteRequest(topic="TopicG"), timeout=10)) == (
        grpc.StatusCode.PERMISSION_DENIED, "certificate 'nobody' has no role")
    # refused by the worker's auth, and counted in the node's /metrics
    assert metric(node, "nameserver_grpc_handled_total", method="GetRoute", code="PERMISSION_DENIED") == denied + 1
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
    before = node_calls(node, "PutKv")
    assert env.ns(node, "admin").PutKv(put, timeout=10).offset > 0
    assert node_calls(node, "PutKv") == before + 1
    admin = api_pb2_grpc.AdminStub(env.channel(node, "client"))
    assert refused(lambda: admin.TakeSnapshot(api_pb2.TakeSnapshotRequest(), timeout=10))[0] == (
        grpc.StatusCode.PERMISSION_DENIED)
    assert api_pb2_grpc.AdminStub(env.channel(node, "admin")).Status(api_pb2.StatusRequest(), timeout=10).ready
    # a client stream (a registration in chunks) passes through the worker's guards to the core
    big = register_request("CG", "bstream", "127.0.0.1:10941", [f"TopicS{k}" for k in range(50)])
    streamed = env.ns(node, "broker").RegisterBrokerStream(iter(register_chunks(big, per_chunk=10)), timeout=10)
    route = env.ns(node, "client").GetRoute(api_pb2.GetRouteRequest(topic="TopicS49", min_offset=streamed.offset),
                                           timeout=10)
    assert [b.broker_name for b in route.route.broker_datas] == ["bstream"]
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


def _kv_session(i: int, seq: int) -> tuple[tuple[str, str], ...]:
    return (headers.CLIENT_ID, f"wb-{i}"), (headers.CLIENT_SEQ, str(seq))


def test_concurrent_writes_through_workers_cross_once_and_apply_once(env: Env) -> None:
    """Writes from many clients at once reach the core over the write channel
    (nameserver/api/writechannel.py), each acknowledged and applied once: a retry of a session's
    sequence is answered from the session, not applied again. (Offsets need not differ: group commit
    may put several writes in one log entry.)"""
    node, clients = env.cluster.nodes[1], 24
    calls0 = metric(node, "nameserver_write_channel_calls_total")
    frames0 = metric(node, "nameserver_write_channel_frames_total")
    stubs = [env.ns(node, "admin", fresh=True) for _ in range(clients)]
    for stub in stubs:  # connected before the burst
        stub.GetClusterInfo(api_pb2.GetClusterInfoRequest(), timeout=10)
    start = threading.Barrier(clients)

    def put(i: int, value: str, seq: int) -> int:
        return int(stubs[i].PutKv(api_pb2.PutKvRequest(namespace="wgb", key=f"k{i}", value=value), timeout=20,
                                  metadata=_kv_session(i, seq)).offset)

    def first(i: int) -> int:
        start.wait(timeout=30)
        return put(i, f"first{i}", 1)

    with ThreadPoolExecutor(clients) as pool:
        offsets = list(pool.map(first, range(clients)))
    assert min(offsets) > 0
    calls = metric(node, "nameserver_write_channel_calls_total") - calls0
    frames = metric(node, "nameserver_write_channel_frames_total") - frames0
    # every write crossed (a leader's count also has its followers' forwarded heartbeats); whether several
    # shared a frame depends on how they arrived (a quiet machine may send each alone):
    # tests/unit/test_writechannel_frames.py shows the sharing deterministically. Applied once: below.
    assert calls >= clients and 0 < frames <= calls, (calls, frames)
    with ThreadPoolExecutor(clients) as pool:  # every write retried at once, from other connections
        retried = list(pool.map(lambda i: int(env.ns(node, "admin", fresh=True).PutKv(
            api_pb2.PutKvRequest(namespace="wgb", key=f"k{i}", value=f"again{i}"), timeout=20,
            metadata=_kv_session(i, 1)).offset), range(clients)))
    assert retried == offsets
    reader = env.ns(env.cluster.nodes[2], "client")
    for i in range(clients):
        got = reader.GetKv(api_pb2.GetKvRequest(namespace="wgb", key=f"k{i}", min_offset=max(offsets)), timeout=10)
        assert got.value == f"first{i}", f"client {i}'s retried write was applied again"


def test_read_index_asks_on_the_write_channel_are_not_counted_as_writes(env: Env) -> None:
    """A LINEARIZABLE read asks the core for a read index on the write channel: /metrics counts it in
    nameserver_write_channel_read_indexes_total, not with the writes. (On a follower: a leader's count of
    writes also has its followers' forwarded heartbeats.)"""
    leader = env.cluster.leader()
    node = next(n for n in env.cluster.nodes if n is not leader and n.alive)
    writes, asks = (metric(node, f"nameserver_write_channel_{name}_total") for name in ("calls", "read_indexes"))
    stub = env.ns(node, "client")
    for i in range(3):
        stub.GetBinding(api_pb2.GetBindingRequest(topic="TopicG", queue_id=i, consistency=api_pb2.LINEARIZABLE),
                        timeout=10)
    assert metric(node, "nameserver_write_channel_read_indexes_total") >= asks + 1
    assert metric(node, "nameserver_write_channel_calls_total") == writes


# what a write may fail with when its worker dies (or the machine is slow): each safe to retry in its session
RETRIED = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED)


def test_a_worker_killed_mid_batch_loses_no_acknowledged_write(env: Env) -> None:
    """Clients write without pause through a node's workers and one worker is SIGKILLed among them: each
    call is acknowledged or fails (RETRIED: its connection or the worker's link to the core went),
    and a failed one, retried under its session's sequence on a new connection, is acknowledged once.
    At the end every client's key holds its last acknowledged value: no acknowledged write was lost."""
    node, clients = env.cluster.nodes[0], 12
    stop = threading.Event()
    acked: dict[int, tuple[int, str, int]] = {}  # client -> (seq, value, offset) of its last acknowledged write
    failures: list[str] = []

    def writer(i: int) -> None:
        stub, seq = env.ns(node, "admin", fresh=True), 0
        deadline = time.monotonic() + 30
        while not stop.is_set() or seq < 3:
            seq += 1
            value = f"v{i}-{seq}"
            while True:  # the same sequence until acknowledged
                try:
                    reply = stub.PutKv(api_pb2.PutKvRequest(namespace="wgk", key=f"k{i}", value=value), timeout=10,
                                       metadata=_kv_session(100 + i, seq))
                    acked[i] = (seq, value, reply.offset)
                    break
                except grpc.RpcError as exc:
                    if exc.code() not in RETRIED or time.monotonic() > deadline:
                        failures.append(f"client {i}: {exc.code()} {exc.details()}")
                        return
                    failures.append("")  # an error, as allowed; the retry follows on a new connection
                    stub = env.ns(node, "admin", fresh=True)
                    time.sleep(0.05)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    time.sleep(0.5)  # writes in flight through both workers
    held = served_by(node)
    victim = max((pid for pid in held if pid != node.proc.pid), key=lambda pid: held[pid])  # type: ignore[union-attr]
    assert held[victim] > 0, held  # some writers are its clients
    os.kill(victim, signal.SIGKILL)
    time.sleep(0.5)  # the writers on its connections retry on the other worker
    stop.set()
    for t in threads:
        t.join(timeout=60)
    assert not [f for f in failures if f], failures
    assert len(acked) == clients
    reader = env.ns(env.cluster.nodes[2], "client")
    newest = max(offset for _, _, offset in acked.values())
    for i, (seq, value, _) in acked.items():
        got = reader.GetKv(api_pb2.GetKvRequest(namespace="wgk", key=f"k{i}", min_offset=newest), timeout=10)
        assert got.value == value, (i, seq, got.value)
    env.cluster.wait_for("the worker restarted and listening",
                         lambda: len(grpc_listeners(node)) == WORKERS and victim not in grpc_listeners(node))


def test_reads_through_a_worker_see_writes_acknowledged_before(env: Env) -> None:
    """LINEARIZABLE: a read index from the worker's core (on a follower: from the leader), then the
    replica waits for it. SERIALIZABLE on the connection that wrote: the answer left once the worker's
    replica had the core's state as it answered (the replica is often there first anyway: the guard of
    that wait is tests/unit/test_corelink.py)."""
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
    node = env.cluster.nodes[0]
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


def worker_gauge(node: NodeProc, name: str) -> dict[str, float]:
    return {s.labels["worker"]: s.value for s in samples(node) if s.name == name}


def test_worker_gauges_are_shown_per_worker(cluster: Cluster) -> None:
    """A sum of the workers' gauges would say nothing true: each is labelled with its worker's index."""
    node = cluster.nodes[0]
    assert node.proc is not None
    by_owner = conns_by_owner(node, want_each=2)

    def held_by_workers() -> list[int]:  # what the kernel says each worker holds, this test's and any other
        ends = {inode for lport, _, state, inode in tcp_sockets() if lport == port_of(node) and state == ESTABLISHED}
        return sorted(len(socket_inodes(pid) & ends) for pid in children(node.proc.pid))

    cluster.wait_for("each worker's connections shown", lambda: sorted(worker_gauge(
        node, "nameserver_worker_remoting_connections").values()) == held_by_workers())
    assert set(worker_gauge(node, "nameserver_worker_remoting_connections")) == {str(i) for i in range(WORKERS)}
    offsets = worker_gauge(node, "nameserver_worker_replica_offset")
    assert set(offsets) == {str(i) for i in range(WORKERS)}
    assert all(0 < v <= metric(node, "nameserver_apply_offset") for v in offsets.values()), offsets
    for conns in by_owner.values():
        for conn in conns:
            conn.close()


def test_health_through_a_worker_is_the_cores(env: Env) -> None:
    """Health checks are the core's, as the worker asks them (nameserver/api/corehealth.py): its readiness, not
    the worker's; a service the core does not know is NOT_FOUND, as the core answers it."""
    node = env.cluster.nodes[0]
    stub = health_pb2_grpc.HealthStub(env.channel(node, "client", fresh=True))
    assert stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=10).status == \
        health_pb2.HealthCheckResponse.SERVING
    assert refused(lambda: stub.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=10))[0] == \
        grpc.StatusCode.NOT_FOUND



def test_a_worker_s_reflection_lists_what_it_answers(env: Env) -> None:
    """A worker answers reflection itself, listing every service it answers (Log, passed to the core, too),
    each answering a call made from reflection alone; the core's private socket lists its own."""
    node = env.cluster.nodes[0]
    assert listed_and_answering(env.channel(node, "client", fresh=True)) == WORKER_SERVICES
    with corelink.own_channel(config.load(node.config_path)) as core:
        assert listed_and_answering(core) == CORE_SERVICES

# ---- Watch, served by the workers -------------------------------------------------------------------

class Watching(threading.Thread):
    """One watch of `prefix` on `stub`, resumed from the last offset it saw (events or progress) whenever
    its stream fails, as a client library does; every answer checked for order and duplicates."""

    def __init__(self, stub: Any, prefix: str, start: int) -> None:
        super().__init__(daemon=True, name=f"watching-{prefix}")
        self.stub, self.prefix, self.last = stub, prefix, start
        self.events: list[tuple[int, str]] = []
        self.errors: list[str] = []
        self.resumes = 0
        self.answered = threading.Event()
        self.stopped = threading.Event()
        self.call: Any = None

    def run(self) -> None:
        while not self.stopped.is_set():
            try:
                self.call = self.stub.Watch(api_pb2.WatchRequest(key_prefixes=[self.prefix], start_offset=self.last,
                                                                 progress_interval_ms=100))
                for reply in self.call:
                    self.answered.set()
                    self._take(reply)
            except grpc.RpcError as exc:
                if self.stopped.is_set():
                    return
                self.resumes += 1
                self.errors += [] if exc.code() == grpc.StatusCode.UNAVAILABLE else [f"{exc.code()}: {exc.details()}"]
                time.sleep(0.05)

    def _take(self, reply: api_pb2.WatchResponse) -> None:
        if reply.events:
            if reply.offset <= self.last and not reply.initial_state:
                self.errors.append(f"events at offset {reply.offset} after offset {self.last} (a duplicate)")
            self.events += [(e.version, e.key) for e in reply.events]  # a change's offset, or the listed key's
            self.last = max(self.last, reply.offset)
        elif reply.offset < self.last:
            self.errors.append(f"progress went back from {self.last} to {reply.offset}")
        else:
            self.last = reply.offset

    def saw_exactly(self, acked: dict[str, int], timeout: float = 20) -> None:
        """Every acknowledged write once, at its offset, and nothing else; no error on the way."""
        final = max(acked.values())
        deadline = time.monotonic() + timeout
        while self.last < final:
            assert time.monotonic() < deadline, f"watch of {self.prefix} stuck at {self.last} of {final}"
            time.sleep(0.02)
        assert not self.errors, self.errors[:5]
        assert sorted(self.events) == sorted((off, key) for key, off in acked.items()), \
            f"{self.prefix}: saw {self.events}, acknowledged {sorted(acked.items(), key=lambda kv: kv[1])}"

    def close(self) -> None:
        self.stopped.set()
        if self.call is not None:
            self.call.cancel()
        self.join(5)


def held_by(node: NodeProc, stub: Any) -> int:
    """The process of `node` that holds the connection of `stub`'s fresh channel (opened by this call)."""
    before = connections_by(node)
    stub.GetClusterInfo(api_pb2.GetClusterInfoRequest(), timeout=10)
    after = connections_by(node)
    # the connection that is new, not a count that grew: an earlier test's channel closing meanwhile (garbage
    # collected) took one from a count while this one added one (clean-clone CI, session 24)
    grew = [pid for pid, ports in after.items() if ports - before.get(pid, set())]
    assert len(grew) == 1, (before, after)
    return grew[0]


def stubs_by_worker(env: Env, node: NodeProc, each: int, who: str = "client") -> dict[int, list[Any]]:
    """Fresh channels of `who` to `node`'s gRPC port until each worker holds `each` of them."""
    got: dict[int, list[Any]] = {}
    for _ in range(100):
        stub = env.ns(node, who, fresh=True)
        got.setdefault(held_by(node, stub), []).append(stub)
        if len(got) == WORKERS and all(len(v) >= each for v in got.values()):
            return got
    raise AssertionError(f"100 channels did not reach every worker: {({k: len(v) for k, v in got.items()})}")


def put_kv(stub: Any, namespace: str, key: str, session: tuple[str, int] | None = None) -> tuple[str, int]:
    """(the key's full name, also its value; the offset the write was told). With a session (client id,
    sequence), a write that fails UNAVAILABLE (a process on its way died) is retried: replayed, if it
    had been applied, never applied twice."""
    full = f"kv/{namespace}/{key}"
    md = () if session is None else ((headers.CLIENT_ID, session[0]), (headers.CLIENT_SEQ, str(session[1])))
    deadline = time.monotonic() + 20
    while True:
        try:
            return full, stub.PutKv(api_pb2.PutKvRequest(namespace=namespace, key=key, value=full), timeout=10,
                                    metadata=md).offset
        except grpc.RpcError as exc:
            if session is None or exc.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_watches_are_served_by_the_workers_in_order_without_gap_or_duplicate(env: Env) -> None:
    """Watchers on every worker of a node see each write made through the node's other worker and the
    other nodes, once, in order, at the offset its writer was told. The node's core serves none of them."""
    node, others = env.cluster.nodes[0], env.cluster.nodes[1:]
    by_worker = stubs_by_worker(env, node, each=2)
    start = put_kv(env.ns(node, "admin"), "wwo", "start")[1]
    watchers = [Watching(stub, "kv/wwo/", start) for stubs in by_worker.values() for stub in stubs]
    try:
        for w in watchers:
            w.start()
        for w in watchers:
            assert w.answered.wait(10), "a watch never answered"
        # served by the workers, from their replicas: the core's hub holds none of them
        env.cluster.wait_for("the workers' watchers shown", lambda: sum(worker_gauge(
            node, "nameserver_worker_watchers").values()) >= len(watchers))
        assert metric(node, "nameserver_watchers") == 0
        writers = [env.ns(n, "admin") for n in others] + [env.ns(node, "admin", fresh=True) for _ in range(4)]
        acked = dict(put_kv(writers[i % len(writers)], "wwo", f"k{i}") for i in range(40))
        for w in watchers:
            w.saw_exactly(acked)
    finally:
        for w in watchers:
            w.close()


def test_a_write_is_read_and_watched_through_another_worker(env: Env) -> None:
    """Read-your-writes across workers: written through a connection one worker holds, read (min_offset)
    and watched through one the other worker holds, on this node and the others."""
    for node in env.cluster.nodes[:2]:
        writers, readers = stubs_by_worker(env, node, 1, "admin"), stubs_by_worker(env, node, 1)
        one, other = list(writers)
        writer, reader = writers[one][0], readers[other][0]
        for i in range(5):
            key, offset = put_kv(writer, "wry", f"{node.name}-{i}")
            got = reader.GetKv(api_pb2.GetKvRequest(namespace="wry", key=key.rsplit("/", 1)[1], min_offset=offset),
                               timeout=10)
            assert got.value == key and got.apply_offset >= offset
            # every change after the offset before it; the current state first (then the changes)
            watches = [Watching(reader, key, offset - 1), Watching(reader, key, 0)]
            try:
                for w in watches:
                    w.start()
                for w in watches:
                    w.saw_exactly({key: offset})
            finally:
                for w in watches:
                    w.close()


def test_a_watch_from_before_a_workers_history_is_served_by_the_core(env: Env) -> None:
    """A worker's replica keeps only recent entries (it started from a snapshot): a watch resuming from
    before them is passed to the core, whose history is longer, and replays from there."""
    node = env.cluster.nodes[1]
    stub = env.ns(node, "client", fresh=True)
    call = stub.Watch(api_pb2.WatchRequest(key_prefixes=["broker/"], start_offset=1, progress_interval_ms=100),
                      timeout=20)
    first = next(iter(call))
    assert first.events and first.offset < 50, "the seed broker's registration, replayed from offset 1"
    env.cluster.wait_for("the core's watcher shown", lambda: metric(node, "nameserver_watchers") == 1)
    call.cancel()


def test_watchers_of_a_killed_worker_resume_elsewhere_without_gap_or_duplicate(env: Env) -> None:
    """A worker SIGKILLed while writes go on: its watchers' streams fail, they resume from their last offset
    on another process of the node, and see every write once, in order."""
    node = env.cluster.nodes[0]
    by_worker = stubs_by_worker(env, node, each=3)
    victim = next(iter(by_worker))
    start = put_kv(env.ns(node, "admin"), "wwk", "start")[1]
    watchers = {pid: [Watching(stub, "kv/wwk/", start) for stub in stubs] for pid, stubs in by_worker.items()}
    everyone = [w for ws in watchers.values() for w in ws]
    writers = [env.ns(n, "admin") for n in env.cluster.nodes[1:]]
    acked: dict[str, int] = {}
    try:
        for w in everyone:
            w.start()
        for w in everyone:
            assert w.answered.wait(10), "a watch never answered"
        # writes through the other nodes: on their way to a leader they may cross the victim (a leader's
        # workers take the forwarded writes), so each is retried in its exactly-once session
        sessions = [f"wwk-{secrets.token_hex(4)}-{i}" for i in range(2)]
        acked.update(put_kv(writers[i % 2], "wwk", f"k{i}", (sessions[i % 2], i + 1)) for i in range(10))
        os.kill(victim, signal.SIGKILL)
        acked.update(put_kv(writers[i % 2], "wwk", f"k{i}", (sessions[i % 2], i + 1)) for i in range(10, 40))
        for w in everyone:
            w.saw_exactly(acked)
        assert all(w.resumes >= 1 for w in watchers[victim]), [w.resumes for w in watchers[victim]]
    finally:
        for w in everyone:
            w.close()
    env.cluster.wait_for("the worker restarted and listening",
                         lambda: len(grpc_listeners(node)) == WORKERS and victim not in grpc_listeners(node))


# ---- no write outlives its caller (docs/faults.md, finding 14) --------------------------------------

def never_applied(env: Env, namespace: str, key: str) -> None:
    """`key` is not in the state, as of a write made through the leader after everything before it."""
    leader = env.cluster.leader()
    assert leader is not None
    after = env.ns(leader, "admin").PutKv(api_pb2.PutKvRequest(namespace=namespace, key="barrier", value="b"),
                                          timeout=10)
    assert refused(lambda: env.ns(leader, "client").GetKv(
        api_pb2.GetKvRequest(namespace=namespace, key=key, min_offset=after.offset), timeout=10))[0] == (
        grpc.StatusCode.NOT_FOUND), f"{namespace}/{key} was applied"


def follower_with_its_worker(env: Env) -> tuple[NodeProc, Any, int]:
    """A follower, a fresh admin stub to it, and the worker holding that stub's connection."""
    leader = env.cluster.leader()
    node = next(n for n in env.cluster.nodes if n is not leader and n.alive)
    stub = env.ns(node, "admin", fresh=True)
    return node, stub, held_by(node, stub)


def test_a_write_whose_deadline_passed_on_the_write_channel_is_not_applied(env: Env) -> None:
    """A follower's core is stopped (SIGSTOP) while a write with a 1 s deadline waits for it on the
    write channel; the client gets DEADLINE_EXCEEDED; the worker is stopped too, so no cancel reaches
    the core: the call's deadline alone must stop it. The core resumes and reads the call after its
    deadline: it refuses it (not forwarded, not proposed), where counting the time left from its read
    of the frame gave the call a fresh second and the write was applied."""
    node, stub, worker = follower_with_its_worker(env)
    assert node.proc is not None
    core = node.proc.pid
    os.kill(core, signal.SIGSTOP)
    try:
        call = stub.PutKv.future(api_pb2.PutKvRequest(namespace="wdl", key="late", value="v"), timeout=1.0)
        time.sleep(0.5)  # the worker has written the call to the channel
        os.kill(worker, signal.SIGSTOP)
        try:
            assert call.exception(timeout=10).code() == grpc.StatusCode.DEADLINE_EXCEEDED
            os.kill(core, signal.SIGCONT)
            time.sleep(1.0)  # the core reads the call and answers it (to the stopped worker)
        finally:
            os.kill(worker, signal.SIGCONT)
    finally:
        os.kill(core, signal.SIGCONT)
    never_applied(env, "wdl", "late")


def test_a_write_cancelled_while_on_the_write_channel_is_not_applied(env: Env) -> None:
    """A follower's core is stopped while a write (30 s deadline) waits for it on the write channel, and
    the client cancels it: the worker sends the core a cancel, which waits behind the call. The core
    resumes, reads both before it starts the call, and never forwards or proposes the write."""
    node, stub, _ = follower_with_its_worker(env)
    assert node.proc is not None
    core = node.proc.pid
    cancels = metric(node, "nameserver_write_channel_cancels_total")
    os.kill(core, signal.SIGSTOP)
    try:
        call = stub.PutKv.future(api_pb2.PutKvRequest(namespace="wdl", key="cancelled", value="v"), timeout=30)
        time.sleep(0.5)  # the worker has written the call to the channel
        assert call.cancel()
        time.sleep(0.5)  # and its cancel
    finally:
        os.kill(core, signal.SIGCONT)
    never_applied(env, "wdl", "cancelled")
    assert metric(node, "nameserver_write_channel_cancels_total") == cancels + 1


def test_a_forwarded_write_past_its_forwarders_deadline_is_refused(env: Env) -> None:
    """A forwarded write carries its forwarder's deadline by the wall clock (FORWARD_DEADLINE): the leader
    refuses one whose deadline passed, or is within [limits] forward_clock_skew_ms (100) of its clock,
    with DEADLINE_EXCEEDED and proposes nothing, whatever gRPC's own timeout says (it counts from the
    call's arrival: a call held in a TCP queue through a partition arrives with all of it). The header
    is a peer's word only: from a client, unforwarded, it is ignored."""
    leader = env.cluster.leader()
    assert leader is not None
    peer = env.ns(leader, "node")  # the nodes' certificate: the peer role, which may forward

    def forwarded(key: str, deadline_ms: int) -> Any:
        return peer.PutKv(api_pb2.PutKvRequest(namespace="wfd", key=key, value="v"), timeout=10, metadata=(
            (headers.FORWARDED, "1"), (headers.FORWARD_DEADLINE, str(deadline_ms))))

    code, details = refused(lambda: forwarded("past", int(time.time() * 1000) - 5000))
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED and "limits.forward_clock_skew_ms" in details, details
    assert refused(lambda: forwarded("skewed", int(time.time() * 1000) + 50))[0] == grpc.StatusCode.DEADLINE_EXCEEDED
    assert forwarded("in-time", int(time.time() * 1000) + 10_000).offset > 0
    past = ((headers.FORWARD_DEADLINE, str(int(time.time() * 1000) - 5000)),)
    assert env.ns(leader, "admin").PutKv(api_pb2.PutKvRequest(namespace="wfd", key="client", value="v"),
                                         timeout=10, metadata=past).offset > 0
    never_applied(env, "wfd", "past")
    never_applied(env, "wfd", "skewed")


def test_a_killed_core_takes_its_workers_down(cluster: Cluster) -> None:
    node = cluster.nodes[2]
    assert node.proc is not None
    workers = children(node.proc.pid)
    assert len(workers) == WORKERS
    cluster.kill(node)

    # (a killed process's threads exit one by one: its descriptors are closed when the last has)
    cluster.wait_for("the workers gone and nothing listening on the node's remoting port",
                     lambda: not any(alive(pid) for pid in workers) and not listening(port_of(node)), timeout=10)
    with pytest.raises(OSError):
        Conn(node.remoting_addr)


def test_a_starting_node_with_workers_refuses_remoting_until_its_core_is_ready(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """The core holds no public remoting port, so its workers keep the rule (docs/remoting.md, "A
    starting node"): they listen once their replica is ready, which the core's Follow allows once the
    core is ready; until then connecting is refused."""
    c = Cluster(str(tmp_path_factory.mktemp("starting")), 3, remoting=True, worker_processes=1)
    try:
        first = c.nodes[0]
        c.start(first)  # alone: no quorum, so its core is not ready
        assert first.proc is not None
        core = first.proc.pid
        # its worker (beside it, the Go gRPC front end when that is the node's: the default once built)
        c.wait_for("its worker started", lambda: len([p for p in children(core) if is_worker(p)]) == 1, timeout=60)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port_of(first)), timeout=5).close()
        for n in c.nodes[1:]:
            c.start(n)
        c.wait_ready(timeout=60)
        assert Conn(first.remoting_addr).call(codes.GET_ROUTEINFO_BY_TOPIC, {"topic": "NoSuchTopic"}).code == \
            codes.TOPIC_NOT_EXIST
    finally:
        c.stop(wait=False)  # the nodes shut down while the next test starts


def test_no_more_processes_load_the_state_at_once_than_cpus(cluster: Cluster) -> None:
    """At the node's start the core and cores - 1 workers load at once; the rest start once one serves."""
    first = loading_at_once(WORKERS, len(os.sched_getaffinity(0)))  # the nodes inherit this process's CPUs
    for node in cluster.nodes:
        with open(node.log_path, errors="replace") as f:
            log = f.read()
        assert f"started {first} worker process(es)" in log, node.name
        serving = re.search(r"worker \d+ \(pid \d+\) serving gRPC", log)
        assert serving is not None, node.name
        served = serving.start()
        for i in range(first, WORKERS):  # each held back until a worker served
            started = log.find(f"remoting worker {i} started: pid")
            assert started > served, (node.name, i, started, served)
