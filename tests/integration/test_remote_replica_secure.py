"""A read replica on another machine in secure mode (`slow`: a TLS cluster of its own): it follows the voters
with its peer credential (its certificate, which the voters map to the peer role), serves reads to callers
its own [auth] admits, and passes a write on with the caller's credential, so the voter decides as for a
direct call: a broker's write is acknowledged, a client's token is refused PERMISSION_DENIED."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator

import grpc
import pytest

from nameserver import tlsconf
from nameserver.api.auth import hash_token
from nameserver.pb import api_pb2, api_pb2_grpc
from tests.certs import TestCA, write_private
from tests.cluster import Cluster, _toml, register_request, running
from tests.integration.test_remote_replica import Replica, _ready, start_replica, wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, Replica, TestCA, dict[str, str]]]:
    root = str(tmp_path_factory.mktemp("remote-replica-secure"))
    ca = TestCA(os.path.join(root, "pki"))
    certs = {"node": ca.node("node")} | {cn: ca.issue(cn) for cn in ("broker", "client", "admin")}
    tokens = {"client": secrets.token_urlsafe(24), "admin": secrets.token_urlsafe(24)}
    tokens_file = write_private(root, "tokens.toml", "[tokens]\n" + "".join(
        f'"{hash_token(t)}" = "{role}"\n' for role, t in tokens.items()))
    password = write_private(root, "raft.pw", secrets.token_urlsafe(24))
    tls = {"cert_file": certs["node"].cert, "key_file": certs["node"].key, "ca_file": ca.ca_file,
           "client_auth": "require"}
    auth = {"cert_roles": {"broker": "broker", "client": "client", "admin": "admin", "node": "peer"},
            "tokens_file": tokens_file}
    security = {"security": {"mode": "secure"}, "raft": {"password_file": password}, "tls": tls, "auth": auth,
                "remoting": {"role": "client"}}

    def connect(addr: str, opts: list) -> grpc.Channel:
        return tlsconf.open_channel(addr, tls=True, ca_file=ca.ca_file, cert_file=certs["admin"].cert,
                                    key_file=certs["admin"].key, options=opts)

    # the replica's own security: the voters' TLS and [auth], no Raft password (it has no Raft port)
    extra = "".join(f"[{section}]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in table.items()) + "\n"
                    for section, table in {"security": {"mode": "secure"}, "tls": tls, "auth": auth}.items())
    with running(Cluster(root, 3, remoting=True, security=security, connect=connect), timeout=90) as c:
        r = start_replica(root, "replica", c.nodes, extra, connect, remoting_role="client")
        try:
            wait_until("the replica is ready", lambda: _ready(r), timeout=60)
            yield c, r, ca, tokens
        finally:
            r.stop()


def stub(replica: Replica, ca: TestCA, cn: str, token: str | None = None) -> api_pb2_grpc.NameServerStub:
    cert, key = os.path.join(ca.dir, f"{cn}.crt"), os.path.join(ca.dir, f"{cn}.key")
    return api_pb2_grpc.NameServerStub(tlsconf.open_channel(replica.grpc_addr, tls=True, ca_file=ca.ca_file,
                                                            cert_file=cert, key_file=key, token=token))


def test_a_secure_replica_follows_and_passes_writes_on_as_their_caller(
        secured: tuple[Cluster, Replica, TestCA, dict[str, str]]) -> None:
    cluster, replica, ca, tokens = secured
    assert replica.status().ready  # Log.Follow is peer-only: its certificate was taken as the peer's
    broker = stub(replica, ca, "broker")
    reply = broker.RegisterBroker(register_request("CS", "rs-a", "10.8.0.1:10911", ["TopicRS"]), timeout=10)
    client = stub(replica, ca, "client")
    got = client.GetRoute(api_pb2.GetRouteRequest(topic="TopicRS", min_offset=reply.offset), timeout=10)
    assert [b.broker_name for b in got.route.broker_datas] == ["rs-a"]
    with pytest.raises(grpc.RpcError) as err:  # refused by the replica's own [auth], before it is passed on
        client.RegisterBroker(register_request("CS", "rs-b", "10.8.0.2:10911", ["TopicRS"]), timeout=10)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    admin = stub(replica, ca, "client", token=tokens["admin"])  # a token decides, here and on the voter
    written = admin.PutKv(api_pb2.PutKvRequest(namespace="rs", key="k", value="v"), timeout=10)
    read = admin.GetKv(api_pb2.GetKvRequest(namespace="rs", key="k", min_offset=written.offset), timeout=10)
    assert read.value == "v"
    with pytest.raises(grpc.RpcError) as err:
        stub(replica, ca, "client", token=tokens["client"]).PutKv(
            api_pb2.PutKvRequest(namespace="rs", key="k2", value="v"), timeout=10)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
