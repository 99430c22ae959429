"""The Go front end's reply cache (front/cache.go; the worker's side: nameserver/api/frontchannel.py, Reusable)
on a real node: [node] grpc_front = "go", 2 worker processes, mutual TLS with roles from client certificates
and tokens on top.

A repeated route read is answered from the cache (the node's /metrics counts the hits), yet a changed
registration is read at once: the worker's state generation voids what was kept. An idle no-op does not: a
kept route outlives it, stating the offset it was read at. Callers of different
identities never share an entry: a certificate without a role, a broker's certificate, a token of another
role or none known are refused as ever after a client's identical read was kept. A read naming an offset the
node has not reached is never answered from the cache.
"""

from __future__ import annotations

import os
import secrets
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from nameserver import tlsconf
from nameserver.api.auth import hash_token
from nameserver.pb import api_pb2, api_pb2_grpc
from tests.certs import CertFiles, TestCA, write_private
from tests.cluster import Cluster, NodeProc, register_request

pytestmark = pytest.mark.cluster

TOPIC = "CachedTopic"


@dataclass
class Env:
    cluster: Cluster
    ca_file: str
    certs: dict[str, CertFiles]
    tokens: dict[str, str]

    @property
    def node(self) -> NodeProc:
        return self.cluster.nodes[0]

    def stub(self, cn: str, token: str | None = None) -> api_pb2_grpc.NameServerStub:
        cert = self.certs[cn]
        return api_pb2_grpc.NameServerStub(tlsconf.open_channel(
            self.node.grpc_addr, tls=True, ca_file=self.ca_file, cert_file=cert.cert, key_file=cert.key,
            token=self.tokens[token] if token is not None else None))

    def hits(self) -> dict[str, float]:
        """The node's nameserver_grpc_front_cache_hits_total, by method."""
        with urllib.request.urlopen(f"http://{self.node.metrics_addr}/metrics", timeout=5) as r:
            text = r.read().decode()
        return {s.labels["method"]: s.value for family in text_string_to_metric_families(text)
                for s in family.samples if s.name == "nameserver_grpc_front_cache_hits_total"}

    def metric(self, name: str) -> float:
        with urllib.request.urlopen(f"http://{self.node.metrics_addr}/metrics", timeout=5) as r:
            text = r.read().decode()
        return next(s.value for family in text_string_to_metric_families(text) for s in family.samples
                    if s.name == name)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    root = str(tmp_path_factory.mktemp("front-cache"))
    ca = TestCA(os.path.join(root, "pki"))
    certs = {"node": ca.node("node")} | {cn: ca.issue(cn) for cn in ("broker", "client", "nobody")}
    tokens = {role: secrets.token_urlsafe(24) for role in ("client", "broker")}
    tokens_file = write_private(root, "tokens.toml", "[tokens]\n" + "".join(
        f'"{hash_token(t)}" = "{role}"\n' for role, t in tokens.items()))
    security = {"security": {"mode": "secure"},
                "raft": {"password_file": write_private(root, "raft.pw", secrets.token_urlsafe(24))},
                "tls": {"cert_file": certs["node"].cert, "key_file": certs["node"].key, "ca_file": ca.ca_file,
                        "client_auth": "require"},
                "auth": {"cert_roles": {"broker": "broker", "client": "client", "node": "peer"},
                         "tokens_file": tokens_file},
                "remoting": {"role": "peer"}}
    cluster = Cluster(root, size=1, metrics=True, remoting=True, worker_processes=2, grpc_front="go",
                      security=security, connect=lambda addr, opts=(): tlsconf.open_channel(
                          addr, tls=True, ca_file=ca.ca_file, cert_file=certs["node"].cert,
                          key_file=certs["node"].key, options=opts))
    cluster.start()
    try:
        cluster.wait_ready(timeout=120)
        e = Env(cluster, ca.ca_file, certs, tokens)
        e.stub("broker").RegisterBroker(register_request("CacheCluster", "cb1", "10.8.0.1:10911", [TOPIC]),
                                        timeout=10)
        yield e
    finally:
        cluster.stop()


