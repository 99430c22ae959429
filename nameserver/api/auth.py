"""Who may call what: roles from client certificates or bearer tokens, checked by a server interceptor.

    broker  RegisterBroker, RegisterBrokerStream, UnregisterBroker, Heartbeat, GetSettings
    client  GetRoute, GetClusterInfo, GetTopicList, GetBrokerMemberGroup, GetKv, ListKv, GetBinding,
            ListBindings, Watch, GetSettings, Shards.ListShards
    admin   everything except ReadIndex (node-to-node only)
    peer    everything: other nodes (forwarded writes, heartbeats, read indexes) and this node's
            remoting listener

Health checking and reflection stay open. A call without a credential fails UNAUTHENTICATED (so does a
bad token); an authenticated caller without the right fails PERMISSION_DENIED. Either way the method
never runs, so nothing changes; when the headers alone decide, the call is refused before its request
message is read (`Authorizer.refusal`, used by nameserver/api/callguard.py). A follower authorizes the
original caller, then forwards with its peer credential and the x-rip18-forwarded header; that header
is honoured only from the peer role.

Exactly-once sessions belong to the authenticated caller: `session_owner()` names the caller of the
call being served (a token's hash or a certificate's name, hashed), and a client id is only ever looked
up within its owner's sessions, so one caller cannot read or poison another's (x-client-id reuse).
A follower forwards the owner in x-rip18-session-owner; the leader honours it only on a forwarded call
from the peer role.

`python -m nameserver.api.auth hash < token` prints the SHA-256 digest to put in the tokens file.
"""

from __future__ import annotations

import contextvars
import hashlib
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, cast

import grpc

from nameserver import headers
from nameserver.api.grpcwrap import STREAMING_RESPONSE, wrap_handler
from nameserver.config import ROLES, NodeConfig
from nameserver.pb import api_pb2, shards_pb2

NAMESERVER_SERVICE = api_pb2.DESCRIPTOR.services_by_name["NameServer"].full_name
# GetSettings is every role's: the replicated settings are public (docs/operations.md), and a remoting
# listener acting as "broker" answers GET_NAMESRV_CONFIG with them.
BROKER_METHODS = frozenset(f"/{NAMESERVER_SERVICE}/{m}" for m in (
    "RegisterBroker", "RegisterBrokerStream", "UnregisterBroker", "Heartbeat", "GetSettings"))
CLIENT_METHODS = frozenset(f"/{NAMESERVER_SERVICE}/{m}" for m in (
    "GetRoute", "GetClusterInfo", "GetTopicList", "GetBrokerMemberGroup", "GetKv", "ListKv", "GetBinding",
    "ListBindings", "Watch", "GetSettings"))
CONTROLLER_SERVICE = api_pb2.DESCRIPTOR.services_by_name["Controller"].full_name
# A broker in controller mode registers, takes an id, asks for elections and reports its in-sync replicas;
# cleaning a set's data is an admin's (as mqadmin cleanBrokerMetadata).
BROKER_METHODS |= frozenset(f"/{CONTROLLER_SERVICE}/{m}" for m in (
    "GetNextBrokerId", "ApplyBrokerId", "RegisterBroker", "ElectMaster", "AlterSyncStateSet", "GetReplicaInfo",
    "Heartbeat", "GetLeader"))
CLIENT_METHODS |= frozenset(f"/{CONTROLLER_SERVICE}/{m}" for m in ("GetReplicaInfo", "ListBrokerSets", "GetLeader"))
SHARDS_SERVICE = shards_pb2.DESCRIPTOR.services_by_name["Shards"].full_name
# Which group holds each broker set is read as the cluster info is; pinning or moving a set is an admin's.
CLIENT_METHODS |= frozenset({f"/{SHARDS_SERVICE}/ListShards"})
LOG_SERVICE = api_pb2.DESCRIPTOR.services_by_name["Log"].full_name
# Follow feeds a read replica every entry as applied, sessions and all: a node's (or its workers').
# ProposeStep writes a translation as it is (a move's step, made by the node's move duty): never a client's.
ADMIN_SERVICE = api_pb2.DESCRIPTOR.services_by_name["Admin"].full_name
PEER_ONLY = frozenset({f"/{NAMESERVER_SERVICE}/ReadIndex", f"/{LOG_SERVICE}/Follow", f"/{ADMIN_SERVICE}/ProposeStep"})
# Set in the auth context of a worker's own call on the core's private socket (nameserver/api/corelink.py),
# never by gRPC: that caller is the node itself, with the peer role.
NODE_ITSELF = "rip18_node_itself"
OPEN_SERVICES = ("grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection",
                 "grpc.reflection.v1.ServerReflection")


