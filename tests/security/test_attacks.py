"""The black-box probe's attacks (issue 11), re-run against a real secure 3-node cluster.

Each test runs one attack as an outsider would and checks it is refused or absorbed: no secret in any
reply, no write by a caller without the right, no node exit, no wedge past the configured deadline,
resident memory bounded (the bound is stated per attack), the log unchanged by rejected input, and
the cluster writable (a write acknowledged within 2 s) while the attack runs. The Raft-port attack
(attack 3) is in test_raft_port.py.

The default run is short: small [limits] so that every limit is crossed in seconds. SECURITY_LONG=1
(`make security`) runs the floods at full size against the default limits.
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request
import zlib
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from nameserver import headers
from nameserver.pb import api_pb2, api_pb2_grpc
from nameserver.remoting import codes
from tests.cluster import ROOT, Cluster, NodeProc, register_request
from tests.security.attacks import (
    LONG,
    SHORT_LIMITS,
    Secure,
    Writer,
    closed_by_peer,
    eventually,
    open_connections,
    open_fds,
    remoting_call,
    remoting_frame,
    rss_mib,
    secure_cluster,
    started,
    threads,
)

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def sec(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secure]:
    with started(secure_cluster(str(tmp_path_factory.mktemp("secure")), None if LONG else SHORT_LIMITS)) as s:
        yield s


def _leader(sec: Secure) -> NodeProc:
    leader = sec.cluster.wait_ready(timeout=30)
    assert leader is not None
    return leader


def _idle_noops(node: NodeProc) -> float:
    """The empty entries this leader appended while idle (nameserver_idle_noops_total)."""
    with urllib.request.urlopen(f"http://{node.metrics_addr}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("nameserver_idle_noops_total "):
                return float(line.split()[1])
    raise AssertionError("no nameserver_idle_noops_total on the leader's /metrics")


def _limit(name: str, default: int) -> int:
    return default if LONG else SHORT_LIMITS[name]


def _all_alive(sec: Secure) -> None:
    for n in sec.cluster.nodes:
        assert n.alive, f"{n.name} exited (code {n.proc.poll() if n.proc else None}):\n{sec.cluster.logs()}"


# ---- 1: GET_NAMESRV_CONFIG -----------------------------------------------------------------------


def test_1_namesrv_config_lists_settings_never_secrets(sec: Secure) -> None:
    for node in sec.cluster.nodes:
        reply = remoting_call(node.remoting_addr, codes.GET_NAMESRV_CONFIG)
        assert reply.code == codes.SUCCESS
        text = reply.body.decode()
        assert "election_min_ms=" in text and "security_mode=secure" in text  # settings are listed
        for secret in sec.secrets:
            assert secret not in text, "a token, token hash or password is in the 319 reply"
        for word in ("token", "password", "cert_roles", "peer_role", "remoting_role", "key_file"):
            assert word not in text, f"{word!r} appears in the 319 reply"


# ---- 2: secure mode with remoting on needs a remoting role ---------------------------------------


def test_2_secure_mode_refuses_remoting_without_a_role(tmp_path: Any) -> None:
    s = secure_cluster(str(tmp_path), remoting_role="")
    node = s.cluster.nodes[0]
    res = subprocess.run([sys.executable, "-m", "nameserver.cli.serve", "serve", "--config", node.config_path],
                         capture_output=True, text=True, cwd=ROOT, timeout=60,
                         env=os.environ | {"PYTHONPATH": ROOT})
    assert res.returncode != 0
    assert "[remoting] role" in res.stderr, res.stderr


def test_2_anonymous_remoting_gets_only_its_role(sec: Secure) -> None:
    """[remoting] role = "broker": an anonymous remoting caller may register, never administer."""
    leader = _leader(sec)
    noops_before = _idle_noops(leader)
    before = leader.status()
    assert before is not None
    addr = sec.cluster.followers()[0].remoting_addr
    for code, ext in ((codes.PUT_KV_CONFIG, {"namespace": "N", "key": "k", "value": "v"}),
                      (codes.WIPE_WRITE_PERM_OF_BROKER, {"brokerName": "b"}),
                      (codes.DELETE_TOPIC_IN_NAMESRV, {"topic": "T"}),
                      (codes.DELETE_KV_CONFIG, {"namespace": "N", "key": "k"})):
        reply = remoting_call(addr, code, ext)
        assert reply.code == codes.NO_PERMISSION, (code, reply.code, reply.remark)
    after = leader.status()
    noops_after = _idle_noops(leader)
    # This cluster runs the idle no-op (its metrics are on): only those empty entries may have been appended.
    assert after is not None and after.digest == before.digest, "a refused call changed the state"
    assert after.end_offset - before.end_offset <= noops_after - noops_before, "a refused call entered the log"


# ---- 4: waits bounded by the call's deadline and the server's maximum, cancelled on disconnect -----


def test_4_waiting_reads_are_bounded_and_cancelled(sec: Secure) -> None:
    node = sec.cluster.followers()[0]
    max_waiting = _limit("max_waiting_reads", 16)
    max_wait_s = _limit("max_wait_ms", 30_000) / 1000
    far = api_pb2.GetRouteRequest(topic="T", min_offset=1 << 62)
    ch = sec.channel(node, "client")
    ns = api_pb2_grpc.NameServerStub(ch)
    writer = Writer(sec.stub(node, "admin"), tag="waits-", cluster=sec.cluster).__enter__()
    # 100 reads with no deadline: the first max_waiting wait, the rest are refused at once
    futures = [ns.GetRoute.future(far) for _ in range(100)]
    time.sleep(1.0)
    refused = [f for f in futures if f.done()]
    assert len(refused) >= 100 - max_waiting, f"only {len(refused)} of 100 far reads were refused at once"
    for f in refused:
        assert f.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "min_offset" in f.details(), f.details()
    # meanwhile the node answers everything else
    t0 = time.monotonic()
    st = node.status(timeout=2)
    assert st is not None and time.monotonic() - t0 < 1.0
    ok = sec.stub(node, "client").GetClusterInfo(api_pb2.GetClusterInfoRequest(), timeout=2)
    assert ok is not None
    # the client goes away: its waiting reads end within a second, so new waiters are admitted
    ch.close()
    def admitted() -> bool:
        try:
            sec.stub(node, "client").GetRoute(far, timeout=0.5)
        except grpc.RpcError as exc:
            return exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED
        return False
    eventually("the cancelled reads freed their places", admitted, timeout=3)
    # a read without a deadline ends at the server's maximum wait, not later
    t0 = time.monotonic()
    with pytest.raises(grpc.RpcError) as err:
        sec.stub(node, "client").GetRoute(far)
    took = time.monotonic() - t0
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert took < max_wait_s + 2.0, f"a read without a deadline waited {took:.1f} s (limit {max_wait_s} s)"
    writer.__exit__()
    writer.check()


# ---- 5: connection floods on the remoting and gRPC ports ------------------------------------------


def _remoting_cap(node: NodeProc) -> int:
    """The node's remoting connection cap as it logged it: by default it follows the open-file limit."""
    with open(node.log_path, errors="replace") as f:
        # "listening on", or "bound, not yet accepting, on" for a port that opens once the node is ready
        found = re.findall(rf"(?:listening|bound, not yet accepting,) on {re.escape(node.remoting_addr)}, "
                           r"at most (\d+) connections", f.read())
    return int(found[-1])