def _route(env: Env, stub: api_pb2_grpc.NameServerStub, want: int) -> api_pb2.GetRouteReply:
    """The same request (byte for byte) again and again, until its route has `want` read queues (the
    node's workers apply a registration moments after the core)."""
    found: list[api_pb2.GetRouteReply] = []

    def read() -> bool:
        found[:] = [stub.GetRoute(api_pb2.GetRouteRequest(topic=TOPIC), timeout=5)]
        return [q.read_queue_nums for q in found[0].route.queue_datas] == [want]

    env.cluster.wait_for(f"{TOPIC}'s route with {want} read queues", read, timeout=15, every=0.05)
    return found[0]


def test_a_changed_registration_is_read_at_once(env: Env) -> None:
    client = env.stub("client")
    _route(env, client, 4)
    method = "GetRoute"
    env.cluster.wait_for("route reads answered from the cache", lambda: _reads_hit(
        env, method, lambda: client.GetRoute(api_pb2.GetRouteRequest(topic=TOPIC), timeout=5)), timeout=20)
    # the same broker registers again, its topic now with 8 queues
    changed = env.stub("broker").RegisterBroker(register_request(
        "CacheCluster", "cb1", "10.8.0.1:10911", [TOPIC], counter=2, queues=8), timeout=10)
    reply = _route(env, client, 8)
    assert reply.apply_offset >= changed.offset
    hits = env.hits()[method]

    def all_new() -> bool:  # every worker's answer (each applies the change moments after the core)
        return all([q.read_queue_nums for q in client.GetRoute(api_pb2.GetRouteRequest(topic=TOPIC), timeout=5)
                    .route.queue_datas] == [8] for _ in range(20))

    # a kept reply of the old state would be answered for ever: by each worker's share of the reads
    env.cluster.wait_for("20 reads in a row with the new route", all_new, timeout=15, every=0.05)
    # the new route is kept in its turn
    env.cluster.wait_for("the new route answered from the cache", lambda: env.hits()[method] > hits, timeout=10)


def test_a_kept_route_outlives_idle_no_ops_and_states_the_offset_it_was_read_at(env: Env) -> None:
    client = env.stub("client")
    request = api_pb2.GetRouteRequest(topic=TOPIC)
    env.cluster.wait_for("route reads answered from the cache", lambda: _reads_hit(
        env, "GetRoute", lambda: client.GetRoute(request, timeout=5)), timeout=20)

    def node_offset() -> int:  # a read no worker marks reusable: the worker's offset now
        return client.GetBrokerMemberGroup(api_pb2.GetBrokerMemberGroupRequest(
            cluster_name="CacheCluster", broker_name="cb1"), timeout=5).apply_offset

    before = env.hits()["GetRoute"]
    kept = []
    for _ in range(5):  # each read after the idle no-op (every 0.5 s here) was applied: nothing it shows moved
        time.sleep(1.0)
        kept.append(client.GetRoute(request, timeout=5))
    env.cluster.wait_for("spaced route reads answered from the cache",
                         lambda: env.hits()["GetRoute"] >= before + 3, timeout=5, every=0.2)
    now = node_offset()
    # a kept reply states the offset it was read at: below the node's by the no-ops applied since
    assert min(r.apply_offset for r in kept) < now
    assert all(r.route == kept[0].route for r in kept)
    # a read naming the node's offset is an entry of its own, never one read below it
    for _ in range(10):
        assert client.GetRoute(api_pb2.GetRouteRequest(topic=TOPIC, min_offset=now), timeout=5).apply_offset >= now
        assert client.GetClusterInfo(api_pb2.GetClusterInfoRequest(min_offsets=[now]), timeout=5).apply_offset >= now


def _reads_hit(env: Env, method: str, read: Callable[[], object]) -> bool:
    """20 reads (both workers' replies kept, and answered again), then whether the front end counted hits
    of `method` since (it writes its counts each second)."""
    before = env.hits().get(method, 0)
    for _ in range(20):
        read()
    time.sleep(1.1)
    return env.hits().get(method, 0) >= before + 5


