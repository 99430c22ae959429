"""Security on real 3-process clusters: TLS, mutual TLS, tokens, roles, the Raft password.

The matrix sends every RPC family (broker writes, client reads, watch, admin/log, other writes,
peer-only) as every identity (broker, client, admin, peer, an unmapped certificate, a bad token, no
credential) to a follower, so allowed writes also cross the follower -> leader forwarding path with
the peer credential. A refused call must fail PERMISSION_DENIED or UNAUTHENTICATED and leave the
leader's digest unchanged. It runs three ways: mutual TLS with certificate identities, tokens over
TLS, and tokens over plaintext (dev mode).
"""

from __future__ import annotations

import os
import pickle
import re
import secrets
import socket
import struct
import subprocess
import sys
import time
import urllib.request
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from nameserver import headers, tlsconf
from nameserver.api.auth import hash_token
from nameserver.client import Client, Credentials, NameServerError
from nameserver.pb import api_pb2, api_pb2_grpc, state_pb2
from nameserver.remoting import codes, frame
from nameserver.remoting.command import Command
from tests.certs import CertFiles, TestCA
from tests.cluster import ROOT, Cluster, NodeProc, register_request, retry

pytestmark = pytest.mark.cluster

DENIED = (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED)
# Codes an allowed call may end with: the request itself was fine to make, the data just says no.
BENIGN = (grpc.StatusCode.OK, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION,
          grpc.StatusCode.OUT_OF_RANGE)
PEER_TOKEN_ENV = "RIP18_TEST_PEER_TOKEN"
ROLES = ("broker", "client", "admin", "peer")
FAMILIES_OF = {"broker": {"broker"}, "client": {"client", "watch"},
               "admin": {"broker", "client", "watch", "admin", "write"},
               "peer": {"broker", "client", "watch", "admin", "write", "peer"}}


@dataclass
class Pki:
    dir: str
    ca: TestCA
    certs: dict[str, CertFiles]
    rogue: CertFiles  # CN=admin, but signed by another CA
    tokens: dict[str, str]  # role -> token
    tokens_file: str
    peer_token_file: str
    password_file: str
    wrong_password_file: str
    secrets: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = str(tmp_path_factory.mktemp("pki"))
    ca = TestCA(d)
    certs = {"node": ca.node("node")} | {cn: ca.issue(cn) for cn in ("broker", "client", "admin", "nobody")}
    rogue = TestCA(os.path.join(d, "rogue"), "rogue-ca").issue("admin")
    tokens = {role: secrets.token_urlsafe(24) for role in ROLES}

    def write(name: str, text: str) -> str:
        path = os.path.join(d, name)
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, 0o600)
        return path

    tokens_file = write("tokens.toml", "[tokens]\n" + "".join(
        f'"{hash_token(tok)}" = "{role}"\n' for role, tok in tokens.items()))
    password, wrong = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    with open(certs["node"].key) as f:
        node_key = f.read()
    return Pki(d, ca, certs, rogue, tokens, tokens_file, write("peer.token", tokens["peer"] + "\n"),
               write("raft.password", password), write("raft.wrong", wrong),
               secrets=[*tokens.values(), password, wrong, node_key.splitlines()[1]])


# ---- ways to connect -------------------------------------------------------------------------------


def cert_channel(pki: Pki, who: str | None, token: str | None = None) -> Callable[[str, Any], grpc.Channel]:
    files = pki.rogue if who == "rogue" else pki.certs.get(who or "")
    return lambda addr, opts=(): tlsconf.open_channel(
        addr, tls=True, ca_file=pki.ca.ca_file, cert_file=files.cert if files else None,
        key_file=files.key if files else None, token=token, options=opts)


def token_channel(pki: Pki, token: str | None, tls: bool) -> Callable[[str, Any], grpc.Channel]:
    return lambda addr, opts=(): tlsconf.open_channel(addr, tls=tls, ca_file=pki.ca.ca_file if tls else None,
                                                      token=token, options=opts)