@pytest.mark.parametrize("port", ["remoting", "grpc"])
def test_5_connection_flood_is_refused_not_fatal(sec: Secure, port: str) -> None:
    node = _leader(sec)
    addr = node.remoting_addr if port == "remoting" else node.grpc_addr
    limit = _limit(f"{port}_max_connections", 4096) if port == "grpc" or not LONG else _remoting_cap(node)
    count = 20_000 if LONG else limit + 150
    fds_before = open_fds(node)
    with Writer(sec.stub(node, "admin"), tag=f"flood-{port}-", cluster=sec.cluster) as writer, \
            open_connections(addr, count) as socks:
        time.sleep(1.0)
        _all_alive(sec)
        held = open_fds(node) - fds_before
        assert held <= limit + 64, f"{held} descriptors held for {len(socks)} connections (limit {limit})"
        # beyond the limit, connections are closed at once
        assert closed_by_peer(socks) >= len(socks) - limit - 5
        # idle (or never-speaking) connections are closed after the idle or handshake timeout
        idle_s = _limit(f"{port}_{'idle' if port == 'remoting' else 'handshake'}_timeout_ms",
                        120_000 if port == "remoting" else 10_000) / 1000
        eventually("idle connections closed", lambda: closed_by_peer(socks) >= len(socks) - 5, timeout=idle_s + 5)
    writer.check()
    _all_alive(sec)
    # the port serves new callers again
    if port == "remoting":
        assert remoting_call(addr, codes.GET_NAMESRV_CONFIG).code == codes.SUCCESS
    else:
        assert sec.stub(node, "client").GetClusterInfo(api_pb2.GetClusterInfoRequest(), timeout=5) is not None


