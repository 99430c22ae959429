"""Latency fault tolerance, as RocketMQ's producer does it (LatencyFaultToleranceImpl, MQFaultStrategy).

After each send the producer records its latency. A broker whose send took at least
50 / 100 / 550 / 1000 / 2000 / 3000 / 15000 ms is avoided for 0 / 0 / 30 / 60 / 120 / 180 / 600 s; a
failed send isolates it for the longest period. The clock is injected so that tests are exact.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

LATENCY_MAX_MS: tuple[int, ...] = (50, 100, 550, 1000, 2000, 3000, 15000)
NOT_AVAILABLE_S: tuple[float, ...] = (0, 0, 30, 60, 120, 180, 600)


def not_available_duration(latency_ms: float, latency_max_ms: tuple[int, ...] = LATENCY_MAX_MS,
                           durations_s: tuple[float, ...] = NOT_AVAILABLE_S) -> float:
    """Seconds to avoid a broker after a send of `latency_ms` (the highest threshold it reached)."""
    for threshold, duration in zip(reversed(latency_max_ms), reversed(durations_s), strict=True):
        if latency_ms >= threshold:
            return duration
    return 0.0


@dataclass
class FaultItem:
    """What is known about one broker: its last latency and when it becomes available again."""

    broker_name: str
    latency_ms: float
    available_at: float  # clock seconds

    def available(self, now: float) -> bool:
        return now >= self.available_at


class LatencyFaultTolerance:
    """Thread-safe table of broker fault items, keyed by broker name."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 latency_max_ms: tuple[int, ...] = LATENCY_MAX_MS,
                 durations_s: tuple[float, ...] = NOT_AVAILABLE_S) -> None:
        if len(latency_max_ms) != len(durations_s):
            raise ValueError("latency_max_ms and durations_s must have the same length")
        self.clock = clock
        self.latency_max_ms = latency_max_ms
        self.durations_s = durations_s
        self._items: dict[str, FaultItem] = {}
        self._lock = threading.Lock()

    def update(self, broker_name: str, latency_ms: float, failed: bool = False) -> float:
        """Record a send's outcome; returns for how many seconds the broker is now avoided."""
        duration = self.durations_s[-1] if failed else not_available_duration(
            latency_ms, self.latency_max_ms, self.durations_s)
        with self._lock:
            self._items[broker_name] = FaultItem(broker_name, latency_ms, self.clock() + duration)
        return duration

    def is_available(self, broker_name: str) -> bool:
        with self._lock:
            item = self._items.get(broker_name)
        return item is None or item.available(self.clock())

    def remove(self, broker_name: str) -> None:
        with self._lock:
            self._items.pop(broker_name, None)

    def item(self, broker_name: str) -> FaultItem | None:
        with self._lock:
            return self._items.get(broker_name)

    def least_bad(self, broker_names: Iterable[str]) -> str | None:
        """Of these brokers, the one available soonest (then the lowest latency, then the name)."""
        now = self.clock()
        with self._lock:
            ranked = sorted(
                (max(0.0, self._items[n].available_at - now) if n in self._items else 0.0,
                 self._items[n].latency_ms if n in self._items else 0.0, n)
                for n in set(broker_names))
        return ranked[0][2] if ranked else None
