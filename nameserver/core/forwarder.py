"""The one way a node reaches its leader.

Whatever a follower cannot do itself goes to the leader through `LeaderForwarder.call`: writes,
membership and leadership changes, read indexes, the brokers' buffered heartbeats, the controller's
leader address. It finds the leader's gRPC address (waiting a bounded time for an election), keeps one
channel per peer (TLS and this node's peer credential when security is on), and marks every call
forwarded, so that a node which is no longer the leader refuses it instead of forwarding it again.
Every call also carries its deadline by this node's wall clock (FORWARD_DEADLINE, unix ms): gRPC sends
only the time left, which the leader counts from the call's arrival, so a call held in a TCP queue (a
partition, then the heal) would arrive with fresh time; the leader proposes no write whose forwarder's
deadline passed (nameserver/api/rpc.py, in_time). Nothing else in a node opens channels to its peers.

A call goes out only on a connected channel: while the channel to the leader is not connected (the leader's
port not open yet: its workers start after it is ready, or it restarted; gRPC then fails a call at once with
the last "connection refused" until its next reconnect, up to a second later), the call waits for it within
its own deadline, and goes to the next leader instead if one is heard of meanwhile. Nothing was sent, so
this holds for writes too. The wait ends at the call's deadline, the call then failing as gRPC says (the
leader's address refusing, etc.), as etcd holds a proposal until its request timeout rather than refusing it.

`ask` is the other way out, over the same channels: a call to one given peer (not necessarily the leader),
not marked forwarded, so the node there answers it as it would a client (the leader-balancing duty asks its
preferred leader's node for its Admin.Status this way: nameserver/groups/leaderbalance.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import grpc

from nameserver import headers, tlsconf
from nameserver.config import NodeConfig
from nameserver.pb import api_pb2_grpc
from raftlog.proposer import NotLeader

Metadata = Iterable[tuple[str, str | bytes]]
# How often a caller waiting for an election looks again when no change is heard: the node calls
# leader_changed() on each change of leader (raftlog's leader events), which wakes waiting callers at once
# (a write held through a failover otherwise saw its new leader up to POLL_S late).
POLL_S = 0.05
T = TypeVar("T")
UNWATCHED_S = 0.5  # a closed forwarder's channels are closed this long after their state is no longer watched


class NoLeader(Exception):
    """Nothing was sent: no other node was known to lead within the wait, or this node leads now, or the
    request was already forwarded once (the API answers UNAVAILABLE with the message)."""


class LeaderForwarder:
    def __init__(self, cfg: NodeConfig, leader: Callable[[], str | None], is_leader: Callable[[], bool],
                 grpc_of: Callable[[str | None], str | None]) -> None:
        self.cfg = cfg
        self._leader = leader
        self._is_leader = is_leader
        self._grpc_of = grpc_of
        self._channels: dict[str, grpc.Channel] = {}
        # a stub builds a callable per method (about 65 us for NameServer's): one per service and peer
        self._stubs: dict[tuple[Callable[[grpc.Channel], Any], str], Any] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._changes = threading.Condition()
        self._changed = 0  # leader changes heard (leader_changed): a waiter sleeps only if none since it looked
        self._states: dict[str, grpc.ChannelConnectivity] = {}  # each peer channel's, as gRPC last said
        self._watches: list[tuple[grpc.Channel, Callable[[grpc.ChannelConnectivity], None]]] = []

    def leader_changed(self) -> None:
        """Wake the callers waiting for a leader (the node calls it on each change of leader or term)."""
        with self._changes:
            self._changed += 1
            self._changes.notify_all()

    def _pause(self, seen: int, seconds: float) -> None:
        """Sleep up to `seconds`, less if the leader changes (or changed since `seen` was read) or on close."""
        with self._changes:
            self._changes.wait_for(lambda: self._changed != seen or self._closed.is_set(), seconds)

    def target(self, wait_s: float = 0.0) -> str | None:
        """The leader's gRPC address, waiting up to `wait_s` for one to be elected.

        None when none appeared in time, and as soon as this node itself leads (the caller then
        serves the request here, with the time left)."""
        deadline = time.monotonic() + wait_s
        while True:
            seen = self._changed
            leader = self._leader()
            if leader and leader != self.cfg.raft_addr:
                addr = self._grpc_of(leader)
                if addr:
                    return addr
            if time.monotonic() >= deadline or self._closed.is_set() or self._is_leader():
                return None
            self._pause(seen, min(POLL_S, max(0.0, deadline - time.monotonic())))

    def call(self, method: str, request: Any, timeout: float, *, wait_s: float = 0.0,
             service: Callable[[grpc.Channel], Any] = api_pb2_grpc.NameServerStub,
             metadata: Metadata = (), idempotent: bool = False) -> Any:
        """`method` of the leader's `service` with `request` (a message, or an iterator of them for a
        client stream), marked forwarded; `timeout` covers the wait for an election (at most `wait_s`)
        and the call. Raises NoLeader when nothing was sent, else the call's own grpc.RpcError.

        The leader sees the caller's true deadline (FORWARD_DEADLINE) even where gRPC's own is raised
        to its 0.1 s floor.

        Nothing is sent before the channel to the leader is connected (`_connected`): a call waits for
        it, or for the next leader, until `timeout` runs out, and only then goes out to fail as gRPC says.
        An `idempotent` call that finds its leader unreachable once sent (UNAVAILABLE: a leader that just
        died, which this node still believes in until its election timeout) is sent again, to whichever
        node leads next, until `timeout` runs out."""
        deadline = time.monotonic() + timeout
        wait_until = time.monotonic() + min(wait_s, timeout)
        while True:
            seen = self._changed
            addr = self.target(max(0.0, wait_until - time.monotonic()))
            if addr is None:
                raise NoLeader("this node leads now" if self._is_leader()
                               else "no leader elected (is a majority of nodes up?)")
            stub = self._stub(service, addr)
            if (not self._connected(addr, seen, deadline) and not self._closed.is_set()
                    and time.monotonic() < deadline and (self._changed != seen or self._leader_addr() != addr)):
                wait_until = deadline  # nothing was sent: to whichever node leads now, within the time left
                continue
            left = deadline - time.monotonic()
            marks = [(headers.FORWARDED, "1"), (headers.FORWARD_DEADLINE, str(int((time.time() + left) * 1000)))]
            if self.cfg.group:  # a group core's call: the workers there pass it to their core of this group
                marks.append((headers.GROUP, str(self.cfg.group)))
            try:
                return getattr(stub, method)(request, timeout=max(0.1, left), metadata=[*marks, *metadata])
            except grpc.RpcError as exc:
                retry = (idempotent and exc.code() == grpc.StatusCode.UNAVAILABLE
                         and time.monotonic() + POLL_S < deadline and not self._closed.is_set())
                if not retry:
                    raise
            self._pause(seen, POLL_S)  # a leader that just died: until the next one is heard of
            wait_until = deadline

    def ask(self, addr: str, method: str, request: Any, timeout: float, *,
            service: Callable[[grpc.Channel], Any] = api_pb2_grpc.AdminStub) -> Any:
        """`method` of the peer at gRPC address `addr` with `request`, over this forwarder's channel to it; not
        marked forwarded (nor with this core's group), so that node's workers answer it themselves (Admin.Status:
        the whole node's). No wait for a connection: a port not open yet fails the call at once (UNAVAILABLE).
        Raises the call's grpc.RpcError."""
        if self._closed.is_set():
            raise NoLeader("the forwarder is closed")
        return getattr(self._stub(service, addr), method)(request, timeout=timeout)

    def _connected(self, addr: str, seen: int, deadline: float) -> bool:
        """Whether the channel to `addr` is connected, waiting while it is not (its first connection, or a
        reconnect after a refusal) until it is, the leader moves (a change heard since `seen`, or another
        leader found at the next poll), the forwarder closes, or `deadline`. An idle channel is asked to
        connect."""
        if self._state(addr) == grpc.ChannelConnectivity.READY:
            return True
        connecting = grpc.channel_ready_future(self.channel(addr))  # asks an idle channel to connect
        try:
            while True:
                left = deadline - time.monotonic()
                with self._changes:
                    if self._changes.wait_for(
                            lambda: (self._states.get(addr) == grpc.ChannelConnectivity.READY
                                     or self._changed != seen or self._closed.is_set()), max(0.0, min(POLL_S, left))):
                        return self._states.get(addr) == grpc.ChannelConnectivity.READY
                if left <= POLL_S or self._leader_addr() != addr:
                    return False
        finally:
            connecting.cancel()

    def _state(self, addr: str) -> grpc.ChannelConnectivity | None:
        with self._changes:
            return self._states.get(addr)

    def _leader_addr(self) -> str | None:
        leader = self._leader()
        return self._grpc_of(leader) if leader and leader != self.cfg.raft_addr else None

    def _watch(self, addr: str) -> Callable[[grpc.ChannelConnectivity], None]:
        def changed(state: grpc.ChannelConnectivity) -> None:
            with self._changes:
                self._states[addr] = state
                self._changes.notify_all()
        return changed

    def serve_or_forward(self, here: Callable[[float], T], method: str, request: Any, timeout: float, *,
                         forwarded: bool, wait_s: float = 0.0,
                         service: Callable[[grpc.Channel], Any] = api_pb2_grpc.NameServerStub,
                         metadata: Metadata = (), forward_if_lead_lost: bool = False) -> T | Any:
        """Serve a leader-only request here (`here(time_left)`) when this node leads, else pass `request` on
        to `method` of the leader's `service` (`call`). A request that was already forwarded is refused
        (NoLeader), never passed on again: the caller picks another node or retries. If this node wins
        the election while waiting for a leader, it serves the request itself. With
        `forward_if_lead_lost`, a NotLeader raised by `here` (nothing was appended: safe to send again)
        forwards the request too. Raises NoLeader when no leader appeared in time."""
        deadline = time.monotonic() + timeout
        if self._is_leader():
            try:
                return here(timeout)
            except NotLeader:
                if not forward_if_lead_lost:
                    raise
        if forwarded:
            raise NoLeader("not the leader (forwarded request)")
        try:
            return self.call(method, request, max(0.0, deadline - time.monotonic()), wait_s=wait_s,
                             service=service, metadata=metadata)
        except NoLeader:
            if self._is_leader():  # elected meanwhile
                return here(max(0.1, deadline - time.monotonic()))
            raise

    def _stub(self, service: Callable[[grpc.Channel], Any], addr: str) -> Any:
        stub = self._stubs.get((service, addr))
        if stub is None:
            stub = self._stubs[(service, addr)] = service(self.channel(addr))
        return stub

    def channel(self, addr: str) -> grpc.Channel:
        with self._lock:
            if addr not in self._channels:
                opts = [("grpc.max_send_message_length", self.cfg.max_message_bytes),
                        ("grpc.max_receive_message_length", self.cfg.max_message_bytes),
                        # a restarted peer must be reachable again within a second, not after
                        # gRPC's default exponential backoff (up to 120 s)
                        ("grpc.initial_reconnect_backoff_ms", 100),
                        ("grpc.max_reconnect_backoff_ms", 1000)]
                channel = self._channels[addr] = tlsconf.peer_channel(self.cfg, addr, opts)
                watch = self._watch(addr)
                channel.subscribe(watch, try_to_connect=True)
                self._watches.append((channel, watch))
            return self._channels[addr]

    def close(self) -> None:
        self._closed.set()
        self.leader_changed()  # wakes the waiting callers, which see the close
        with self._lock:
            for channel, watch in self._watches:
                channel.unsubscribe(watch)
            self._watches.clear()
            channels = list(self._channels.values())
            self._channels.clear()
            self._stubs.clear()
        # gRPC's thread polling a channel's state ends within its 0.2 s poll once unsubscribed; a channel
        # closed under it would end it with a traceback (ValueError: Channel closed)
        closer = threading.Timer(UNWATCHED_S, lambda: [channel.close() for channel in channels])
        closer.daemon = True
        closer.start()


__all__ = ["LeaderForwarder", "NoLeader"]
