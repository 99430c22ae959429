"""Broker liveness: soft state at the leader, never in the log.

The leader keeps the last-heard time per broker address (registrations and heartbeats refresh
it; followers forward heartbeats in batches). A scan every `scan_interval` appends removal
records for addresses silent past their timeout, each guarded by the version of the address's
registration the scan saw, so a stale expiry can never wipe a fresh re-registration. A node that
becomes leader grants every broker a fresh timeout: a failover never mass-expels brokers.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class LivenessTable:
    """last-heard times by broker address; the clock is injectable so the logic tests without sleeping."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._grace_from = clock()

    def touch(self, addr: str) -> None:
        now = self._clock()
        with self._lock:
            self._last[addr] = now

    def forget(self, addr: str) -> None:
        with self._lock:
            self._last.pop(addr, None)

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
                if now - last > timeout_ms / 1000.0:
                    out.append((addr, version))
            live = {addr for addr, _, _ in registered}
            for addr in [a for a in self._last if a not in live]:
                del self._last[addr]  # unregistered elsewhere: do not grow forever
        return out

    def __len__(self) -> int:
        with self._lock:
            return len(self._last)


class HeartbeatBuffer:
    """Heartbeats a follower received, waiting for the next batched forward to the leader."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[str, tuple[str, str]] = {}  # addr -> (cluster, broker name)

    def add(self, addr: str, cluster: str, broker_name: str) -> None:
        with self._lock:
            self._pending[addr] = (cluster, broker_name)

    def drain(self) -> dict[str, tuple[str, str]]:
        with self._lock:
            out, self._pending = self._pending, {}
        return out