@dataclass
class Mode:
    name: str
    cluster: Cluster
    identities: dict[str, tuple[Callable[[str, Any], grpc.Channel], str | None]]  # -> (connect, role)
    refusal: dict[str, grpc.StatusCode]  # identity without a role -> its code


def _tls(pki: Pki, client_auth: str) -> dict[str, str]:
    return {"cert_file": pki.certs["node"].cert, "key_file": pki.certs["node"].key, "ca_file": pki.ca.ca_file,
            "client_auth": client_auth}


def _make_mode(name: str, pki: Pki, root: str) -> Mode:
    os.makedirs(root, exist_ok=True)
    if name == "mtls":
        security = {"security": {"mode": "secure"}, "raft": {"password_file": pki.password_file},
                    "tls": _tls(pki, "require"),
                    "auth": {"cert_roles": {"broker": "broker", "client": "client", "admin": "admin",
                                            "node": "peer"}}}
        idents = {role: (cert_channel(pki, "node" if role == "peer" else role), role) for role in ROLES}
        idents |= {"nobody": (cert_channel(pki, "nobody"), None),
                   "badtoken": (cert_channel(pki, "admin", secrets.token_urlsafe(24)), None),
                   "none": (cert_channel(pki, None), None)}
        # Without a certificate the TLS handshake itself fails (mutual TLS required): no call is made.
        refusal = {"nobody": grpc.StatusCode.PERMISSION_DENIED, "badtoken": grpc.StatusCode.UNAUTHENTICATED,
                   "none": grpc.StatusCode.UNAVAILABLE}
        cluster = Cluster(root, 3, metrics=True, security=security, connect=cert_channel(pki, "admin"))
    else:
        tls = name == "tokens-tls"
        security = {"raft": {"password_file": pki.password_file},
                    "auth": {"tokens_file": pki.tokens_file}}
        if tls:
            security |= {"security": {"mode": "secure"}, "tls": _tls(pki, "none"),
                         "remoting": {"role": "client"}}
            security["auth"]["peer_token_file"] = pki.peer_token_file
        else:  # dev mode: tokens over plaintext; the peer token from the environment
            security["auth"]["peer_token_env"] = PEER_TOKEN_ENV
            os.environ[PEER_TOKEN_ENV] = pki.tokens["peer"]
        idents = {role: (token_channel(pki, pki.tokens[role], tls), role) for role in ROLES}
        idents |= {"badtoken": (token_channel(pki, secrets.token_urlsafe(24), tls), None),
                   "none": (token_channel(pki, None, tls), None)}
        refusal = {"badtoken": grpc.StatusCode.UNAUTHENTICATED, "none": grpc.StatusCode.UNAUTHENTICATED}
        cluster = Cluster(root, 3, remoting=tls, security=security,
                          connect=token_channel(pki, pki.tokens["admin"], tls))
    return Mode(name, cluster, idents, refusal)


@pytest.fixture(scope="module", params=["mtls", "tokens-tls", "tokens-plaintext"])
def mode(request: pytest.FixtureRequest, pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mode]:
    m = _make_mode(request.param, pki, str(tmp_path_factory.mktemp(request.param)))
    m.cluster.start()
    try:
        leader = m.cluster.wait_ready(timeout=60)
        seed = register_request("SecCluster", "sec-base", "10.77.0.1:10911", ["SecBase"])
        retry(lambda: leader.ns.RegisterBroker(seed, timeout=10))
        retry(lambda: leader.ns.PutKv(api_pb2.PutKvRequest(namespace="SEC", key="seed", value="v"), timeout=10))
        m.cluster.wait_converged()
        yield m
    finally:
        m.cluster.stop(wait=False)  # the nodes shut down while the next test starts
        os.environ.pop(PEER_TOKEN_ENV, None)


# ---- the RPC families --------------------------------------------------------------------------------


@dataclass
class Stubs:
    ns: api_pb2_grpc.NameServerStub
    admin: api_pb2_grpc.AdminStub
    log: api_pb2_grpc.LogStub
    leader_ns: api_pb2_grpc.NameServerStub  # ReadIndex is answered by the leader only


def _first(stream: Any) -> Any:
    try:
        return next(iter(stream), None)  # an empty stream that ended OK is fine too
    finally:
        stream.cancel()


