"""Brokers' heartbeats to the controller: soft state in each node's memory, never in the log.

RocketMQ 5 brokers in controller mode send BROKER_HEARTBEAT to every controller address they can reach
(ReplicasManager.sendHeartbeatToController), so every node keeps its own table, as Apache RocketMQ's
DefaultBrokerHeartbeatManager does, and a new Raft leader already knows who is alive.

A node that has just started has heard from nobody yet. For one default timeout after its start, a
broker it never heard from counts as alive: otherwise the first broker to heartbeat would look like the
only live member of its set and could be elected over a healthy master (the nameserver's liveness table
gives every broker a fresh timeout after a failover for the same reason).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from nameserver.pb import api_pb2

DEFAULT_TIMEOUT_S = 10.0  # RocketMQ's controller, for a heartbeat that names none


@dataclass(frozen=True, slots=True)
class Beat:
    cluster_name: str
    broker_name: str
    broker_address: str
    broker_id: int
    epoch: int
    max_offset: int
    confirm_offset: int
    election_priority: int
    timeout_s: float
    at: float  # this node's monotonic clock when it arrived


class HeartbeatTable:
    """Last heartbeat per (broker name, broker id); the clock is injectable for tests."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, default_timeout_s: float = DEFAULT_TIMEOUT_S
                 ) -> None:
        self._clock = clock
        self.default_timeout_s = default_timeout_s
        self._lock = threading.Lock()
        self._beats: dict[tuple[str, int], Beat] = {}
        self._grace_until = clock() + default_timeout_s

    def beat(self, req: api_pb2.ControllerHeartbeatRequest) -> Beat:
        timeout_s = req.timeout_ms / 1000 if req.timeout_ms > 0 else self.default_timeout_s
        beat = Beat(req.cluster_name, req.broker_name, req.broker_address, req.broker_id, req.epoch,
                    req.max_offset, req.confirm_offset, req.election_priority, timeout_s, self._clock())
        with self._lock:
            self._beats[(req.broker_name, req.broker_id)] = beat
        return beat

    def get(self, broker_name: str, broker_id: int) -> Beat | None:
        with self._lock:
            return self._beats.get((broker_name, broker_id))

    def alive(self, broker_name: str, broker_id: int) -> bool:
        beat = self.get(broker_name, broker_id)
        now = self._clock()
        if beat is None:
            return now < self._grace_until
        return now - beat.at < beat.timeout_s

    def rank(self, broker_name: str, broker_id: int) -> tuple[int, int, int] | None:
        beat = self.get(broker_name, broker_id)
        return None if beat is None else (beat.epoch, beat.max_offset, beat.election_priority)

    def forget(self, broker_name: str, broker_ids: list[int] | None = None) -> None:
        """A cleaned broker (or set) is forgotten, so a stale beat cannot make it look alive again."""
        with self._lock:
            for key in [k for k in self._beats if k[0] == broker_name and (not broker_ids or k[1] in broker_ids)]:
                del self._beats[key]

    def expire(self, keep_for_s: float = 600.0) -> int:
        """Drop beats silent for `keep_for_s` (memory bound for brokers that went away for good)."""
        now = self._clock()
        with self._lock:
            old = [k for k, b in self._beats.items() if now - b.at > max(keep_for_s, b.timeout_s)]
            for key in old:
                del self._beats[key]
        return len(old)

    def __len__(self) -> int:
        return len(self._beats)
