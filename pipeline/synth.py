"""A synthetic metadata log of a realistic fleet, at any size, written as exported log segments.

Clusters of broker groups (a master, sometimes a slave) register their topics; brokers re-register
with new DataVersions, expire (flappy ones often, and come back minutes later) or unregister; topics
are created and deleted; KV config and queue bindings change; the leader's term moves now and then
(its no-op entry takes an offset). Batches carry the preconditions the leader's translation would
(live/ and broker/ versions for registrations, the binding's version for binds), and a small fraction
of writes first race and fail their precondition, then succeed on retry, as on a busy leader.

The generator keeps the state it builds, so every record is a real change (the translator's rule) and
preconditions name real versions. Same seed, same log.
"""

from __future__ import annotations

import heapq
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.message import Message

from nameserver.logformat.records import BIND, BROKER, EXPIRE_TAG, KV, LIVE, TOPIC, UNREGISTER_TAG
from nameserver.logformat.segments import SegmentWriter
from nameserver.pb import state_pb2
from raftlog.codec import encode_entry
from raftlog.pb import entry_pb2

PUT, DELETE = entry_pb2.OP_PUT, entry_pb2.OP_DELETE
T_BROKER, T_LIVE, T_TOPIC, T_KV, T_BIND = BROKER.rtype, LIVE.rtype, TOPIC.rtype, KV.rtype, BIND.rtype
KV_NAMESPACES = ("ORDER_TOPIC_CONFIG", "BROKER_CONFIG", "CLIENT_QUOTA")
GROUP_LINGER_MS = 2   # the leader's group commit: batches this close share an entry
MAX_BATCHES = 512


@dataclass
class FleetSpec:
    records: int = 100_000
    clusters: int = 3
    groups_per_cluster: int = 8
    topics_per_group: int = 40
    slave_fraction: float = 0.5
    flappy_fraction: float = 0.15
    race_rate: float = 0.01
    seed: int = 7
    start_ms: int = 1_700_000_000_000
    rows_per_segment: int = 500_000
    # Mean times between events, in seconds (Poisson processes).
    rereg_s: float = 900.0          # per address: a DataVersion change
    flappy_up_s: float = 480.0      # per flappy address: until it expires (down 1-5 minutes)
    steady_up_s: float = 86_400.0   # per other address: until it expires or is unregistered (down 10-60 min)
    topic_create_s: float = 120.0   # per cluster
    topic_delete_s: float = 300.0   # per cluster
    perm_s: float = 3_600.0         # per cluster: a write-permission wipe or restore
    kv_s: float = 60.0              # fleet-wide
    bind_s: float = 600.0           # per broker group


@dataclass
class Addr:
    group: Group
    addr: str
    broker_id: int
    flappy: bool
    timeout_ms: int
    up: bool = False
    counter: int = 0
    epoch: int = 0  # bumped when it leaves: its pending events are stale


@dataclass
class Group:
    cluster: str
    name: str
    topics: dict[str, None] = field(default_factory=dict)  # insertion ordered: deterministic choices
    addrs: list[Addr] = field(default_factory=list)


@dataclass
class SynthResult:
    out: str
    entries: int = 0
    records: int = 0
    last_offset: int = 0
    failed_batches: int = 0
    segments: int = 0