def allowed(role: str, method: str) -> bool:
    """The role table. `method` is the full gRPC name, /package.Service/Method."""
    if role == "peer":
        return True
    if role == "admin":
        return method not in PEER_ONLY
    if role == "broker":
        return method in BROKER_METHODS
    if role == "client":
        return method in CLIENT_METHODS
    return False


def is_open(method: str) -> bool:
    return method.lstrip("/").rpartition("/")[0] in OPEN_SERVICES


def hash_token(token: str) -> str:
    return hashlib.sha256(token.strip().encode()).hexdigest()


class Denied(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Caller:
    role: str
    via: str  # "token" or "cert:<identity>", for messages (never the token itself)
    identity: str = ""  # who it is, stably: "token:<sha256>" or "cert:<name>" (owns its sessions)
    is_peer: bool = False


# The caller of the call this thread is serving (set by the interceptor around the handler).
_current: contextvars.ContextVar[Caller | None] = contextvars.ContextVar("rip18_caller", default=None)


def current_caller() -> Caller | None:
    """The authenticated caller of the call being served; None when [auth] is off."""
    return _current.get()


def session_owner(metadata: dict[str, str], forwarded: bool) -> str:
    """Whose exactly-once sessions this call may use: a short stable name of the caller's identity
    ("" when [auth] is off and nobody forwarded one). A forwarded call from a peer carries the original
    caller's owner; from anyone else the header is ignored."""
    caller = _current.get()
    if forwarded and (caller is None or caller.is_peer):
        return metadata.get(headers.SESSION_OWNER, "")
    if caller is None:
        return ""
    return hashlib.sha256(caller.identity.encode()).hexdigest()[:16]


class Authorizer:
    def __init__(self, cfg: NodeConfig) -> None:
        self.tokens = dict(cfg.auth_tokens)
        self.cert_roles = dict(cfg.cert_roles)
        self.peer_role = cfg.peer_role

    def caller(self, metadata: dict[str, str], auth_context: Mapping[str, Iterable[bytes]]) -> Caller:
        """A bearer token, when sent, decides; else the client certificate's CN, then its SANs."""
        header = metadata.get(headers.AUTHORIZATION)
        if header is not None:
            scheme, _, token = header.partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise Denied(grpc.StatusCode.UNAUTHENTICATED, "authorization must be 'Bearer <token>'")
            digest = hash_token(token)
            role = self.tokens.get(digest)
            if role is None:
                raise Denied(grpc.StatusCode.UNAUTHENTICATED, "unknown token")
            return Caller(role, "token", f"token:{digest}", self._is_peer(role))
        if auth_context.get(NODE_ITSELF):
            return Caller("peer", "worker", "node", True)
        names = [v.decode(errors="replace") for key in ("x509_common_name", "x509_subject_alternative_name")
                 for v in auth_context.get(key, [])]
        if not names:
            raise Denied(grpc.StatusCode.UNAUTHENTICATED,
                         "no credentials: send a client certificate or 'authorization: Bearer <token>'")
        for name in names:
            if name in self.cert_roles:
                role = self.cert_roles[name]
                return Caller(role, f"cert:{name}", f"cert:{name}", self._is_peer(role))
        # A certificate the CA signed is authenticated, but no role was granted to it.
        raise Denied(grpc.StatusCode.PERMISSION_DENIED, f"certificate {names[0]!r} has no role")

    def _is_peer(self, role: str) -> bool:
        return role == "peer" or role == self.peer_role

    def check(self, method: str, metadata: dict[str, str], auth_context: Mapping[str, Iterable[bytes]]
              ) -> Caller | None:
        """Raise Denied unless the call may run; the caller (None for open services)."""
        if is_open(method):
            return None
        caller = self.caller(metadata, auth_context)
        role, is_peer = caller.role, caller.is_peer
        if headers.FORWARDED in metadata and not is_peer:
            raise Denied(grpc.StatusCode.PERMISSION_DENIED, "only peer nodes may send forwarded calls")
        acting = metadata.get(headers.AS_ROLE)
        if acting is not None:  # a peer speaking for a less trusted caller (the remoting listener)
            if not is_peer or acting not in ROLES:
                raise Denied(grpc.StatusCode.PERMISSION_DENIED, f"cannot act as role {acting!r}")
            role, is_peer = acting, acting == "peer"
        if not (is_peer or allowed(role, method)):
            raise Denied(grpc.StatusCode.PERMISSION_DENIED, f"role {role} ({caller.via}) may not call {method}")
        return caller


    def refusal(self, method: str, metadata: dict[str, str]) -> tuple[grpc.StatusCode, str] | None:
        """The status a call gets whatever its request says, when its metadata alone decides (a token
        was sent, or certificates grant no role): such a call is refused before its request arrives
        (nameserver/api/callguard.py), so a caller without a credential never holds a worker."""
        if is_open(method) or (headers.AUTHORIZATION not in metadata and self.cert_roles):
            return None
        try:
            self.check(method, metadata, {})
        except Denied as exc:
            return exc.code, str(exc)
        return None


class AuthInterceptor(grpc.ServerInterceptor):
    """Checks every call before its handler runs. Placed after the metrics interceptor so that refused
    calls are still counted (by their status code)."""

    def __init__(self, authorizer: Authorizer) -> None:
        self.authorizer = authorizer

    def intercept_service(self, continuation: Callable, handler_call_details: grpc.HandlerCallDetails
                          ) -> grpc.RpcMethodHandler | None:
        handler = continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or is_open(method):
            return handler
        metadata = {k: v for k, v in handler_call_details.invocation_metadata or () if isinstance(v, str)}
        return wrap_handler(handler, lambda behavior, kind: (
            self._stream if kind in STREAMING_RESPONSE else self._unary)(behavior, method, metadata))

    def _check(self, method: str, metadata: dict[str, str], context: grpc.ServicerContext) -> Caller | None:
        try:
            # grpc's stubs say Mapping[str, bytes]; the real auth context maps names to lists of values
            auth_context = cast(Mapping[str, Iterable[bytes]], context.auth_context())
            return self.authorizer.check(method, metadata, auth_context)
        except Denied as exc:
            context.abort(exc.code, str(exc))
            raise  # abort raises; this line is for the type checker

    def _unary(self, behavior: Callable, method: str, metadata: dict[str, str]) -> Callable:
        def wrapped(request: Any, context: grpc.ServicerContext) -> Any:
            token = _current.set(self._check(method, metadata, context))  # before a client stream is read
            try:
                return behavior(request, context)
            finally:
                _current.reset(token)

        return wrapped

    def _stream(self, behavior: Callable, method: str, metadata: dict[str, str]) -> Callable:
        # Server-streaming calls are reads (Watch, log export): no session, so no caller to publish
        # (a context variable cannot safely span a generator's suspensions).
        def wrapped(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            self._check(method, metadata, context)
            yield from behavior(request, context)

        return wrapped


def interceptor(cfg: NodeConfig) -> AuthInterceptor | None:
    """None when [auth] is not configured (dev mode: every call is allowed)."""
    return AuthInterceptor(Authorizer(cfg)) if cfg.auth_enabled else None


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args != ["hash"]:
        print("usage: python -m nameserver.api.auth hash < token-file", file=sys.stderr)
        return 2
    token = sys.stdin.read().strip()
    if not token:
        print("nameserver.api.auth: empty token on stdin", file=sys.stderr)
        return 2
    print(hash_token(token))
    return 0


if __name__ == "__main__":
    sys.exit(main())