def _stream_register(s: Stubs, tag: str) -> Any:
    req = register_request("SecCluster", f"sbs-{tag}", f"10.78.{int(tag) % 250}.2:10911", [f"SecStream{tag}"])
    header = api_pb2.RegisterBrokerRequest()
    header.CopyFrom(req)
    del header.topics[:]
    chunks = [api_pb2.RegisterBrokerChunk(header=header),
              api_pb2.RegisterBrokerChunk(topics=api_pb2.TopicConfigs(topics=req.topics))]
    return s.ns.RegisterBrokerStream(iter(chunks), timeout=10)


T = 10  # seconds per call
LIN = api_pb2.LINEARIZABLE  # a linearizable read on a follower asks the leader for a read index (peer)
CALLS: list[tuple[str, str, Callable[[Stubs, str], Any]]] = [
    ("broker", "RegisterBroker", lambda s, t: s.ns.RegisterBroker(register_request(
        "SecCluster", f"sb-{t}", f"10.78.{int(t) % 250}.1:10911", [f"SecTopic{t}"]), timeout=T)),
    ("broker", "RegisterBrokerStream", _stream_register),
    ("broker", "Heartbeat", lambda s, t: s.ns.Heartbeat(api_pb2.HeartbeatRequest(heartbeats=[
        api_pb2.BrokerHeartbeat(broker_addr="10.77.0.1:10911", cluster_name="SecCluster",
                                broker_name="sec-base")]), timeout=T)),
    ("broker", "UnregisterBroker", lambda s, t: s.ns.UnregisterBroker(api_pb2.UnregisterBrokerRequest(
        cluster_name="SecCluster", broker_name=f"sb-{t}", broker_addr=f"10.78.{int(t) % 250}.1:10911"),
        timeout=T)),
    ("client", "GetRoute", lambda s, t: s.ns.GetRoute(api_pb2.GetRouteRequest(topic="SecBase"), timeout=T)),
    ("client", "GetClusterInfo", lambda s, t: s.ns.GetClusterInfo(api_pb2.GetClusterInfoRequest(), timeout=T)),
    ("client", "GetTopicList", lambda s, t: s.ns.GetTopicList(api_pb2.GetTopicListRequest(), timeout=T)),
    ("client", "GetBrokerMemberGroup", lambda s, t: s.ns.GetBrokerMemberGroup(
        api_pb2.GetBrokerMemberGroupRequest(cluster_name="SecCluster", broker_name="sec-base"), timeout=T)),
    ("client", "GetKv", lambda s, t: s.ns.GetKv(api_pb2.GetKvRequest(namespace="SEC", key="seed"), timeout=T)),
    ("client", "ListKv", lambda s, t: s.ns.ListKv(api_pb2.ListKvRequest(namespace="SEC"), timeout=T)),
    ("client", "GetBinding", lambda s, t: s.ns.GetBinding(api_pb2.GetBindingRequest(
        topic="SecBase", queue_id=0, consistency=LIN), timeout=T)),
    ("client", "ListBindings", lambda s, t: s.ns.ListBindings(api_pb2.ListBindingsRequest(
        topic="SecBase", consistency=LIN), timeout=T)),
    ("watch", "Watch", lambda s, t: _first(s.ns.Watch(api_pb2.WatchRequest(topics=["SecBase"]), timeout=T))),
    ("admin", "Admin/Status", lambda s, t: s.admin.Status(api_pb2.StatusRequest(), timeout=T)),
    ("admin", "Admin/Members", lambda s, t: s.admin.Members(api_pb2.MembersRequest(), timeout=T)),
    ("admin", "Admin/TakeSnapshot", lambda s, t: s.admin.TakeSnapshot(api_pb2.TakeSnapshotRequest(), timeout=T)),
    ("admin", "Log/ReadLog", lambda s, t: _first(s.log.ReadLog(api_pb2.ReadLogRequest(from_offset=1, to_offset=1),
                                                               timeout=T))),
    ("admin", "Log/DumpState", lambda s, t: _first(s.log.DumpState(api_pb2.DumpStateRequest(), timeout=T))),
    ("write", "PutKv", lambda s, t: s.ns.PutKv(api_pb2.PutKvRequest(namespace="SEC", key=f"k{t}", value=t),
                                               timeout=T)),
    ("write", "DeleteKv", lambda s, t: s.ns.DeleteKv(api_pb2.DeleteKvRequest(namespace="SEC", key=f"k{t}"),
                                                     timeout=T)),
    ("write", "WipeWritePerm", lambda s, t: s.ns.WipeWritePerm(api_pb2.BrokerPermRequest(broker_name="sec-base"),
                                                               timeout=T)),
    ("write", "AddWritePerm", lambda s, t: s.ns.AddWritePerm(api_pb2.BrokerPermRequest(broker_name="sec-base"),
                                                             timeout=T)),
    ("write", "RegisterTopic", lambda s, t: s.ns.RegisterTopic(api_pb2.RegisterTopicRequest(
        topic=f"SecT{t}", queue_datas=[state_pb2.QueueData(broker_name="sec-base", read_queue_nums=1,
                                                           write_queue_nums=1, perm=6)]), timeout=T)),
    ("write", "DeleteTopic", lambda s, t: s.ns.DeleteTopic(api_pb2.DeleteTopicRequest(topic=f"SecT{t}"),
                                                           timeout=T)),
    ("write", "BindQueue", lambda s, t: s.ns.BindQueue(api_pb2.BindQueueRequest(
        topic=f"SecBind{t}", queue_id=0, owner="sec-base"), timeout=T)),
    ("write", "ReleaseQueue", lambda s, t: s.ns.ReleaseQueue(api_pb2.ReleaseQueueRequest(
        topic=f"SecBind{t}", queue_id=0, expected_version=1), timeout=T)),
    ("peer", "ReadIndex", lambda s, t: s.leader_ns.ReadIndex(api_pb2.ReadIndexRequest(), timeout=T)),
]


