"""A read replica on another machine and the voters it follows (`nameserver replica`, docs/operations.md,
"Read replicas on other machines").

Two kinds of channel to each voter's gRPC address, both TLS when [tls] is set:
- the replica's own calls (Log.Follow, read indexes) carry its peer credential (certificate and peer
  token), as a node's calls to its peers do (tlsconf.peer_channel);
- a client's call passed on (a write, an admin call: what the replica does not answer itself) carries the
  client's own metadata, its bearer token included, and never the peer token: the voter authorizes the
  client. A client without a token (one the replica knew by its certificate) is named by the role the
  replica gave it (x-rip18-as-role), which the voter honours from the replica's peer certificate only:
  the replica's certificate never lends its rights to a client.
Passed-on calls go to the voter the replica follows at the time (`FollowedChannel`), so one dead voter
moves both.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import grpc
from grpc_health.v1 import health_pb2

from nameserver import headers, tlsconf
from nameserver.config import NodeConfig
from nameserver.pb import api_pb2, api_pb2_grpc
from nameserver.replica.follower import ReadReplica

log = logging.getLogger("nameserver.replica")

Metadata = Sequence[tuple[str, str | bytes]]


def channel_options(cfg: NodeConfig) -> list[tuple[str, Any]]:
    return [("grpc.max_send_message_length", cfg.max_message_bytes),
            ("grpc.max_receive_message_length", cfg.max_message_bytes),
            # a restarted voter is found again within a second, not after gRPC's backoff (up to 120 s)
            ("grpc.initial_reconnect_backoff_ms", 100), ("grpc.max_reconnect_backoff_ms", 1000)]


def client_channel(cfg: NodeConfig, addr: str) -> grpc.Channel:
    """A channel for clients' calls passed on: TLS with the replica's certificate (a voter that requires
    one), no token of the replica's."""
    if not cfg.tls_enabled:
        return grpc.insecure_channel(addr, options=channel_options(cfg))
    return tlsconf.open_channel(addr, tls=True, ca_file=cfg.tls_ca_file or None, cert_file=cfg.tls_cert_file,
                                key_file=cfg.tls_key_file, options=channel_options(cfg))


class FollowedChannel:
    """The part of a grpc.Channel CoreForwarder (nameserver/api/corelink.py) uses, sending each call to
    the voter `replica` follows now, with `acting_role()` added when the caller sent no token."""

    def __init__(self, cfg: NodeConfig, replica: ReadReplica, acting_role: Callable[[], str]) -> None:
        self.cfg = cfg
        self.replica = replica
        self.acting_role = acting_role
        self._channels: dict[str, grpc.Channel] = {}
        self._lock = threading.Lock()

    def channel(self) -> grpc.Channel:
        addr = self.replica.target
        with self._lock:
            ch = self._channels.get(addr)
            if ch is None:
                ch = self._channels[addr] = client_channel(self.cfg, addr)
            return ch

    def metadata(self, metadata: Metadata | None) -> list[tuple[str, str | bytes]]:
        md = [(k, v) for k, v in metadata or () if k not in (headers.AS_ROLE, headers.FORWARDED)]
        if self.cfg.auth_enabled and not any(k == headers.AUTHORIZATION for k, _ in md):
            md.append((headers.AS_ROLE, self.acting_role()))
        return md

    def unary_unary(self, method: str) -> _Switching:
        return _Switching(self, method, "unary_unary")

    def unary_stream(self, method: str) -> _Switching:
        return _Switching(self, method, "unary_stream")

    def stream_unary(self, method: str) -> _Switching:
        return _Switching(self, method, "stream_unary")

    def stream_stream(self, method: str) -> _Switching:
        return _Switching(self, method, "stream_stream")

    def close(self) -> None:
        with self._lock:
            for ch in self._channels.values():
                ch.close()
            self._channels.clear()


class _Switching:
    """A multi-callable bound to the followed voter at each call."""

    def __init__(self, owner: FollowedChannel, method: str, kind: str) -> None:
        self.owner, self.method, self.kind = owner, method, kind

    def _callable(self) -> Any:
        return getattr(self.owner.channel(), self.kind)(self.method)

    def __call__(self, request: Any, timeout: float | None = None, metadata: Metadata | None = None) -> Any:
        return self._callable()(request, timeout=timeout, metadata=self.owner.metadata(metadata))

    def future(self, request: Any, timeout: float | None = None, metadata: Metadata | None = None) -> Any:
        return self._callable().future(request, timeout=timeout, metadata=self.owner.metadata(metadata))