class Fleet:
    def __init__(self, spec: FleetSpec, writer: SegmentWriter) -> None:
        self.spec = spec
        self.rng = random.Random(spec.seed)
        self.writer = writer
        self.values: dict[str, bytes] = {}
        self.versions: dict[str, int] = {}
        self.clock: float = spec.start_ms  # ms; events fall between whole milliseconds
        self.offset = 0
        self.term = 1
        self.next_term_at = self._term_gap()
        self.current = 0
        self.batches: list[entry_pb2.Batch] = []
        self.result = SynthResult(writer.directory)
        self.events: list[tuple[float, int, str, object, int]] = []  # (time ms, seq, kind, target, epoch)
        self.seq = 0
        self.entry_time = 0
        self.groups: list[Group] = []
        self.by_addr: dict[str, Addr] = {}
        self.pool: dict[str, list[str]] = {}
        self._make_fleet()

    def _term_gap(self) -> int:
        return self.offset + self.rng.randint(20_000, 200_000)

    def _make_fleet(self) -> None:
        s, rng = self.spec, self.rng
        for c in range(s.clusters):
            cluster = f"cluster-{c}"
            self.pool[cluster] = [f"{cluster}-topic-{i}" for i in range(2 * s.topics_per_group)]
            for g in range(s.groups_per_cluster):
                group = Group(cluster, f"broker-{c}-{g}")
                group.topics = dict.fromkeys(rng.sample(self.pool[cluster], s.topics_per_group))
                ids = [0, 1] if rng.random() < s.slave_fraction else [0]
                for bid in ids:
                    flappy = rng.random() < s.flappy_fraction
                    addr = Addr(group, f"10.{c}.{g}.{bid + 1}:10911", bid, flappy, 10_000 if flappy else 30_000)
                    group.addrs.append(addr)
                    self.by_addr[addr.addr] = addr
                self.groups.append(group)

    # ---- batches: the translator's rules (only real changes; preconditions at current versions) ----

    def _batch(self, tag: str = "") -> _Batch:
        return _Batch(self, tag)

    def _entry_offset(self) -> int:
        """The offset of the entry being built (a new leader's no-op may take the one before it)."""
        if not self.batches:
            nxt = self.offset + 1
            if nxt >= self.next_term_at:
                self.term += 1
                nxt += 1
                self.next_term_at = self._term_gap()
            self.current = nxt
        return self.current

    def _request_id(self, tag: str = "") -> str:
        return tag + uuid.UUID(int=self.rng.getrandbits(128)).hex

    def _commit(self, b: _Batch) -> None:
        """Append a built batch (a race first, sometimes) and fold it into the model state."""
        if not b.records:
            return
        if self.batches and (self.clock - self.entry_time > GROUP_LINGER_MS or len(self.batches) >= MAX_BATCHES):
            self._end_entry()
        if not self.batches:
            self.entry_time = int(self.clock)
        if b.preconditions and self.rng.random() < self.spec.race_rate:
            self._entry_offset()
            raced = entry_pb2.Batch(request_id=self._request_id())
            k, v = next(iter(b.preconditions.items()))
            raced.preconditions.add(key=k, version=v + 1)  # a write that landed in between
            raced.records.extend(b.records)
            self.batches.append(raced)
            self.result.failed_batches += 1
            self._end_entry()
            self.clock += 1  # the leader translates again and retries
            self.entry_time = int(self.clock)
        offset = self._entry_offset()
        batch = entry_pb2.Batch(request_id=self._request_id(b.tag))
        batch.preconditions.extend(entry_pb2.Precondition(key=k, version=v) for k, v in b.preconditions.items())
        batch.records.extend(b.records)
        self.batches.append(batch)
        for rec in b.records:
            if rec.op == PUT:
                self.values[rec.key] = rec.value
                self.versions[rec.key] = offset
            else:
                self.values.pop(rec.key, None)
                self.versions.pop(rec.key, None)

    def _end_entry(self) -> None:
        if not self.batches:
            return
        self.offset = self.current
        entry = entry_pb2.Entry(term=self.term, leader_time_ms=self.entry_time, batches=self.batches)
        data = encode_entry(entry)
        self.writer.add(self.offset, self.term, data, entry)
        self.result.entries += 1
        self.result.records += sum(len(b.records) for b in self.batches)
        self.batches = []

    # ---- fleet events --------------------------------------------------------------------------

    def _schedule(self, mean_s: float, kind: str, target: object, epoch: int = 0, fixed_ms: float | None = None
                  ) -> None:
        delay = fixed_ms if fixed_ms is not None else self.rng.expovariate(1 / (mean_s * 1000))
        self.seq += 1
        heapq.heappush(self.events, (self.clock + delay, self.seq, kind, target, epoch))

    def _registration(self, a: Addr) -> None:
        g, b = a.group, self._batch()
        b.require(f"{LIVE.prefix}{a.addr}")
        b.require(f"{BROKER.prefix}{g.name}")
        a.up = True
        a.counter += 1
        b.put(T_BROKER, f"{BROKER.prefix}{g.name}", self._broker_data(g))
        live = state_pb2.BrokerLive(cluster=g.cluster, broker_name=g.name, broker_id=a.broker_id,
                                    broker_addr=a.addr, ha_server_addr=a.addr.replace(":10911", ":10912"),
                                    heartbeat_timeout_ms=a.timeout_ms,
                                    data_version=state_pb2.DataVersion(counter=a.counter, timestamp=int(self.clock)))
        b.put(T_LIVE, f"{LIVE.prefix}{a.addr}", live)
        if a.broker_id == 0:
            for t in sorted(g.topics):
                b.put(T_TOPIC, f"{TOPIC.prefix}{t}/{g.name}", _queue_data(g.name, 6))
        self._commit(b)

    def register(self, a: Addr) -> None:
        """A broker (re)starts: full registration; then DataVersion changes until it leaves."""
        self._registration(a)
        s = self.spec
        self._schedule(s.rereg_s, "rereg", a, a.epoch)
        self._schedule(s.flappy_up_s if a.flappy else s.steady_up_s, "leave", a, a.epoch)

    def reregister(self, a: Addr) -> None:
        """A DataVersion change: the live record, plus a topic added now and then."""
        g = a.group
        if a.broker_id == 0 and self.rng.random() < 0.5:
            spare = [t for t in self.pool[g.cluster] if t not in g.topics]
            if spare:
                g.topics[self.rng.choice(spare)] = None
        self._registration(a)
        self._schedule(self.spec.rereg_s, "rereg", a, a.epoch)

    def leave(self, a: Addr) -> None:
        """Expiry or unregister: the address goes; a group left empty takes its topics with it."""
        tag = UNREGISTER_TAG if not a.flappy and self.rng.random() < 0.1 else EXPIRE_TAG
        g, b = a.group, self._batch(tag)
        b.require(f"{LIVE.prefix}{a.addr}")
        b.delete(T_LIVE, f"{LIVE.prefix}{a.addr}")
        a.up = False
        a.epoch += 1
        if any(x.up for x in g.addrs):
            b.put(T_BROKER, f"{BROKER.prefix}{g.name}", self._broker_data(g))
        else:
            b.delete(T_BROKER, f"{BROKER.prefix}{g.name}")
            for t in sorted(g.topics):
                b.delete(T_TOPIC, f"{TOPIC.prefix}{t}/{g.name}")
        self._commit(b)
        down = self.rng.uniform(60_000, 300_000) if a.flappy else self.rng.uniform(600_000, 3_600_000)
        self._schedule(0, "return", a, a.epoch, fixed_ms=down)

    def create_topic(self, cluster: str) -> None:
        up = [g for g in self.groups if g.cluster == cluster and any(x.up and x.broker_id == 0 for x in g.addrs)]
        if not up:
            return
        topic = f"{cluster}-new-{self.rng.getrandbits(40):010x}"
        b = self._batch()
        for g in self.rng.sample(up, min(len(up), self.rng.randint(1, 3))):
            b.require(f"{BROKER.prefix}{g.name}")
            g.topics[topic] = None
            b.put(T_TOPIC, f"{TOPIC.prefix}{topic}/{g.name}", _queue_data(g.name, 6))
        self._commit(b)

    def delete_topic(self, cluster: str) -> None:
        groups = [g for g in self.groups if g.cluster == cluster and g.topics]
        if not groups:
            return
        topic = self.rng.choice(list(self.rng.choice(groups).topics))
        b = self._batch()
        for g in groups:
            if topic in g.topics:
                del g.topics[topic]
                b.delete(T_TOPIC, f"{TOPIC.prefix}{topic}/{g.name}")
        self._commit(b)

    def set_perm(self, cluster: str) -> None:
        groups = [g for g in self.groups if g.cluster == cluster]
        g = self.rng.choice(groups)
        perm = self.rng.choice((4, 6))
        b = self._batch()
        for t in sorted(g.topics):
            key = f"{TOPIC.prefix}{t}/{g.name}"
            if key in self.values:
                b.require(key)
                b.put(T_TOPIC, key, _queue_data(g.name, perm))
        self._commit(b)

    def kv(self) -> None:
        b = self._batch()
        key = f"{KV.prefix}{self.rng.choice(KV_NAMESPACES)}/key-{self.rng.randrange(200)}"
        if key in self.values and self.rng.random() < 0.3:
            b.delete(T_KV, key)
        else:
            b.put(T_KV, key, state_pb2.KvValue(value=f"v{self.rng.randrange(1000)}"))
        self._commit(b)

    def bind(self, g: Group) -> None:
        if not g.topics:
            return
        key = f"{BIND.prefix}{self.rng.choice(list(g.topics))}/{self.rng.randrange(8)}"
        b = self._batch()
        b.require(key)
        if key in self.values and self.rng.random() < 0.2:
            b.delete(T_BIND, key)
        else:
            old = state_pb2.QueueBindingValue.FromString(self.values[key]) if key in self.values else None
            b.put(T_BIND, key, state_pb2.QueueBindingValue(owner=g.name, epoch=(old.epoch if old else 0) + 1))
        self._commit(b)

    def _broker_data(self, g: Group) -> state_pb2.BrokerData:
        bd = state_pb2.BrokerData(cluster=g.cluster, broker_name=g.name)
        for a in sorted((x for x in g.addrs if x.up), key=lambda x: x.broker_id):
            bd.addrs.add(broker_id=a.broker_id, addr=a.addr)
        return bd

    def _fire(self, kind: str, target: object, epoch: int) -> None:
        s = self.spec
        if kind in ("rereg", "leave", "return"):
            a = target
            assert isinstance(a, Addr)
            if a.epoch != epoch or a.up == (kind == "return"):
                return  # stale: the address left (or came back) since this was scheduled
            {"rereg": self.reregister, "leave": self.leave, "return": self.register}[kind](a)
            return
        periodic: dict[str, tuple[float, Callable[[Any], None]]] = {
            "topic_create": (s.topic_create_s, self.create_topic), "topic_delete": (s.topic_delete_s,
            self.delete_topic), "perm": (s.perm_s, self.set_perm), "kv": (s.kv_s, lambda _: self.kv()),
            "bind": (s.bind_s, self.bind)}
        mean_s, fn = periodic[kind]
        fn(target)
        self._schedule(mean_s, kind, target)

    def run(self) -> SynthResult:
        s = self.spec
        for g in self.groups:
            for a in g.addrs:
                self.register(a)
                self.clock += self.rng.uniform(0, 50)
            self._schedule(s.bind_s, "bind", g)
        for c in range(s.clusters):
            for kind, mean_s in (("topic_create", s.topic_create_s), ("topic_delete", s.topic_delete_s),
                                 ("perm", s.perm_s)):
                self._schedule(mean_s, kind, f"cluster-{c}")
        self._schedule(s.kv_s, "kv", None)
        while self.result.records < s.records and self.events:
            t, _, kind, target, epoch = heapq.heappop(self.events)
            self.clock = max(self.clock, t)
            self._fire(kind, target, epoch)
        self._end_entry()
        self.writer.flush(self.offset)
        self.result.last_offset = self.offset
        self.result.segments = len(self.writer.written)
        return self.result