def test_5_slow_sender_is_dropped(sec: Secure) -> None:
    node = sec.cluster.followers()[0]
    frame_s = _limit("remoting_frame_timeout_ms", 30_000) / 1000
    host, port = node.remoting_addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=frame_s + 10) as s:
        s.sendall(struct.pack(">i", 1000) + b"\x00")  # a frame begun, never finished
        t0 = time.monotonic()
        assert s.recv(1) == b""  # closed by the node
        assert time.monotonic() - t0 < frame_s + 3


def test_5_slow_grpc_stream_is_cancelled(sec: Secure) -> None:
    """A registration stream that sends its header and then nothing holds a server thread only until the
    first of its two bounds: limits.grpc_progress_timeout_ms (no next chunk; 10 s) or limits.max_wait_ms
    (the whole stream; 3 s in the short run, 30 s at full size). Either way it is cancelled with
    DEADLINE_EXCEEDED naming that limit (docs/operations.md, [limits]), and nothing of it is registered."""
    node = sec.cluster.followers()[0]
    bounds = {"limits.max_wait_ms": _limit("max_wait_ms", 30_000) / 1000,
              "limits.grpc_progress_timeout_ms": 10.0}  # the default in both runs
    limit, bound_s = min(bounds.items(), key=lambda kv: kv[1])
    stall = threading.Event()

    def chunks() -> Iterator[api_pb2.RegisterBrokerChunk]:
        yield api_pb2.RegisterBrokerChunk(header=register_request("C5", "slow", "10.5.0.1:10911", []))
        stall.wait(bound_s + 30)  # never sends the rest (until the test ends)

    t0 = time.monotonic()
    try:
        with pytest.raises(grpc.RpcError) as err:
            sec.stub(node, "broker").RegisterBrokerStream(chunks())  # no deadline
        took = time.monotonic() - t0
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED, err.value
        assert limit in (err.value.details() or ""), err.value
        assert took < bound_s + 3, f"a stalled stream held the server {took:.1f} s (limit {limit}: {bound_s} s)"
    finally:
        stall.set()
    time.sleep(1.0)  # a cut-short stream registered anyway would be by now (it is a local write's time)
    leader = _leader(sec)
    info = sec.stub(leader, "admin").GetClusterInfo(api_pb2.GetClusterInfoRequest(), timeout=5)
    assert "slow" not in info.broker_addr_table, "a registration stream cut short was registered"


# ---- 6: a compressed registration declaring millions of topics --------------------------------------


def _compressed_bomb(declared: int, real: int) -> bytes:
    def chunk(b: bytes) -> bytes:
        return struct.pack(">i", len(b)) + b
    raw = chunk(b'{"counter":1,"stateVersion":0,"timestamp":1}') + struct.pack(">i", declared)
    raw += b"".join(chunk(f"T{i} 4 4 6 SINGLE_TAG".encode()) for i in range(real))
    return zlib.compress(raw, 9)