def _code(fn: Callable[[], Any]) -> tuple[grpc.StatusCode, str]:
    try:
        fn()
        return grpc.StatusCode.OK, ""
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or ""


def _digest(leader: NodeProc) -> tuple[str, int]:
    st = leader.status(timeout=5)
    assert st is not None, "the leader stopped answering"
    return st.digest, st.keys


_tags = iter(range(1, 1_000_000))


def test_role_matrix(mode: Mode) -> None:
    cluster = mode.cluster
    leader = cluster.wait_ready()
    target = next(n for n in cluster.nodes if n is not leader and n.alive)  # exercise forwarding
    failures = []
    for ident, (connect, role) in mode.identities.items():
        channel, to_leader = connect(target.grpc_addr, []), connect(leader.grpc_addr, [])
        stubs = Stubs(api_pb2_grpc.NameServerStub(channel), api_pb2_grpc.AdminStub(channel),
                      api_pb2_grpc.LogStub(channel), api_pb2_grpc.NameServerStub(to_leader))
        try:
            for family, method, call in CALLS:
                tag = str(next(_tags))
                allowed = role is not None and family in FAMILIES_OF[role]
                before = _digest(leader)
                # allowed calls retry through transient unavailability; a refusal is decided at once
                code, details = _code((lambda c=call, s=stubs, t=tag: retry(lambda: c(s, t))) if allowed
                                      else (lambda c=call, s=stubs, t=tag: c(s, t)))
                if allowed:
                    if code not in BENIGN:
                        failures.append(f"{mode.name}: {ident} {method}: expected allowed, got {code.name} {details}")
                    continue
                want = mode.refusal.get(ident, grpc.StatusCode.PERMISSION_DENIED)
                if code != want:
                    failures.append(f"{mode.name}: {ident} {method}: expected {want.name}, got {code.name} {details}")
                if _digest(leader) != before:
                    failures.append(f"{mode.name}: {ident} {method}: refused, yet the leader's state changed")
        finally:
            channel.close()
            to_leader.close()
    assert not failures, "\n".join(failures)
    cluster.wait_converged()  # allowed writes went through the follower to the leader and everywhere