class VoterReadIndex:
    """A linearizable read index for the replica: NameServer.ReadIndex (peer only) of whichever voter
    leads, asked in turn over the peer channels (a follower answers UNAVAILABLE "not the leader")."""

    def __init__(self, cfg: NodeConfig, open_peer: Callable[[str], grpc.Channel]) -> None:
        self.voters = list(cfg.replica_follow)
        self._stubs = {addr: api_pb2_grpc.NameServerStub(open_peer(addr)) for addr in self.voters}
        self._leader = self.voters[0]

    def __call__(self, timeout: float) -> int:
        order = [self._leader] + [v for v in self.voters if v != self._leader]
        errors = []
        for addr in order:
            try:
                reply = self._stubs[addr].ReadIndex(api_pb2.ReadIndexRequest(), timeout=max(0.1, timeout / 2))
            except grpc.RpcError as exc:
                errors.append(f"{addr}: {exc.code().name}")
                continue
            self._leader = addr
            return int(reply.read_index)
        raise TimeoutError(f"no read index from the voters ({', '.join(errors)})")


class FollowerPreference:
    """Keeps a replica off the leader's Log.Follow while another voter is ready ([replica] follow_leader
    false): the leader's CPU per write bounds the cluster's writes, and a stream costs its sender an encode
    and a send per entry. Every CHECK_S it asks the followed voter's Status; if that one leads, it moves
    the replica to the first other voter that answers ready and not leading (none: it stays).

    The asking runs on a thread of its own, one round at a time: check() is called from the replica's
    readiness loop (which logs readiness and sees the stop signal), and a voter that does not answer held
    that loop up to STATUS_TIMEOUT_S per voter asked."""

    CHECK_S = 5.0
    STATUS_TIMEOUT_S = 1.0

    def __init__(self, replica: ReadReplica, open_peer: Callable[[str], grpc.Channel]) -> None:
        self.replica = replica
        self._admins = {addr: api_pb2_grpc.AdminStub(open_peer(addr)) for addr in replica.targets}
        self._due = 0.0
        self._round: threading.Thread | None = None

    def _status(self, addr: str) -> api_pb2.NodeStatus | None:
        try:
            return self._admins[addr].Status(api_pb2.StatusRequest(), timeout=self.STATUS_TIMEOUT_S)
        except grpc.RpcError:
            return None

    def check(self, now: float) -> None:
        """Start a round of asking if one is due and none still runs; returns at once."""
        if now < self._due or len(self.replica.targets) < 2 or not self.replica.ready:
            return
        if self._round is not None and self._round.is_alive():
            return
        self._due = now + self.CHECK_S
        self._round = threading.Thread(target=self._ask_round, name="follower-preference", daemon=True)
        self._round.start()

    def _ask_round(self) -> None:
        followed = self.replica.target
        st = self._status(followed)
        if st is None or st.role != api_pb2.ROLE_LEADER:
            return
        for addr in self.replica.targets:
            other = self._status(addr) if addr != followed else None
            if other is not None and other.ready and other.role == api_pb2.ROLE_FOLLOWER:
                if self.replica.move_to(addr, f"{followed} leads: following {addr}, a follower"):
                    log.info("read replica moves from %s (the leader) to %s", followed, addr)
                return


def replica_status(cfg: NodeConfig, replica: ReadReplica) -> api_pb2.NodeStatus:
    """Admin.Status of a read replica: its apply offset, digest and lag, and why it refuses reads."""
    with replica.lock:
        digest, keys = replica.state.kv.digest_hex, len(replica.state.kv)
    reason = replica.not_ready_reason()
    return api_pb2.NodeStatus(node_id=cfg.raft_addr, grpc_addr=cfg.grpc_addr, role=api_pb2.ROLE_REPLICA,
                              apply_offset=replica.offset, commit_offset=replica.core_offset, digest=digest,
                              ready=not reason, keys=keys, apply_error=replica.failed, following=replica.target,
                              lag=replica.lag, not_ready_reason=reason)


def health(replica: ReadReplica, services: Sequence[str]) -> Callable[[Any, grpc.ServicerContext], Any]:
    """grpc.health.v1 Check of a read replica: SERVING while it answers reads, NOT_SERVING while it refuses
    them (a load balancer's health check moves clients off it as the refusals do); "" or a served service."""
    def check(request: Any, context: grpc.ServicerContext) -> Any:
        if request.service and request.service not in services:
            context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING if replica.ready
                                              else health_pb2.HealthCheckResponse.NOT_SERVING)
    return check


class ReadinessLog:
    """Says in the log when the replica stops answering reads, why, and when it answers again."""

    def __init__(self, replica: ReadReplica) -> None:
        self.replica = replica
        self.refusing = ""

    def check(self) -> None:
        reason = self.replica.not_ready_reason()
        if reason and not self.refusing:
            log.warning("read replica refuses reads: %s", reason)
        elif self.refusing and not reason:
            log.info("read replica answers reads again at offset %d (following %s)", self.replica.offset,
                     self.replica.target)
        self.refusing = reason


__all__ = ["FollowedChannel", "FollowerPreference", "ReadinessLog", "health", "VoterReadIndex", "channel_options",
           "client_channel", "replica_status"]