def test_6_compressed_topic_bomb_is_refused_before_it_is_built(sec: Secure) -> None:
    node = sec.cluster.followers()[0]
    ext = {"brokerName": "bomb", "brokerAddr": "10.66.0.1:10911", "clusterName": "C", "brokerId": "0",
           "haServerAddr": "", "compressed": "true"}
    bombs = (_compressed_bomb(5_000_000, 10), _compressed_bomb(5_000_000, 5_000_000 if LONG else 2_000_000))
    before = rss_mib(node)
    # 5 million topics declared, and (a second body) millions of real topic lines in a few MiB
    with Writer(sec.stub(node, "admin"), tag="bomb-", cluster=sec.cluster) as writer:
        for body in bombs * (5 if LONG else 2):
            t0 = time.monotonic()
            reply = remoting_call(node.remoting_addr, codes.REGISTER_BROKER, ext, body, timeout=30)
            assert reply.code == codes.SYSTEM_ERROR
            assert "topics" in (reply.remark or "") or "inflates past" in (reply.remark or ""), reply.remark
            assert time.monotonic() - t0 < 5
    writer.check()
    grown = rss_mib(node) - before
    assert grown < 200, f"resident memory grew {grown:.0f} MiB for refused registrations (bound 200 MiB)"
    info = sec.stub(node, "admin").GetClusterInfo(api_pb2.GetClusterInfoRequest(), timeout=5)
    assert "bomb" not in info.broker_addr_table


# ---- 7: replies never read --------------------------------------------------------------------------


def test_7_unread_replies_push_back_and_close(sec: Secure) -> None:
    node = sec.cluster.followers()[0]
    reply_s = _limit("remoting_reply_timeout_ms", 30_000) / 1000
    before = rss_mib(node)
    host, port = node.remoting_addr.rsplit(":", 1)
    request = remoting_frame(codes.GET_NAMESRV_CONFIG)
    sent = 0
    with Writer(sec.stub(node, "admin"), tag="unread-", cluster=sec.cluster) as writer:
        s = socket.create_connection((host, int(port)))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.settimeout(0.5)
        deadline = time.monotonic() + (60 if LONG else 10)
        try:
            while time.monotonic() < deadline:
                s.sendall(request * 100)  # blocks once the node stops reading (backpressure)
                sent += 100
        except (TimeoutError, OSError):
            pass
        grown = rss_mib(node) - before
        # another client is answered at once meanwhile
        t0 = time.monotonic()
        assert remoting_call(node.remoting_addr, codes.GET_NAMESRV_CONFIG).code == codes.SUCCESS
        assert time.monotonic() - t0 < 1.0
        # the connection whose replies go unread is closed
        s.settimeout(reply_s + 10)
        with pytest.raises(OSError):
            while s.recv(1 << 16):
                pass
            raise ConnectionResetError
        s.close()
    writer.check()
    assert grown < 50, f"resident memory grew {grown:.0f} MiB for {sent} unread requests (bound 50 MiB)"


# ---- 8 and 9: exactly-once sessions belong to their caller; rejected writes never append -----------