def test_spoofed_node_headers_are_refused(mode: Mode) -> None:
    """x-rip18-forwarded and x-rip18-as-role are honoured only from peers."""
    leader = mode.cluster.wait_ready()
    connect = mode.identities["admin"][0]
    with connect(leader.grpc_addr, []) as channel:
        ns = api_pb2_grpc.NameServerStub(channel)
        before = _digest(leader)
        code, _ = _code(lambda: ns.PutKv(api_pb2.PutKvRequest(namespace="SEC", key="spoof", value="x"),
                                         timeout=T, metadata=[(headers.FORWARDED, "1")]))
        assert code == grpc.StatusCode.PERMISSION_DENIED
        code, _ = _code(lambda: ns.ReadIndex(api_pb2.ReadIndexRequest(), timeout=T,
                                             metadata=[(headers.AS_ROLE, "peer")]))
        assert code == grpc.StatusCode.PERMISSION_DENIED
        assert _digest(leader) == before
    # a peer may act as a lesser role: then it has only that role's rights
    with mode.identities["peer"][0](leader.grpc_addr, []) as channel:
        ns = api_pb2_grpc.NameServerStub(channel)
        as_client = [(headers.AS_ROLE, "client")]
        assert _code(lambda: ns.GetRoute(api_pb2.GetRouteRequest(topic="SecBase"), timeout=T,
                                         metadata=as_client))[0] == grpc.StatusCode.OK
        assert _code(lambda: ns.PutKv(api_pb2.PutKvRequest(namespace="SEC", key="as", value="x"), timeout=T,
                                      metadata=as_client))[0] == grpc.StatusCode.PERMISSION_DENIED


def test_transport_and_side_doors(mode: Mode, pki: Pki) -> None:
    cluster = mode.cluster
    node = cluster.wait_ready()
    if mode.name == "tokens-plaintext":
        # no TLS here: a TLS client cannot talk to it
        with token_channel(pki, pki.tokens["admin"], True)(node.grpc_addr, []) as ch:
            code, _ = _code(lambda: api_pb2_grpc.AdminStub(ch).Status(api_pb2.StatusRequest(), timeout=3))
        assert code == grpc.StatusCode.UNAVAILABLE
    else:
        # a plaintext client to a TLS node fails, whatever credential it carries
        with grpc.insecure_channel(node.grpc_addr) as ch:
            code, _ = _code(lambda: api_pb2_grpc.AdminStub(ch).Status(api_pb2.StatusRequest(), timeout=3,
                            metadata=[(headers.AUTHORIZATION, f"Bearer {pki.tokens['admin']}")]))
        assert code == grpc.StatusCode.UNAVAILABLE
    if mode.name == "mtls":  # a client certificate from another CA is rejected in the handshake
        with cert_channel(pki, "rogue")(node.grpc_addr, []) as ch:
            code, _ = _code(lambda: api_pb2_grpc.AdminStub(ch).Status(api_pb2.StatusRequest(), timeout=3))
        assert code == grpc.StatusCode.UNAVAILABLE
    # health stays open (load balancers and probes carry no token; mutual TLS still needs a certificate)
    with mode.identities["nobody" if mode.name == "mtls" else "none"][0](node.grpc_addr, []) as ch:
        reply = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    if mode.name == "mtls":  # refused calls are counted by the metrics interceptor, by status code
        with urllib.request.urlopen(f"http://{node.metrics_addr}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        assert 'code="UNAUTHENTICATED"' in text
        assert 'code="PERMISSION_DENIED"' in text
    if mode.name == "tokens-tls":  # the remoting listener reaches its node with the peer credential,
        # acting as [remoting] role = "client": reads work, writes are refused and change nothing
        before = _digest(node)
        topics = _remoting(node.remoting_addr, Command(code=codes.GET_ALL_TOPIC_LIST_FROM_NAMESERVER))
        assert topics.code == codes.SUCCESS, topics.remark
        assert b"SecBase" in topics.body
        put = _remoting(node.remoting_addr, Command(code=codes.PUT_KV_CONFIG, ext_fields={
            "namespace": "SEC", "key": "remoting", "value": "x"}))
        assert put.code != codes.SUCCESS
        assert _digest(node) == before
    for n in cluster.nodes:  # no token, password or key ever reaches a log
        with open(n.log_path, errors="replace") as f:
            text = f.read()
        for secret in pki.secrets:
            assert secret not in text, f"a secret appears in {n.name}'s log"


def _remoting(addr: str, cmd: Command) -> Command:
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=15) as sock:
        sock.sendall(frame.encode(cmd))

        def exactly(n: int) -> bytes:
            buf = b""
            while len(buf) < n:
                part = sock.recv(n - len(buf))
                assert part, "connection closed"
                buf += part
            return buf

        (total,) = struct.unpack(">i", exactly(4))
        return frame.decode(exactly(total))


