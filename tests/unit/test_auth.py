"""The role table, identity resolution, the interceptor on a real in-process gRPC server, and the
[security] / [tls] / [auth] configuration checks."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from nameserver import config, headers, tlsconf
from nameserver.api import auth
from nameserver.api.auth import Authorizer, Denied, allowed, hash_token
from nameserver.config import Member, NodeConfig
from nameserver.pb import api_pb2, api_pb2_grpc, shards_pb2

NS = api_pb2.DESCRIPTOR.services_by_name["NameServer"].full_name
ALL_METHODS = [f"/{s.full_name}/{m.name}" for pb in (api_pb2, shards_pb2)
               for s in pb.DESCRIPTOR.services_by_name.values() for m in s.methods]
BROKER = {"RegisterBroker", "RegisterBrokerStream", "UnregisterBroker", "Heartbeat", "GetSettings"}
CLIENT = {"GetRoute", "GetClusterInfo", "GetTopicList", "GetBrokerMemberGroup", "GetKv", "ListKv", "GetBinding",
          "ListBindings", "Watch", "GetSettings"}
CTL = api_pb2.DESCRIPTOR.services_by_name["Controller"].full_name
# Controller mode: brokers run their own registration and elections; cleaning a set is an admin's.
CTL_BROKER = {"GetNextBrokerId", "ApplyBrokerId", "RegisterBroker", "ElectMaster", "AlterSyncStateSet",
              "GetReplicaInfo", "Heartbeat", "GetLeader"}
CTL_CLIENT = {"GetReplicaInfo", "ListBrokerSets", "GetLeader"}
SHARDS = shards_pb2.DESCRIPTOR.services_by_name["Shards"].full_name
SHARDS_CLIENT = {"ListShards"}  # read as the cluster info is; AssignShard and MoveShard are an admin's
TOKENS = {"broker": "tok-broker-1", "client": "tok-client-1", "admin": "tok-admin-1", "peer": "tok-peer-1"}


def _cfg(**kw: Any) -> NodeConfig:
    base: dict[str, Any] = {"auth_tokens": {hash_token(t): r for r, t in TOKENS.items()},
                            "cert_roles": {"broker-cn": "broker", "spiffe://ns/admin": "admin"}}
    return NodeConfig(raft_addr="127.0.0.1:1", grpc_addr="127.0.0.1:2", data_dir="/nonexistent",
                      members=[Member("127.0.0.1:1", "127.0.0.1:2")], **(base | kw))


def _bearer(role: str) -> dict[str, str]:
    return {headers.AUTHORIZATION: f"Bearer {TOKENS[role]}"}


@pytest.mark.parametrize("method", ALL_METHODS)
def test_role_table_covers_every_method(method: str) -> None:
    service, _, name = method.lstrip("/").rpartition("/")
    is_ns, is_ctl, is_shards = service == NS, service == CTL, service == SHARDS
    assert allowed("broker", method) == (is_ns and name in BROKER or is_ctl and name in CTL_BROKER)
    assert allowed("client", method) == (is_ns and name in CLIENT or is_ctl and name in CTL_CLIENT
                                         or is_shards and name in SHARDS_CLIENT)
    assert allowed("admin", method) == (name not in ("ReadIndex", "Follow", "ProposeStep"))  # peer only
    assert allowed("peer", method)
    assert not allowed("nobody", method)


def test_identity_from_tokens() -> None:
    a = Authorizer(_cfg())
    assert a.check(f"/{NS}/Heartbeat", _bearer("broker"), {}).role == "broker"
    with pytest.raises(Denied) as exc:
        a.check(f"/{NS}/PutKv", _bearer("broker"), {})
    assert exc.value.code == grpc.StatusCode.PERMISSION_DENIED
    auth_key = headers.AUTHORIZATION
    for md in ({}, {auth_key: "Bearer wrong"}, {auth_key: "Basic abc"}, {auth_key: "Bearer "}):
        with pytest.raises(Denied) as exc:
            a.check(f"/{NS}/GetRoute", md, {})
        assert exc.value.code == grpc.StatusCode.UNAUTHENTICATED
        assert "tok-" not in str(exc.value)  # refusals never echo a token


def test_identity_from_certificates() -> None:
    a = Authorizer(_cfg())
    assert a.check(f"/{NS}/Heartbeat", {}, {"x509_common_name": [b"broker-cn"]}).role == "broker"
    san = {"x509_common_name": [b"whatever"], "x509_subject_alternative_name": [b"spiffe://ns/admin"]}
    assert a.check(f"/{NS}/PutKv", {}, san).role == "admin"
    with pytest.raises(Denied) as exc:  # authenticated by the CA, but granted nothing
        a.check(f"/{NS}/GetRoute", {}, {"x509_common_name": [b"stranger"]})
    assert exc.value.code == grpc.StatusCode.PERMISSION_DENIED
    # a token, when sent, decides over the certificate
    assert a.check(f"/{NS}/GetRoute", _bearer("client"), {"x509_common_name": [b"broker-cn"]}).role == "client"


def test_node_headers_are_honoured_from_peers_only() -> None:
    a = Authorizer(_cfg())
    fwd = {headers.FORWARDED: "1"}
    assert a.check(f"/{NS}/PutKv", _bearer("peer") | fwd, {}).role == "peer"
    with pytest.raises(Denied) as exc:
        a.check(f"/{NS}/PutKv", _bearer("admin") | fwd, {})
    assert exc.value.code == grpc.StatusCode.PERMISSION_DENIED
    as_client = {headers.AS_ROLE: "client"}
    a.check(f"/{NS}/GetRoute", _bearer("peer") | as_client, {})
    refused = [(f"/{NS}/PutKv", _bearer("peer") | as_client),  # acting as client: a client's rights
               (f"/{NS}/ReadIndex", _bearer("admin") | {headers.AS_ROLE: "peer"}),  # no self-promotion
               (f"/{NS}/GetRoute", _bearer("peer") | {headers.AS_ROLE: "root"})]  # unknown role
    for method, md in refused:
        with pytest.raises(Denied) as exc:
            a.check(method, md, {})
        assert exc.value.code == grpc.StatusCode.PERMISSION_DENIED
    # peer_role = "admin": the admin credential doubles as the node-to-node one
    assert Authorizer(_cfg(peer_role="admin")).check(f"/{NS}/ReadIndex", _bearer("admin") | fwd, {})


def test_health_and_reflection_stay_open() -> None:
    a = Authorizer(_cfg())
    assert a.check("/grpc.health.v1.Health/Check", {}, {}) is None
    assert a.check("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", {}, {}) is None


# ---- the interceptor on a real server: refused calls never reach the servicer --------------------------


class _Recording(api_pb2_grpc.NameServerServicer):
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.lock = threading.Lock()

    def _rec(self, name: str) -> None:
        with self.lock:
            self.calls.append(name)

    def Heartbeat(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._rec("Heartbeat")
        return api_pb2.HeartbeatReply()

    def RegisterBrokerStream(self, request_iterator: Iterator[Any], context: grpc.ServicerContext) -> Any:
        self._rec("RegisterBrokerStream")
        for _ in request_iterator:
            pass
        return api_pb2.RegisterBrokerReply(offset=7)

    def Watch(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        self._rec("Watch")
        yield api_pb2.WatchResponse(offset=1)


@pytest.fixture
def served() -> Iterator[tuple[str, _Recording]]:
    servicer = _Recording()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), interceptors=[auth.interceptor(_cfg())])
    api_pb2_grpc.add_NameServerServicer_to_server(servicer, server)
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}", servicer
    server.stop(0).wait()


def _codes(addr: str, token: str | None) -> dict[str, grpc.StatusCode]:
    out = {}
    with tlsconf.open_channel(addr, token=token) as ch:
        ns = api_pb2_grpc.NameServerStub(ch)
        chunks = [api_pb2.RegisterBrokerChunk(header=api_pb2.RegisterBrokerRequest(broker_name="b"))]
        calls = {"Heartbeat": lambda: ns.Heartbeat(api_pb2.HeartbeatRequest(), timeout=5),
                 "RegisterBrokerStream": lambda: ns.RegisterBrokerStream(iter(chunks), timeout=5),
                 "Watch": lambda: list(ns.Watch(api_pb2.WatchRequest(), timeout=5))}
        for name, call in calls.items():
            try:
                call()
                out[name] = grpc.StatusCode.OK
            except grpc.RpcError as exc:
                out[name] = exc.code()
    return out


def test_interceptor_wraps_unary_and_streaming_methods(served: tuple[str, _Recording]) -> None:
    addr, servicer = served
    assert _codes(addr, None) == dict.fromkeys(("Heartbeat", "RegisterBrokerStream", "Watch"),
                                               grpc.StatusCode.UNAUTHENTICATED)
    assert _codes(addr, "not-a-token") == dict.fromkeys(("Heartbeat", "RegisterBrokerStream", "Watch"),
                                                        grpc.StatusCode.UNAUTHENTICATED)
    assert servicer.calls == []  # nothing refused ever ran
    assert _codes(addr, TOKENS["broker"]) == {"Heartbeat": grpc.StatusCode.OK,
                                              "RegisterBrokerStream": grpc.StatusCode.OK,
                                              "Watch": grpc.StatusCode.PERMISSION_DENIED}
    assert _codes(addr, TOKENS["client"]) == {"Heartbeat": grpc.StatusCode.PERMISSION_DENIED,
                                              "RegisterBrokerStream": grpc.StatusCode.PERMISSION_DENIED,
                                              "Watch": grpc.StatusCode.OK}
    assert sorted(servicer.calls) == ["Heartbeat", "RegisterBrokerStream", "Watch"]
    with grpc.insecure_channel(addr) as ch:  # health needs no credential
        health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)


def test_no_interceptor_and_plaintext_without_security() -> None:
    cfg = _cfg(auth_tokens={}, cert_roles={})
    assert auth.interceptor(cfg) is None
    assert tlsconf.server_credentials(cfg) is None


def test_hash_cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO("tok-admin-1\n"))
    assert auth.main(["hash"]) == 0
    assert capsys.readouterr().out.strip() == hash_token("tok-admin-1")


# ---- configuration ----------------------------------------------------------------------------------------

BASE = """
[node]
raft_addr = "127.0.0.1:9201"
grpc_addr = "127.0.0.1:9101"
data_dir = "data/n1"
"""


def _load(tmp_path: Any, text: str) -> NodeConfig:
    p = tmp_path / "n1.toml"
    p.write_text(BASE + text)
    return config.load(str(p))


def _pki_files(tmp_path: Any) -> str:
    for name in ("node.crt", "node.key", "ca.crt"):
        (tmp_path / name).write_text("x")
    (tmp_path / "raft.pw").write_text("raft-secret-pw\n")
    (tmp_path / "peer.tok").write_text("tok-peer-1\n")
    (tmp_path / "tokens.toml").write_text("[tokens]\n" + "".join(
        f'"{hash_token(t)}" = "{r}"\n' for r, t in TOKENS.items()))
    return ('[tls]\ncert_file = "node.crt"\nkey_file = "node.key"\nca_file = "ca.crt"\n'
            '[auth]\ntokens_file = "tokens.toml"\npeer_token_file = "peer.tok"\n')


def test_secure_mode_needs_password_tls_and_auth(tmp_path: Any) -> None:
    tls_auth = _pki_files(tmp_path)
    with pytest.raises(config.ConfigError, match=r"raft\.password_file or raft\.password_env"):
        _load(tmp_path, '[security]\nmode = "secure"\n' + tls_auth)
    with pytest.raises(config.ConfigError, match=r"tls\.cert_file"):
        _load(tmp_path, '[security]\nmode = "secure"\n[raft]\npassword_file = "raft.pw"\n'
                        '[auth]\ntokens_file = "tokens.toml"\n')
    with pytest.raises(config.ConfigError, match=r"auth\.tokens_file or auth\.cert_roles"):
        _load(tmp_path, '[security]\nmode = "secure"\n[raft]\npassword_file = "raft.pw"\n'
                        '[tls]\ncert_file = "node.crt"\nkey_file = "node.key"\n')
    cfg = _load(tmp_path, '[security]\nmode = "secure"\n[raft]\npassword_file = "raft.pw"\n' + tls_auth)
    assert cfg.tls_enabled and cfg.auth_enabled and cfg.tls_cert_file == str(tmp_path / "node.crt")
    assert cfg.auth_tokens[hash_token("tok-peer-1")] == "peer" and cfg.peer_token == "tok-peer-1"
    text = repr(cfg)  # secrets never reach a log through the config's repr
    assert "raft-secret-pw" not in text and "tok-peer-1" not in text and hash_token("tok-peer-1") not in text


def test_bad_security_settings_are_named(tmp_path: Any) -> None:
    _pki_files(tmp_path)
    cases = {
        '[security]\nmode = "prod"\n': "security.mode",
        '[tls]\ncert_file = "node.crt"\nkey_file = "node.key"\nca_file = "ca.crt"\nclient_auth = "optional"\n':
            "tls.client_auth",
        '[tls]\ncert_file = "node.crt"\n': "tls.key_file",
        '[tls]\ncert_file = "node.crt"\nkey_file = "node.key"\nclient_auth = "require"\n': "tls.ca_file",
        '[auth]\ncert_roles = {admin = "admin"}\n': "tls.client_auth",
        '[auth]\ntokens_file = "tokens.toml"\npeer_role = "root"\n': "auth.peer_role",
        '[auth]\npeer_token_env = "RIP18_UNSET_TOKEN_VAR"\n': "RIP18_UNSET_TOKEN_VAR",
    }
    for text, needle in cases.items():
        with pytest.raises(config.ConfigError) as exc:
            _load(tmp_path, text)
        assert needle in str(exc.value), (text, exc.value)


def test_tokens_file_holds_hashes_only(tmp_path: Any) -> None:
    (tmp_path / "tokens.toml").write_text('[tokens]\n"my-plaintext-token" = "admin"\n')
    with pytest.raises(config.ConfigError) as exc:
        _load(tmp_path, '[auth]\ntokens_file = "tokens.toml"\n')
    assert "SHA-256" in str(exc.value) and "my-plaintext-token" not in str(exc.value)
    (tmp_path / "tokens.toml").write_text(f'[tokens]\n"{hash_token("t")}" = "superuser"\n')
    with pytest.raises(config.ConfigError, match="unknown role"):
        _load(tmp_path, '[auth]\ntokens_file = "tokens.toml"\n')


def test_dev_mode_is_the_default_and_open(tmp_path: Any) -> None:
    cfg = _load(tmp_path, "")
    assert cfg.security_mode == "dev" and not cfg.tls_enabled and not cfg.auth_enabled
