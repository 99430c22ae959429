"""Broker liveness: soft state at the leader, never in the log.

The leader keeps the last-heard time per broker address (registrations and heartbeats refresh
it; followers forward heartbeats in batches). A scan every `scan_interval` appends removal
records for addresses silent past their timeout, each guarded by the version of the address's
registration the scan saw, so a stale expiry can never wipe a fresh re-registration. A node that
becomes leader grants every broker a fresh timeout: a failover never mass-expels brokers.

Remoting connections, as RocketMQ uses them: every node's remoting listener reports which brokers
hold a connection to it (ChannelTable, at the leader). When the last known connection from a broker
closes, the broker is expired after a short grace instead of at its timeout (RocketMQ unregisters on
channel close). A node that crashes never reports its connections closed: those brokers fall back
to their timeout, as does every broker after a failover until its next heartbeat re-reports them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from nameserver.pb import api_pb2


class LivenessTable:
    """last-heard times by broker address; the clock is injectable so the logic tests without sleeping."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._doomed: dict[str, float] = {}  # addr -> when it expires unless heard from first
        self._grace_from = clock()

    def touch(self, addr: str) -> None:
        now = self._clock()
        with self._lock:
            self._last[addr] = now
            self._doomed.pop(addr, None)

    def forget(self, addr: str) -> None:
        with self._lock:
            self._last.pop(addr, None)

    def disconnect(self, addr: str, grace_s: float) -> None:
        """Its last known connection closed: expired once `grace_s` has passed, unless it is heard from
        first (another node's report of a live connection may still be on its way)."""
        with self._lock:
            self._doomed[addr] = self._clock() + grace_s

    def grant_grace(self) -> None:
        """Start every broker's clock afresh (on becoming leader)."""
        with self._lock:
            self._last.clear()
            self._grace_from = self._clock()

    def expired(self, registered: list[tuple[str, int, int]]) -> list[tuple[str, int]]:
        """Of (addr, timeout_ms, version) registrations, those silent past their timeout.

        An address never heard since the grace point counts from the grace point.
        """
        now = self._clock()
        out = []
        with self._lock:
            for addr, timeout_ms, version in registered:
                last = self._last.get(addr, self._grace_from)
                doom = self._doomed.get(addr)
                if now - last > timeout_ms / 1000.0 or (doom is not None and now >= doom):
                    out.append((addr, version))
            for addr in [a for a in self._doomed if a not in {r[0] for r in registered}]:
                del self._doomed[addr]
            live = {addr for addr, _, _ in registered}
            for addr in [a for a in self._last if a not in live]:
                del self._last[addr]  # unregistered elsewhere: do not grow forever
        return out

    def __len__(self) -> int:
        with self._lock:
            return len(self._last)


class ChannelTable:
    """Leader: which nodes hold a remoting connection from each broker address."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._nodes: dict[str, set[str]] = {}

    def opened(self, addr: str, node: str) -> None:
        with self._lock:
            self._nodes.setdefault(addr, set()).add(node)

    def closed(self, addr: str, node: str) -> bool:
        """True when this was the last connection known from `addr` (a close from a node not known
        to hold one, as after a failover, proves nothing)."""
        with self._lock:
            nodes = self._nodes.get(addr)
            if nodes is None or node not in nodes:
                return False
            nodes.discard(node)
            if nodes:
                return False
            del self._nodes[addr]
            return True

    def forget(self, addr: str) -> None:
        with self._lock:
            self._nodes.pop(addr, None)

    def clear(self) -> None:
        with self._lock:
            self._nodes.clear()


class HeartbeatBuffer:
    """Heartbeats a follower received, waiting for the next batched forward to the leader: the latest
    per (address, reporting node), so a connection's close is never hidden by a plain heartbeat."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[tuple[str, str], api_pb2.BrokerHeartbeat] = {}

    def add(self, beat: api_pb2.BrokerHeartbeat) -> None:
        with self._lock:
            self._pending[(beat.broker_addr, beat.channel_node)] = beat

    def drain(self) -> list[api_pb2.BrokerHeartbeat]:
        with self._lock:
            out, self._pending = self._pending, {}
        return list(out.values())