def test_nsctl_with_tls_and_tokens(mode: Mode, pki: Pki) -> None:
    endpoints = ",".join(n.grpc_addr for n in mode.cluster.nodes)
    base = [sys.executable, "-m", "nameserver.cli.nsctl", "--endpoints", endpoints, "--timeout", "10"]
    env = os.environ | {"PYTHONPATH": ROOT}
    env.pop("NSCTL_TOKEN", None)
    if mode.name == "mtls":
        admin = ["--tls-ca", pki.ca.ca_file, "--tls-cert", pki.certs["admin"].cert,
                 "--tls-key", pki.certs["admin"].key]
        client = ["--tls-ca", pki.ca.ca_file, "--tls-cert", pki.certs["client"].cert,
                  "--tls-key", pki.certs["client"].key]
        admin_env, client_env = env, env
    else:
        tls = ["--tls-ca", pki.ca.ca_file] if mode.name == "tokens-tls" else []
        token_file = os.path.join(pki.dir, "admin.token")
        with open(token_file, "w") as f:
            f.write(pki.tokens["admin"])
        admin, client = tls + ["--token-file", token_file], tls
        admin_env, client_env = env, env | {"NSCTL_TOKEN": pki.tokens["client"]}
    ok = subprocess.run([*base, *admin, "kv", "put", "SEC", "nsctl", "yes"], capture_output=True, text=True,
                        cwd=ROOT, env=admin_env, timeout=60)
    assert ok.returncode == 0, ok.stderr
    denied = subprocess.run([*base, *client, "kv", "put", "SEC", "nsctl2", "no"], capture_output=True, text=True,
                            cwd=ROOT, env=client_env, timeout=60)
    assert denied.returncode == 1 and "PERMISSION_DENIED" in denied.stderr, denied.stderr
    written = re.search(r"offset (\d+)", ok.stdout)  # another process's write: read it at its offset
    assert written is not None, ok.stdout
    read = subprocess.run([*base, *client, "kv", "get", "SEC", "nsctl", "--min-offset", written.group(1)],
                          capture_output=True, text=True, cwd=ROOT, env=client_env, timeout=60)
    assert read.returncode == 0 and "yes" in read.stdout, read.stderr
    # No credential: refused at once in plaintext (UNAUTHENTICATED); over TLS the plaintext handshake fails
    # (UNAVAILABLE), which nsctl retries until --timeout, so a short one (the later --timeout wins).
    anonymous = subprocess.run([*base, "--timeout", "2", "kv", "get", "SEC", "nsctl"], capture_output=True,
                               text=True, cwd=ROOT, env=env, timeout=60)
    assert anonymous.returncode == 1, anonymous.stdout
    assert ("UNAVAILABLE" if mode.name != "tokens-plaintext" else "UNAUTHENTICATED") in anonymous.stderr, \
        anonymous.stderr
    for secret in pki.secrets:
        assert secret not in ok.stdout + ok.stderr + denied.stderr + read.stdout + read.stderr