def _refused(call: object) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as err:
        call()  # type: ignore[operator]
    return err.value.code()


def test_callers_of_other_identities_share_no_entry(env: Env) -> None:
    client = env.stub("client")
    info, route = api_pb2.GetClusterInfoRequest(), api_pb2.GetRouteRequest(topic=TOPIC)
    env.cluster.wait_for("cluster info answered from the cache", lambda: _reads_hit(
        env, "GetClusterInfo", lambda: client.GetClusterInfo(info, timeout=5)), timeout=20)
    nobody, broker = env.stub("nobody"), env.stub("broker")
    with_broker_token = env.stub("client", "broker")
    forged = api_pb2_grpc.NameServerStub(tlsconf.open_channel(
        env.node.grpc_addr, tls=True, ca_file=env.ca_file, cert_file=env.certs["client"].cert,
        key_file=env.certs["client"].key, token="not-a-token"))
    refusals = [  # the same requests as the client's: another certificate (the same metadata), or a token
        (lambda: nobody.GetClusterInfo(info, timeout=5), grpc.StatusCode.PERMISSION_DENIED),  # a cert without a role
        (lambda: nobody.GetRoute(route, timeout=5), grpc.StatusCode.PERMISSION_DENIED),
        (lambda: broker.GetRoute(route, timeout=5), grpc.StatusCode.PERMISSION_DENIED),  # a broker reads no route
        (lambda: with_broker_token.GetRoute(route, timeout=5), grpc.StatusCode.PERMISSION_DENIED),  # a token decides
        (lambda: forged.GetRoute(route, timeout=5), grpc.StatusCode.UNAUTHENTICATED),
    ]
    for _ in range(10):
        for call, code in refusals:
            # the client's reply kept by both workers just now
            client.GetClusterInfo(info, timeout=5)
            client.GetClusterInfo(info, timeout=5)
            client.GetRoute(route, timeout=5)
            client.GetRoute(route, timeout=5)
            assert _refused(call) == code
    by_token = env.stub("nobody", "client")
    for _ in range(5):  # a client's token over a certificate without a role: a client's reads
        assert by_token.GetRoute(route, timeout=5).route.queue_datas


def test_a_read_past_the_nodes_offset_is_not_answered_from_the_cache(env: Env) -> None:
    client = env.stub("client")
    at = client.GetRoute(api_pb2.GetRouteRequest(topic=TOPIC), timeout=5).apply_offset
    for _ in range(10):  # kept: an offset the node holds
        client.GetRoute(api_pb2.GetRouteRequest(topic=TOPIC, min_offset=at), timeout=5)
        client.GetClusterInfo(api_pb2.GetClusterInfoRequest(min_offsets=[at]), timeout=5)
    ahead = at + 1_000_000
    for _ in range(3):
        for call in (lambda: client.GetRoute(api_pb2.GetRouteRequest(topic=TOPIC, min_offset=ahead), timeout=1),
                     lambda: client.GetClusterInfo(api_pb2.GetClusterInfoRequest(min_offsets=[ahead]), timeout=1)):
            with pytest.raises(grpc.RpcError) as err:  # a kept reply would be an answer
                call()
            # its deadline, or the node's answer at it; CANCELLED "Stream removed (RST_STREAM ... code 8)":
            # grpc-go resets the stream at the server's deadline, which the client may see before its own
            # (test_grpc_front_go.py's test_a_deadline_ends_the_call fails on it at bf20117 too). Any of these
            # is a wait, where a kept reply would be an answer at once
            assert err.value.code() in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE,
                                        grpc.StatusCode.CANCELLED), err.value
    assert env.metric("nameserver_grpc_front_cache_misses_total") > 0

    def held() -> bool:  # read, then look
        for _ in range(20):
            client.GetRoute(api_pb2.GetRouteRequest(topic=TOPIC), timeout=5)
        return env.metric("nameserver_grpc_front_cache_entries") > 0 and \
            env.metric("nameserver_grpc_front_cache_bytes") > 0

    env.cluster.wait_for("entries in the front end's cache", held, timeout=20, every=0.2)
