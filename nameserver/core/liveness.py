"""Broker liveness: soft state at the leader, never in the log.

The leader keeps the last-heard time per broker address (registrations and heartbeats refresh
it; followers forward heartbeats in batches). A scan every `scan_interval` appends removal
records for addresses silent past their timeout, each guarded by the version of the address's
registration the scan saw, so a stale expiry can never wipe a fresh re-registration.

Leader changes. Each node keeps a table too: what it heard itself, merged with the leader's clocks,
which it fetches every scan interval over the forward path as silences (ms since heard: monotonic
clocks differ per process). The first exchange with a new leader also hands the follower's table
over. A node that becomes leader carries each broker's clock on from the freshest evidence, so
elections more frequent than a broker's timeout no longer postpone its expiry forever; a broker with
no evidence (or a table not synced lately: a node back from a partition) gets a fresh timeout, so a
broker that beats only another node is never expelled by a leader that never heard of it. Merging
keeps the latest evidence. A fetched silence counts from when its request was sent, so it only ages on
the way; a handed-over one counts from its arrival (younger by its transit time, once per follower and
leader change): evidence passed around cannot keep a dead broker alive.

An address registered by a batch no broker sent to this leader (a broker set's copy into this group,
docs/scaling.md "Sharding": its heartbeats went to the source group until the move finished) was never
heard here: its clock starts at the leader's first scan that finds it registered (one not registered at
the previous scan), not at the grace point, which may be older than its timeout.

Remoting connections, as RocketMQ uses them: every node's remoting listener reports which brokers
hold a connection to it (ChannelTable, at the leader). When the last known connection from a broker
closes, the broker is expired after a short grace instead of at its timeout (RocketMQ unregisters on
channel close). A node that crashes never reports its connections closed: those brokers fall back
to their timeout, as does every broker after a failover until its next heartbeat re-reports them.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable

from nameserver.pb import api_pb2


class LivenessTable:
    """last-heard times by broker address; the clock is injectable so the logic tests without sleeping."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._doomed: dict[str, float] = {}  # addr -> when it expires unless heard from first
        self._grace_from = clock()
        self._current_at = -math.inf  # when this table last knew what the leader knew (led, or synced)
        # the addresses registered at this leader's last scan (None: no scan since its grace point)
        self._scanned: set[str] | None = None

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

    def mark_current(self) -> None:
        """This table holds what the leader knew, as of now (a sync with it, or this node led until now)."""
        with self._lock:
            self._current_at = self._clock()

    def grant_grace(self, trust_within_s: float) -> None:
        """On becoming leader: every clock carries on from the evidence in the table, if the table was
        current within `trust_within_s`; a broker without evidence counts from now."""
        with self._lock:
            now = self._clock()
            if now - self._current_at > trust_within_s:
                self._last.clear()  # stale evidence: a live broker may have beaten others meanwhile
            self._doomed.clear()
            self._grace_from = now
            self._current_at = now
            self._scanned = None

    def silences(self, addrs: Iterable[str] | None = None) -> api_pb2.BrokerSilences:
        """ms since each address was heard: of `addrs` (registered brokers, at the leader: one never
        heard counts from the grace point, as `expired` does), or of every address this table heard."""
        now = self._clock()
        with self._lock:
            if addrs is None:
                names, lasts = list(self._last), list(self._last.values())
            else:
                names = list(addrs)
                lasts = [self._last.get(a, now if self._arrived(a) else self._grace_from) for a in names]
        return api_pb2.BrokerSilences(broker_addrs=names,
                                      silent_ms=[max(0, int((now - last) * 1000)) for last in lasts])

    def merge(self, silences: api_pb2.BrokerSilences, measured_at: float) -> None:
        """Another node's silences, measured no earlier than `measured_at` (by this clock): each address
        keeps its latest evidence."""
        with self._lock:
            for addr, ms in zip(silences.broker_addrs, silences.silent_ms, strict=False):
                heard = measured_at - ms / 1000.0
                if heard > self._last.get(addr, -math.inf):
                    self._last[addr] = heard

    def keep_only(self, registered: Iterable[str]) -> None:
        """Drop the addresses no longer registered (a follower's table must not grow forever either)."""
        live = set(registered)
        with self._lock:
            for addr in [a for a in self._last if a not in live]:
                del self._last[addr]

    def _arrived(self, addr: str) -> bool:
        """Never heard here and not registered at this leader's last scan: registered since by a batch no
        broker sent here (a set's copy, see the module's docstring). Caller holds the lock."""
        return self._scanned is not None and addr not in self._scanned and addr not in self._last

    def expired(self, registered: list[tuple[str, int, int]]) -> list[tuple[str, int]]:
        """Of (addr, timeout_ms, version) registrations, those silent past their timeout.

        An address never heard counts from the grace point, or from the first scan that finds it
        registered if an earlier scan since the grace point did not (_arrived).
        """
        now = self._clock()
        out = []
        live = {addr for addr, _, _ in registered}
        with self._lock:
            for addr, timeout_ms, version in registered:
                if self._arrived(addr):
                    self._last[addr] = now
                last = self._last.get(addr, self._grace_from)
                doom = self._doomed.get(addr)
                if now - last > timeout_ms / 1000.0 or (doom is not None and now >= doom):
                    out.append((addr, version))
            for addr in [a for a in self._doomed if a not in live]:
                del self._doomed[addr]
            self._scanned = live
        self.keep_only(live)  # unregistered elsewhere: do not grow forever
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