def test_8_client_id_reuse_reaches_only_the_callers_own_sessions(sec: Secure) -> None:
    leader = _leader(sec)
    follower = sec.cluster.followers()[0]

    def register(node: NodeProc, role: str, cid: str, seq: int, counter: int) -> api_pb2.RegisterBrokerReply:
        req = register_request("C8", f"{role}-{node.name}", f"10.8.0.{len(role)}:10911", [f"T8-{role}"],
                               counter=counter, timeout_ms=600_000)
        return sec.stub(node, role).RegisterBroker(req, timeout=10, metadata=[(headers.CLIENT_ID, cid),
                                                                              (headers.CLIENT_SEQ, str(seq))])

    for node in (leader, follower):  # directly, and across the forwarding path
        cid = f"victim-{node.name}"
        first = register(node, "broker", cid, 5, 1)
        assert first.records > 0
        # another caller reusing the victim's client id and sequence gets its own write, not the victim's reply
        other = register(node, "broker2", cid, 5, 1)
        assert other.records > 0 and other.offset != first.offset
        # and a huge sequence number poisons only the attacker's own session
        register(node, "broker2", cid, 1 << 62, 2)
        again = register(node, "broker", cid, 6, 2)
        assert again.records > 0 and again.offset > other.offset
        # the victim's own retry still replays its own reply
        assert register(node, "broker", cid, 6, 2).offset == again.offset


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Dev mode (no auth: remoting may write KV), no metrics (so no idle no-op entries), remoting on."""
    cluster = Cluster(str(tmp_path_factory.mktemp("dev")), 3, remoting=True)
    cluster.start()
    try:
        cluster.wait_ready(timeout=60)
        yield cluster
    finally:
        cluster.stop(wait=False)  # the nodes shut down while the next test starts


def test_9_rejected_writes_never_append(dev: Cluster) -> None:
    leader = dev.wait_ready(timeout=30)
    follower = dev.followers()[0]
    md = [(headers.CLIENT_ID, "stale"), (headers.CLIENT_SEQ, "100")]
    leader.ns.PutKv(api_pb2.PutKvRequest(namespace="S9", key="k", value="v"), timeout=10, metadata=md)
    dev.wait_converged(timeout=20)
    before = leader.status()
    assert before is not None
    for node in (leader, follower) * 10:
        with pytest.raises(grpc.RpcError) as err:
            node.ns.PutKv(api_pb2.PutKvRequest(namespace="S9", key="k2", value="v"), timeout=10,
                          metadata=[(headers.CLIENT_ID, "stale"), (headers.CLIENT_SEQ, "50")])
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    after = leader.status()
    assert after is not None and after.end_offset == before.end_offset, (
        f"20 rejected writes moved the end offset {before.end_offset} -> {after.end_offset}")


# ---- 10: extFields that are objects or arrays ----------------------------------------------------------


def test_10_ext_fields_must_be_scalars(dev: Cluster) -> None:
    node = dev.followers()[0]
    before = dev.wait_ready(timeout=30).status()
    for value in ({"a": 1}, [1, 2]):
        reply = remoting_call(node.remoting_addr, codes.PUT_KV_CONFIG,
                              raw_ext={"namespace": "S10", "key": "k", "value": value})
        assert reply.code == codes.SYSTEM_ERROR and "<value>" in (reply.remark or ""), reply.remark
    with pytest.raises(grpc.RpcError) as err:
        node.ns.GetKv(api_pb2.GetKvRequest(namespace="S10", key="k"), timeout=5)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    after = dev.wait_ready(timeout=30).status()
    assert before is not None and after is not None and after.end_offset == before.end_offset
    # numbers, booleans and null are what real clients send: accepted
    reply = remoting_call(node.remoting_addr, codes.PUT_KV_CONFIG,
                          raw_ext={"namespace": "S10", "key": "n", "value": 7, "extra": None, "flag": True})
    assert reply.code == codes.SUCCESS
    at = dev.wait_ready().status().commit_offset  # the remoting reply has no offset; the leader's commit covers it
    assert node.ns.GetKv(api_pb2.GetKvRequest(namespace="S10", key="n", min_offset=at), timeout=5).value == "7"


# ---- 11: idle connections to /metrics -----------------------------------------------------------------


def test_11_idle_metrics_connections_cannot_pile_up_threads(sec: Secure) -> None:
    node = _leader(sec)
    limit = _limit("metrics_max_connections", 16)
    timeout_s = _limit("metrics_timeout_ms", 10_000) / 1000
    base = threads(node)
    with Writer(sec.stub(node, "admin"), tag="metrics-", cluster=sec.cluster) as writer, \
            open_connections(node.metrics_addr, 3000 if LONG else 300) as socks:
        time.sleep(1.0)
        assert threads(node) <= base + limit + 2, f"{threads(node)} threads (was {base}, limit {limit})"
        eventually("idle scrapes time out", lambda: closed_by_peer(socks) >= len(socks) - 2, timeout=timeout_s + 5)
    writer.check()
    with urllib.request.urlopen(f"http://{node.metrics_addr}/metrics", timeout=5) as r:
        assert b"nameserver_apply_offset" in r.read()


# ---- the floods against one node, with the cluster still writable through every node -------------------


def test_every_node_writable_after_the_attacks(sec: Secure) -> None:
    _all_alive(sec)
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        took = list(pool.map(lambda n: _timed_put(sec, n), sec.cluster.nodes))
    assert max(took) < 2.0, took
    sec.cluster.wait_converged(timeout=30)


def _timed_put(sec: Secure, node: NodeProc) -> float:
    t0 = time.monotonic()
    sec.stub(node, "admin").PutKv(api_pb2.PutKvRequest(namespace="ATTACK", key=f"end-{node.name}", value="1"),
                                  timeout=5)
    return time.monotonic() - t0