def test_client_library_with_tls_and_tokens(mode: Mode, pki: Pki) -> None:
    """The Python client reaches a secured cluster with Credentials, and its role's rights are the server's."""
    endpoints = [n.grpc_addr for n in mode.cluster.nodes]
    tls_ca = pki.ca.ca_file if mode.name != "tokens-plaintext" else None
    if mode.name == "mtls":
        admin = Credentials(tls_ca=tls_ca, tls_cert=pki.certs["admin"].cert, tls_key=pki.certs["admin"].key)
        client = Credentials(tls_ca=tls_ca, tls_cert=pki.certs["client"].cert, tls_key=pki.certs["client"].key)
    else:
        admin = Credentials(tls_ca=tls_ca, token=pki.tokens["admin"])
        client = Credentials(tls_ca=tls_ca, token=pki.tokens["client"])
    assert pki.tokens["admin"] not in repr(admin)
    with Client(endpoints, timeout=20, credentials=admin) as c:
        put = c.put_kv("SEC", "lib", "yes")
        assert put.offset > 0
    with Client(endpoints, timeout=20, credentials=client) as c:
        # another client's write: a node that has not applied it yet would answer None without min_offset
        assert c.get_kv("SEC", "lib", min_offset=put.offset) == "yes"
        with pytest.raises(NameServerError) as refused:
            c.put_kv("SEC", "lib2", "no")
        assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED
    with Client(endpoints, timeout=2, credentials=Credentials(tls_ca=tls_ca)) as c, \
            pytest.raises(NameServerError) as anonymous:
        c.get_kv("SEC", "lib")
    assert anonymous.value.code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.UNAVAILABLE)


# ---- mutual TLS required, and configurations that must not start ----------------------------------------


def test_required_client_certificates(pki: Pki, tmp_path: Any) -> None:
    # a single node with only admin and peer certificates mapped, plus tokens on top of mutual TLS
    security = {"security": {"mode": "secure"}, "raft": {"password_file": pki.password_file},
                "tls": _tls(pki, "require"), "auth": {"cert_roles": {"admin": "admin", "node": "peer"},
                                                      "tokens_file": pki.tokens_file}}
    cluster = Cluster(str(tmp_path), 1, security=security, connect=cert_channel(pki, "admin"))
    cluster.start()
    try:
        node = cluster.wait_ready(timeout=60)
        for who in (None, "rogue"):  # no certificate, or one from another CA: the handshake fails
            with cert_channel(pki, who)(node.grpc_addr, []) as ch:
                code, _ = _code(lambda ch=ch: api_pb2_grpc.AdminStub(ch).Status(api_pb2.StatusRequest(), timeout=3))
            assert code == grpc.StatusCode.UNAVAILABLE, who
        with cert_channel(pki, "client")(node.grpc_addr, []) as ch:  # a CA-signed certificate without a role
            code, _ = _code(lambda: api_pb2_grpc.NameServerStub(ch).GetRoute(
                api_pb2.GetRouteRequest(topic="T"), timeout=3))
        assert code == grpc.StatusCode.PERMISSION_DENIED
        # a token on a mutual TLS connection decides the role: the client certificate's holder, as broker
        with cert_channel(pki, "client", pki.tokens["broker"])(node.grpc_addr, []) as ch:
            ns = api_pb2_grpc.NameServerStub(ch)
            beat = api_pb2.HeartbeatRequest(heartbeats=[api_pb2.BrokerHeartbeat(
                broker_addr="10.80.0.1:10911", cluster_name="C", broker_name="b")])
            assert _code(lambda: ns.Heartbeat(beat, timeout=5))[0] == grpc.StatusCode.OK
            code, _ = _code(lambda: ns.GetRoute(api_pb2.GetRouteRequest(topic="T"), timeout=3))
            assert code == grpc.StatusCode.PERMISSION_DENIED
    finally:
        cluster.stop(wait=False)  # the nodes shut down while the next test starts


def _serve(config_path: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nameserver.cli.serve", "serve", "--config", config_path],
                          capture_output=True, text=True, cwd=ROOT, timeout=60,
                          env=os.environ | {"PYTHONPATH": ROOT} | (env or {}))


