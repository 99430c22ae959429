"""Endpoints of a cluster: one channel each, a leader hint for writes, a rotation for reads."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

import grpc

from nameserver.client.credentials import PLAINTEXT, Credentials
from nameserver.pb import api_pb2, api_pb2_grpc

MAX_MESSAGE_BYTES = 64 << 20
CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
)


def parse_endpoints(endpoints: str | Sequence[str]) -> list[str]:
    """'h1:p1,h2:p2' or a list of 'host:port' -> a de-duplicated list (order kept)."""
    parts = endpoints.split(",") if isinstance(endpoints, str) else list(endpoints)
    out = list(dict.fromkeys(p.strip() for p in parts if p and p.strip()))
    if not out:
        raise ValueError("no endpoints given")
    for addr in out:
        host, sep, port = addr.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"endpoint {addr!r} is not host:port")
    return out


class EndpointPool:
    """Thread-safe: channels (lazy), the current leader hint, and endpoints recently seen failing.

    Reads rotate over endpoints that are not cooling down; writes go to the leader when known (any
    node would forward them, but going straight to the leader saves a hop).
    """

    def __init__(self, endpoints: str | Sequence[str], cooldown_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic, credentials: Credentials = PLAINTEXT) -> None:
        self.endpoints = parse_endpoints(endpoints)
        self.credentials = credentials
        self.cooldown_s = cooldown_s
        self._clock = clock
        self._lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}
        self._down_until: dict[str, float] = {}
        self._next = 0
        self._leader: str | None = None

    # ---- channels and stubs ----

    def channel(self, addr: str) -> grpc.Channel:
        with self._lock:
            ch = self._channels.get(addr)
            if ch is None:
                ch = self.credentials.connect(addr, CHANNEL_OPTIONS)
                self._channels[addr] = ch
            return ch

    def ns(self, addr: str) -> api_pb2_grpc.NameServerStub:
        return api_pb2_grpc.NameServerStub(self.channel(addr))

    def admin(self, addr: str) -> api_pb2_grpc.AdminStub:
        return api_pb2_grpc.AdminStub(self.channel(addr))

    def close(self) -> None:
        with self._lock:
            channels, self._channels = list(self._channels.values()), {}
        for ch in channels:
            ch.close()

    # ---- choosing ----

    @property
    def leader(self) -> str | None:
        return self._leader

    def set_leader(self, addr: str | None) -> None:
        with self._lock:
            self._leader = addr or None
            if addr and addr not in self.endpoints:
                self.endpoints.append(addr)  # learned from a Status reply

    def next_endpoint(self, avoid: str | None = None) -> str:
        """Round-robin over endpoints not cooling down (all of them when every one is)."""
        with self._lock:
            now = self._clock()
            n = len(self.endpoints)
            candidates = [self.endpoints[(self._next + i) % n] for i in range(n)]
            self._next = (self._next + 1) % n
        healthy = [a for a in candidates if self._down_until.get(a, 0.0) <= now]
        for pool in (healthy, candidates):
            for addr in pool:
                if addr != avoid or n == 1:
                    return addr
        return candidates[0]

    def write_target(self, avoid: str | None = None) -> str:
        leader = self._leader
        if leader is not None and leader != avoid and self._down_until.get(leader, 0.0) <= self._clock():
            return leader
        return self.next_endpoint(avoid)

    def mark_failed(self, addr: str) -> None:
        with self._lock:
            self._down_until[addr] = self._clock() + self.cooldown_s
            if self._leader == addr:
                self._leader = None

    def mark_ok(self, addr: str) -> None:
        if addr in self._down_until:
            with self._lock:
                self._down_until.pop(addr, None)

    def discover_leader(self, timeout_s: float = 1.0) -> str | None:
        """Ask nodes (in rotation) for Admin.Status until one names a leader; remember and return it."""
        for _ in range(len(self.endpoints)):
            addr = self.next_endpoint()
            try:
                st = self.admin(addr).Status(api_pb2.StatusRequest(), timeout=timeout_s)
            except grpc.RpcError:
                self.mark_failed(addr)
                continue
            if st.role == api_pb2.ROLE_LEADER:
                self.set_leader(addr)  # the address we reached it at
                return self._leader
            if st.leader_grpc_addr and self._down_until.get(st.leader_grpc_addr, 0.0) <= self._clock():
                # (a leader that just failed for us is likely a stale view of this follower: ask on)
                self.set_leader(st.leader_grpc_addr)
                return self._leader
        return None