class _Batch:
    """Records and preconditions of one batch, seeing the fleet's state plus its own pending writes."""

    def __init__(self, fleet: Fleet, tag: str) -> None:
        self.fleet = fleet
        self.tag = tag
        self.records: list[entry_pb2.Record] = []
        self.preconditions: dict[str, int] = {}
        self.pending: dict[str, bytes | None] = {}

    def require(self, key: str) -> None:
        self.preconditions.setdefault(key, self.fleet.versions.get(key, 0))

    def _current(self, key: str) -> bytes | None:
        return self.pending[key] if key in self.pending else self.fleet.values.get(key)

    def put(self, rtype: int, key: str, value: bytes | Message) -> None:
        if isinstance(value, Message):
            value = value.SerializeToString(deterministic=True)
        if self._current(key) != value:
            self.pending[key] = value
            self.records.append(entry_pb2.Record(type=rtype, op=PUT, key=key, value=value))

    def delete(self, rtype: int, key: str) -> None:
        if self._current(key) is not None:
            self.pending[key] = None
            self.records.append(entry_pb2.Record(type=rtype, op=DELETE, key=key))


_QD_CACHE: dict[tuple[str, int], bytes] = {}


def _queue_data(broker: str, perm: int) -> bytes:
    key = (broker, perm)
    if key not in _QD_CACHE:
        _QD_CACHE[key] = state_pb2.QueueData(broker_name=broker, read_queue_nums=8, write_queue_nums=8,
                                             perm=perm).SerializeToString(deterministic=True)
    return _QD_CACHE[key]


def generate(out: str, spec: FleetSpec) -> SynthResult:
    """Write a synthetic log of at least `spec.records` records as segments under `out` (from offset 1)."""
    writer = SegmentWriter(out, 1, spec.rows_per_segment)
    return Fleet(spec, writer).run()