def test_secure_mode_refuses_to_start_without_a_password_or_tls(pki: Pki, tmp_path: Any) -> None:
    cluster = Cluster(str(tmp_path), 1, security={
        "security": {"mode": "secure"}, "tls": _tls(pki, "require"),
        "auth": {"tokens_file": pki.tokens_file}})
    node = cluster.nodes[0]
    res = _serve(node.config_path)
    assert res.returncode == 2
    assert "raft.password_file" in res.stderr and "secure" in res.stderr, res.stderr
    assert not os.path.exists(os.path.join(str(tmp_path), "n1-data")), "refused, yet it created its data"
    (tmp_path / "notls").mkdir()
    cluster = Cluster(str(tmp_path / "notls"), 1, security={
        "security": {"mode": "secure"}, "raft": {"password_env": "RIP18_TEST_RAFT_PW"},
        "auth": {"tokens_file": pki.tokens_file}})
    res = _serve(cluster.nodes[0].config_path, {"RIP18_TEST_RAFT_PW": "s3cret-raft-pw"})
    assert res.returncode == 2 and "tls.cert_file" in res.stderr, res.stderr
    assert "s3cret-raft-pw" not in res.stderr + res.stdout
    res = _serve(cluster.nodes[0].config_path)  # the variable is not set: named, no value shown
    assert res.returncode == 2 and "RIP18_TEST_RAFT_PW" in res.stderr, res.stderr


# ---- the Raft password ------------------------------------------------------------------------------------


class _Marker:
    """A pickle that creates a file when loaded: code execution on the receiving node."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (open, (self.path, "w"))


def test_wrong_raft_password_cannot_join_or_inject(pki: Pki, tmp_path: Any) -> None:
    cluster = Cluster(str(tmp_path), 3, security=lambda n: {"raft": {
        "password_file": pki.wrong_password_file if n.name == "n3" else pki.password_file}})
    n1, n2, n3 = cluster.nodes
    cluster.start()
    try:
        leader = cluster.wait_ready([n1, n2], timeout=60)
        for i in range(3):
            retry(lambda i=i: leader.ns.RegisterBroker(register_request(
                "PwCluster", f"pw-{i}", f"10.79.0.{i + 1}:10911", [f"PwTopic{i}"]), timeout=10))
        good = cluster.wait_converged([n1, n2])
        # n3 dials both members all along; its handshake fails (pysyncobj then never even campaigns)
        time.sleep(2.0)
        # raw, unencrypted traffic to a member's Raft port: a pickle that would run code there
        marker = os.path.join(str(tmp_path), "injected")
        payload = zlib.compress(pickle.dumps(_Marker(marker)))
        for target in (n1, n2):
            host, port = target.raft_addr.rsplit(":", 1)
            with socket.create_connection((host, int(port)), timeout=5) as sock:
                sock.sendall(struct.pack("i", len(payload)) + payload)
                # the member reads the frame, cannot decrypt it and drops the connection
                try:
                    answer = sock.recv(1)
                except ConnectionResetError:
                    answer = b""
                assert answer == b"", f"{target.name} answered an unencrypted frame"
        assert not os.path.exists(marker), "an unencrypted pickle was loaded by a member"
        after = cluster.wait_converged([n1, n2])
        assert (after[0].digest, after[0].keys) == (good[0].digest, good[0].keys)
        assert after[0].apply_offset >= good[0].apply_offset
        s3 = n3.status()
        assert s3 is not None
        # (pysyncobj's own first log entry, index 1, is local; no entry of the cluster's ever arrived)
        assert s3.keys == 0 and s3.apply_offset <= 1 and not s3.ready, "the wrong-password node saw data"
        assert s3.digest != good[0].digest and s3.end_offset < good[0].apply_offset
        assert s3.leader_id in ("", n3.raft_addr)
        for s in after:
            assert s.leader_id in (n1.raft_addr, n2.raft_addr)
        # and it still cannot be used to write
        code, _ = _code(lambda: n3.ns.PutKv(api_pb2.PutKvRequest(namespace="PW", key="k", value="v"), timeout=1.5))
        assert code != grpc.StatusCode.OK
        assert cluster.wait_converged([n1, n2])[0].digest == good[0].digest
    finally:
        cluster.stop(wait=False)  # the nodes shut down while the next test starts
