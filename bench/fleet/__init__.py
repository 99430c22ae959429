"""The fleet simulator: a scaled RocketMQ fleet (brokers heartbeating, clients polling routes, restarts, topic
churn, a mass expiry) against a real cluster, reported per operation and per node over time (docs/scaling.md,
"Simulator runs").

The load comes from the compiled load generator's fleet mode (bench/loadgen/fleet.go); this package scales the
fleet, starts the cluster, samples each node's CPU, memory and Raft lag window by window, and writes the JSON
report and its chart. `Fleet` is the fleet's description in the capacity model's shape (`nsctl plan`'s input).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

# The real fleet's defaults are RocketMQ's: a broker registers with every NameServer every 30 s
# (registerNameServerPeriod) and is expired after 120 s silent (BROKER_CHANNEL_EXPIRED_TIME); a client
# polls each topic's route every 30 s (pollNameServerInterval); the NameServer scans every 5 s.
REAL_SCAN_INTERVAL_S = 5.0
MIN_HEARTBEAT_TIMEOUT_S = 1.0  # the node clamps heartbeatTimeoutMillis below 1000 ms (docs/remoting.md)
MIN_SCAN_INTERVAL_S = 0.1      # liveness.scan_interval_ms's lower bound (nameserver/config.py)


@dataclass(frozen=True)
class Fleet:
    """A fleet: what the capacity model takes and what a simulator run reports it ran."""

    brokers: int
    topics: int
    queues_per_topic: int = 8
    clients: int = 1000
    topics_per_client: int = 4  # routes each client polls (the topics it produces to or consumes)
    route_poll_period_s: float = 30.0
    heartbeat_period_s: float = 30.0
    heartbeat_timeout_s: float = 120.0
    broker_restarts_per_hour: float = 0.0
    topic_changes_per_hour: float = 0.0
    restart_downtime_s: float = 30.0  # a restarting broker's time between its 104 and its next 103

    def scaled(self, time_scale: float) -> Fleet:
        """The fleet with time running `time_scale` times faster: every period and duration divided by it,
        every rate multiplied. Its request rates are those of a fleet `time_scale` times larger at the real
        periods, on this fleet's state (brokers, topics, queues); the heartbeat timeout is clamped at 1 s."""
        if time_scale <= 0:
            raise ValueError(f"time_scale {time_scale}: must be positive")
        s = time_scale
        return replace(self, route_poll_period_s=self.route_poll_period_s / s,
                       heartbeat_period_s=self.heartbeat_period_s / s,
                       heartbeat_timeout_s=max(MIN_HEARTBEAT_TIMEOUT_S, self.heartbeat_timeout_s / s),
                       broker_restarts_per_hour=self.broker_restarts_per_hour * s,
                       topic_changes_per_hour=self.topic_changes_per_hour * s,
                       restart_downtime_s=self.restart_downtime_s / s)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def scan_interval_s(time_scale: float) -> float:
    """The cluster's liveness scan interval for a run at `time_scale` (5 s scaled, at least 0.1 s)."""
    return max(MIN_SCAN_INTERVAL_S, REAL_SCAN_INTERVAL_S / time_scale)


__all__ = ["Fleet", "scan_interval_s"]
