"""Prometheus metrics of one node, its /metrics HTTP endpoint and the leader watch.

Gauges are read from the node when Prometheus scrapes (a custom collector), so serving RPCs and
applying entries take no extra lock for them. Counters that must see every event are cheap in-memory
counts: records applied by type (an entry listener on the apply thread), RPCs by method and status
(a gRPC server interceptor), calls forwarded to this node by followers (same interceptor). With
worker processes, the request counters (RequestMetrics) are the core's plus its workers'
(nameserver/ops/workermetrics.py).

Apply lag, KRaft style: every entry carries its proposing leader's wall clock (Entry.leader_time_ms),
and `nameserver_apply_lag_seconds` = now - that time for the newest entry this node has applied. So
that the lag stays meaningful when nothing changes, the leader appends an empty entry
(nameserver/core/idlenoop.py) when nothing has been applied for 500 ms (KRaft's interval). A healthy node's lag is then
below ~500 ms plus the commit latency; a follower cut off from the leader sees it grow. Wall
clocks of different hosts are compared, so clock skew adds to (or hides) lag on followers. The
server runs IdleNoop whenever the metrics endpoint is on (nameserver/server.py).

Every label's values come from a set fixed by the code or the configuration, never from what a
client sends (docs/operations.md, "Metrics cardinality"): gRPC service and method only for methods the
server has a handler for (an unknown one gets UNIMPLEMENTED and no series), status codes from
grpc.StatusCode; remoting request codes the node serves (else "other") and RESPONSE_CODES (else
"other"); record types from the state's enum; broker sets at most [limits] metrics_max_broker_sets
(5 series each, the rest only counted). No label holds a topic, broker address, key or client id.

Metric names follow Prometheus conventions: base units (_seconds, _bytes), `_total` only on counters
(prometheus_client appends it), offsets are unit-less gauges.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any, Protocol
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import grpc
from prometheus_client import (
    CollectorRegistry,
    Counter,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
    make_wsgi_app,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from nameserver import framing, headers
from nameserver.api.grpcwrap import CALL_RECEIVED, STREAMING_RESPONSE, wrap_handler
from nameserver.config import NodeConfig
from nameserver.core.node import NameServerNode
from nameserver.ops.groupmetrics import GroupFamilies, group_sockets
from nameserver.ops.workermetrics import WorkerSums
from nameserver.pb import state_pb2
from nameserver.remoting import codes as remoting_codes
from nameserver.state import quotas
from nameserver.state.shards.directory import GROUP0
from raftlog.history import AppliedEntry
from raftlog.roles import Role
from snapshot.store import parse_snapshot_name

if TYPE_CHECKING:
    from nameserver.ops.gofront import CacheCounts
    from raftlog.log import LeaderView, ReplicatedLog, Subscription

log = logging.getLogger("nameserver.ops.metrics")

# `*_created` series double the counter series and no dashboard or alert here reads them.
disable_created_metrics()


RPC_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)        # group commit: <= 512 batches per entry
BYTES_BUCKETS = (256, 1024, 4096, 16384, 65536, 262144, 1 << 20, 4 << 20, 16 << 20)
# Remoting response codes this node answers with: RocketMQ's ResponseCode ones and the controller's 2000-2016.
RESPONSE_CODES = frozenset({remoting_codes.SUCCESS, remoting_codes.SYSTEM_ERROR, remoting_codes.SYSTEM_BUSY,
                            remoting_codes.REQUEST_CODE_NOT_SUPPORTED, remoting_codes.NO_PERMISSION,
                            remoting_codes.TOPIC_NOT_EXIST, remoting_codes.QUERY_NOT_FOUND, *range(2000, 2017)})


# ---- reading an encoded Entry cheaply (apply thread) -------------------------------------------

def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def entry_summary(data: bytes) -> tuple[int, int]:
    """(leader_time_ms, number of batches) of an encoded raftlog Entry, without decoding its batches.

    Walks only the top-level fields (proto/raftlog/pb/entry.proto: 3 = leader_time_ms, 4 = batches),
    skipping each batch by its length, so the cost is per batch, not per record.
    """
    pos, end = 0, len(data)
    leader_time_ms = batches = 0
    while pos < end:
        # a one-byte varint read here (every key; most small values), a longer one by _varint: a call per
        # varint was most of this on every applied entry
        key = data[pos]
        if key < 0x80:
            pos += 1
        else:
            key, pos = _varint(data, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
            if field == 3:
                leader_time_ms = value
        elif wire == 2:
            length = data[pos]
            if length < 0x80:
                pos += 1
            else:
                length, pos = _varint(data, pos)
            pos += length
            if field == 4:
                batches += 1
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:
            raise ValueError(f"unexpected wire type {wire}")
    if pos != end:
        raise ValueError("truncated entry")
    return leader_time_ms, batches


def record_type_name(rtype: int) -> str:
    try:
        return state_pb2.RecordType.Name(rtype)
    except ValueError:
        return str(rtype)


# ---- the node's metrics ------------------------------------------------------------------------

BrokerAlive = Callable[[str, int], bool]  # (broker set, broker id) -> heartbeating to this node


class ChannelCount(Protocol):
    """What /metrics shows of the workers' write channel (nameserver/api/writechannel.py)."""

    calls: int
    read_indexes: int
    frames: int
    cancels: int


class WorkerCount(Protocol):
    """What /metrics shows of the remoting worker processes (nameserver/ops/workers.py)."""

    restarts_total: int

    def alive(self) -> int: ...


class FrontCount(Protocol):
    """What /metrics shows of the Go gRPC front end's process (nameserver/ops/gofront.py)."""

    restarts_total: int

    def pid(self) -> int | None: ...

    def calls(self) -> dict[int, int]: ...

    def cache(self) -> CacheCounts: ...


def _listed_first(item: tuple[str, state_pb2.ControllerBrokerSet]) -> tuple[bool, str]:
    # A set that has held an election (epoch > 0) before one that only took ids: a real set has
    # elected within seconds of its first broker, while any broker can name new sets by the thousand.
    name, bs = item
    return bs.master_epoch == 0, name


def _controller_gauges(sets: list[tuple[str, state_pb2.ControllerBrokerSet]],
                       alive: BrokerAlive | None, max_listed: int) -> Iterator[Metric]:
    """Controller mode, per broker set (docs/controller.md); none at all when no set is registered.

    Bound: at most `max_listed` sets ([limits] metrics_max_broker_sets) have series of their own, 5
    each, so this part of /metrics holds at most 5 * max_listed + 2 series however many sets brokers
    make; the others are counted in nameserver_controller_broker_sets_unlisted."""
    labels = ["broker_set", "cluster"]
    epoch = GaugeMetricFamily("nameserver_controller_master_epoch", "A broker set's master epoch (every "
                              "election moves it, also one that found no master).", labels=labels)
    has_master = GaugeMetricFamily("nameserver_controller_has_master", "1 if the broker set has a master, else "
                                   "0 (no in-sync replica was alive at its last election).", labels=labels)
    in_sync = GaugeMetricFamily("nameserver_controller_in_sync_replicas", "Brokers in the set's SyncStateSet "
                                "(the master included).", labels=labels)
    replicas = GaugeMetricFamily("nameserver_controller_replicas", "Brokers registered in the set.", labels=labels)
    # The controller re-elects only while some broker of the set is alive (as Apache RocketMQ's does),
    # so a set whose brokers all died keeps its recorded master: has_master alone would stay 1.
    master_alive = GaugeMetricFamily("nameserver_controller_master_alive", "1 if the set has a master and it "
                                     "heartbeats to this node, else 0.", labels=labels)
    listed = sorted(sets, key=_listed_first)[:max_listed] if len(sets) > max_listed else sets
    for name, bs in listed:
        values = [name, bs.cluster_name]
        epoch.add_metric(values, bs.master_epoch)
        has_master.add_metric(values, 1 if bs.master_id else 0)
        in_sync.add_metric(values, len(bs.sync_state_set))
        replicas.add_metric(values, len(bs.replicas))
        master_alive.add_metric(values, 1 if bs.master_id and alive is not None and alive(name, bs.master_id) else 0)
    if sets:
        yield from (epoch, has_master, in_sync, replicas)
        if alive is not None:
            yield master_alive
        yield GaugeMetricFamily("nameserver_controller_broker_sets", "Broker sets registered with the "
                                "controller.", value=len(sets))
        yield GaugeMetricFamily("nameserver_controller_broker_sets_unlisted", "Broker sets without series of "
                                "their own here ([limits] metrics_max_broker_sets; sets that have held an "
                                "election are listed first).", value=len(sets) - len(listed))


CONTROLLER_QUOTA = "max_controller_sets"  # the controller's: a group k core (no controller) shows none


def _quota_gauges(node: NameServerNode) -> Iterator[Metric]:
    """What the state holds of each quota, and the limit (nameserver/state/quotas.py, sessions.py), with the
    registration topics the leader is writing (nameserver/core/budget.py). A group k core serves no controller
    (every ctrl/ record is group 0's): its quotas leave out the controller's."""
    totals, live, kept = node.inspect(lambda s: (dict(s.usage.totals), s.session_book.live_total,
                                                len(s.session_book.ids())))
    used = GaugeMetricFamily("nameserver_quota_used", "What this node's state holds of each quota ([limits] "
                             "and [sessions] max_sessions: live exactly-once sessions), and the registration "
                             "topics being written on the leader.", labels=["quota"])
    limit = GaugeMetricFamily("nameserver_quota_limit", "Each quota's limit (nameserver_quota_used reaches it: "
                              "writes that grow past it are refused).", labels=["quota"])
    controller = node.cfg.group == GROUP0
    rows = [(name, totals[name], node.quota_limits[name]) for name in quotas.QUOTAS
            if controller or name != CONTROLLER_QUOTA]
    rows += [("max_sessions", live, node.session_quota.max_sessions),
             ("registration_topics_in_flight", node.registrations.held, node.registrations.capacity)]
    for name, value, bound in rows:
        used.add_metric([name], value)
        limit.add_metric([name], bound)
    yield used
    yield limit
    yield GaugeMetricFamily("nameserver_session_tombstones", "Evicted or expired exactly-once sessions kept so "
                            "that their retries are refused, not applied twice.", value=kept - live)


class RequestMetrics:
    """The counters of the requests a process answers (gRPC calls, remoting requests): the core's, and
    each worker process's (written to its metric files, nameserver/ops/workermetrics.py)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.rpc_handled = Counter(
            "nameserver_grpc_handled", "gRPC calls completed on this node, by method and status code "
            "(errors: code != OK).", ["service", "method", "type", "code"], registry=registry)
        self.rpc_seconds = Histogram(
            "nameserver_grpc_handling_seconds", "Time to complete a gRPC call on this node (streams: the "
            "stream's lifetime).", ["service", "method", "type"], buckets=RPC_BUCKETS, registry=registry)
        self.remoting_handled = Counter(
            "nameserver_remoting_handled", "RocketMQ remoting requests answered on this node, by request "
            "code (\"other\": a code the node does not serve) and response code (0: SUCCESS).",
            ["request", "response"], registry=registry)
        self.remoting_seconds = Histogram(
            "nameserver_remoting_handling_seconds", "Time from a remoting request's frame to its answer on "
            "this node.", ["request"], buckets=RPC_BUCKETS, registry=registry)
        # (request, response code or None for "other") -> its counter and its histogram, labelled
        self._remoting_series: dict[tuple[str, int | None], tuple[Counter, Histogram]] = {}
        self.forwarded = Counter(
            "nameserver_forwarded_requests_received", "Calls this node received from a follower that "
            "forwarded them (header x-rip18-forwarded): writes, heartbeats and read indexes sent to the "
            "leader.", ["method"], registry=registry)

    def interceptor(self) -> grpc.ServerInterceptor:
        return RpcMetricsInterceptor(self)

    def observe_remoting(self, request: str, response: int, seconds: float) -> None:
        """The remoting listener's observer: remoting requests never pass the gRPC interceptor. The
        listener names a code it does not serve "other"; a response code is one of ours or "other"."""
        key = (request, response if response in RESPONSE_CODES else None)
        series = self._remoting_series.get(key)
        if series is None:  # labels() costs more than the count itself: once per pair (a bounded set)
            series = self._remoting_series[key] = (
                self.remoting_handled.labels(request, "other" if key[1] is None else str(response)),
                self.remoting_seconds.labels(request))
        series[0].inc()
        series[1].observe(seconds)


class NodeMetrics:
    """Every metric of one node, in a registry of its own (several nodes may share a process)."""

    def __init__(self, node: NameServerNode, registry: CollectorRegistry | None = None,
                 clock: Callable[[], float] = time.time,
                 max_broker_sets: int = NodeConfig.metrics_max_broker_sets) -> None:
        self.node = node
        self.clock = clock
        self.max_broker_sets = max_broker_sets  # [limits] metrics_max_broker_sets
        self.registry = registry if registry is not None else CollectorRegistry()
        cfg = node.cfg
        # This group's own families (its Raft, apply, state, process). A sharded node's group 0 core shows
        # them beside each group core's, every sample labelled with its group (nameserver/ops/groupmetrics.py);
        # a one-group node's are in its registry, unlabelled, as they always were.
        sharded = cfg.groups > 1 and cfg.group == GROUP0
        self.group_registry = CollectorRegistry() if sharded else self.registry
        own = self.group_registry
        ProcessCollector(registry=own)
        PlatformCollector(registry=own)
        GCCollector(registry=own)
        # The requests' counters: in a registry of their own, summed with the worker processes' copies on
        # scrape (nameserver/ops/workermetrics.py); the core's private listeners count nothing (a call a
        # worker passes on is counted once, by the worker, as its client saw it). The node's as a whole:
        # group 0's core's (a group core's metrics hold none).
        self.requests = RequestMetrics(CollectorRegistry())
        self.worker_sums = WorkerSums(self.requests.registry)
        if cfg.group == GROUP0:
            self.registry.register(self.worker_sums)
            self.registry.register(_WorkersCollector(self))
        self.entry_batches = Histogram(
            "nameserver_applied_entry_batches", "Proposals (batches) group-committed into each applied "
            "log entry.", buckets=BATCH_BUCKETS, registry=own)
        self.entry_bytes = Histogram(
            "nameserver_applied_entry_bytes", "Size of each applied log entry.", buckets=BYTES_BUCKETS,
            registry=own)
        # Plain ints written by one thread each and read at scrape time: no lock on the apply path.
        # record type -> records applied that upserted it; ~type (negative) -> those that deleted one
        self._records_by_type: dict[int, int] = {}
        self.entries_applied = 0
        self.last_leader_time_ms = 0
        self.leader_changes_seen = 0
        self.idle_noops = 0
        self.leader_balance_transfers = 0  # nameserver/groups/leaderbalance.py, with groups > 1
        self.broker_alive: BrokerAlive | None = None  # the controller's heartbeat table, when the server has one
        self.workers: WorkerCount | None = None  # the remoting worker processes' supervisor, when there are any
        self.front: FrontCount | None = None  # the Go gRPC front end's process ([node] grpc_front = "go")
        self.write_channel: ChannelCount | None = None  # the workers' write channel, when there are any
        own.register(_NodeCollector(self))
        if sharded:
            self.registry.register(GroupFamilies(own, group_sockets(cfg)))
        self.subscription = node.log.subscribe(self.on_entry)

    def count_idle_noop(self) -> None:
        """The idle no-op's observer (nameserver/core/idlenoop.py)."""
        self.idle_noops += 1

    def count_leader_balance(self) -> None:
        """The leader-balancing duty's observer: it handed this group's leadership to its preferred member."""
        self.leader_balance_transfers += 1

    # Apply thread: O(changes) dictionary counting, nothing that blocks.
    def on_entry(self, entry: AppliedEntry) -> None:
        data = entry.data
        try:
            leader_time_ms, batches = entry_summary(data)
        except (ValueError, IndexError):
            leader_time_ms, batches = 0, 0  # the applier applied it as a no-op; count it as one
        self.entries_applied += 1
        if leader_time_ms:
            self.last_leader_time_ms = leader_time_ms
        self.entry_batches.observe(batches)
        self.entry_bytes.observe(len(data))
        # Counted by type and deleted in one plain loop, an int key each (a Change unpacked, no tuple made for a
        # key: a third of this loop); named at scrape time (records_applied). A Counter over a generator and a
        # name per type, each entry, was a sixth of this listener's cost on every node.
        counts = self._records_by_type
        get = counts.get
        for _, rtype, _, _, new in entry.changes:
            key = rtype if new is not None else ~rtype
            counts[key] = get(key, 0) + 1

    @property
    def records_applied(self) -> dict[tuple[str, str], int]:
        """Records applied since the start by (record type name, "upsert" or "delete")."""
        named: dict[tuple[str, str], int] = {}
        for counted, n in dict(self._records_by_type).items():
            key = (record_type_name(~counted), "delete") if counted < 0 else (record_type_name(counted), "upsert")
            named[key] = named.get(key, 0) + n
        return named

    def apply_lag_seconds(self) -> float | None:
        if not self.last_leader_time_ms:
            return None  # nothing applied since this process started: unknown, not zero
        return max(0.0, self.clock() - self.last_leader_time_ms / 1000)


def _newest_snapshot_file(directory: str | os.PathLike[str]) -> os.stat_result | None:
    best: tuple[int, str] | None = None
    try:
        names = os.listdir(directory)
    except OSError:
        return None
    for name in names:
        parsed = parse_snapshot_name(name)
        if parsed is not None and (best is None or parsed[0] > best[0]):
            best = (parsed[0], name)
    if best is None:
        return None
    try:
        return os.stat(os.path.join(directory, best[1]))
    except OSError:
        return None  # pruned meanwhile


class _WorkersCollector(Collector):
    """The node's worker processes (their requests: summed by WorkerSums, nameserver/ops/workermetrics.py)."""

    def __init__(self, metrics: NodeMetrics) -> None:
        self.m = metrics

    def describe(self) -> Iterable[Metric]:
        return []  # unchecked collector: shown only with workers

    def collect(self) -> Iterator[Metric]:
        workers = self.m.workers
        if workers is not None:
            yield GaugeMetricFamily("nameserver_worker_processes", "Worker processes of this node alive now "
                                    "([node] worker_processes).", value=workers.alive())
            yield CounterMetricFamily("nameserver_worker_restarts", "Worker processes restarted after they "
                                      "exited.", value=workers.restarts_total)
        front = self.m.front
        if front is not None:
            yield GaugeMetricFamily("nameserver_grpc_front_up", "The Go gRPC front end's process is running "
                                    '([node] grpc_front = "go").', value=front.pid() is not None)
            yield CounterMetricFamily("nameserver_grpc_front_restarts", "Go gRPC front end processes started "
                                      "again by the core after one exited.", value=front.restarts_total)
            calls = CounterMetricFamily("nameserver_grpc_front_calls", "Calls the running Go gRPC front end "
                                        "answered, by status code (from its own counts, written each second; "
                                        "they start again with a new process).", labels=["code"])
            for code, n in sorted(front.calls().items()):
                calls.add_metric([framing.status_code(code).name], n)
            yield calls
            cache = front.cache()
            hits = CounterMetricFamily("nameserver_grpc_front_cache_hits", "Calls the running Go gRPC front end "
                                       "answered from its reply cache, by method: they never reached a worker, so "
                                       "nameserver_grpc_handled does not count them ([node] grpc_front_cache_mb).",
                                       labels=["service", "method"])
            for full, n in sorted(cache.hits.items()):
                hits.add_metric(list(_split_method(full)), n)
            yield hits
            yield CounterMetricFamily("nameserver_grpc_front_cache_misses", "Calls of a reusable read the Go front "
                                      "end looked up in its reply cache and did not find.", value=cache.misses)
            yield GaugeMetricFamily("nameserver_grpc_front_cache_entries", "Replies the Go front end's cache "
                                    "holds now.", value=cache.entries)
            yield GaugeMetricFamily("nameserver_grpc_front_cache_bytes", "Bytes the Go front end's cache holds "
                                    "now (replies, trailers and keys).", value=cache.bytes)


class _NodeCollector(Collector):
    """Gauges read from the node at scrape time (this group's, with several groups)."""

    def __init__(self, metrics: NodeMetrics) -> None:
        self.m = metrics

    def describe(self) -> Iterable[Metric]:
        return []  # unchecked collector: names are only known by collecting

    def collect(self) -> Iterator[Metric]:
        m, node = self.m, self.m.node
        st = node.status()
        topics, live_brokers, broker_sets = node.inspect(lambda s: (
            s.topic_count(), len(s.registered_addrs()),
            [(name, found[0]) for name in s.controller_set_names() if (found := s.controller_set(name)) is not None]))

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, value=value)

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            return CounterMetricFamily(name, doc, value=value)

        info = GaugeMetricFamily("nameserver_node_info", "This node's identity (always 1).",
                                 labels=["node_id", "grpc_addr"])
        info.add_metric([st["node_id"], st["grpc_addr"]], 1)
        yield info
        yield gauge("nameserver_log_end_offset", "Last index in this node's Raft log.", st["end_offset"])
        yield gauge("nameserver_commit_offset", "Last index this node knows is replicated on a majority.",
                    st["commit_offset"])
        yield gauge("nameserver_apply_offset", "Last index applied to this node's state.", st["apply_offset"])
        yield gauge("nameserver_snapshot_offset", "Index of this node's newest snapshot (0: none yet).",
                    st["snapshot_offset"])
        lag = m.apply_lag_seconds()
        if lag is not None:
            yield gauge("nameserver_apply_lag_seconds", "Now minus the leader's wall clock when it proposed "
                        "the newest entry this node has applied.", lag)
        yield gauge("nameserver_raft_term", "Current Raft term as seen by this node.", st["term"])
        yield gauge("nameserver_is_leader", "1 if this node is the Raft leader, else 0.",
                    1 if st["role"] == Role.LEADER else 0)
        yield gauge("nameserver_has_quorum", "1 if this node hears from a majority (pysyncobj), else 0.",
                    1 if st["has_quorum"] else 0)
        yield gauge("nameserver_ready", "1 once this node has loaded its snapshot and replayed its log "
                    "(it serves reads), else 0.", 1 if st["ready"] else 0)
        yield gauge("nameserver_apply_stopped", "1 if this node's apply thread stopped on an error (see its "
                    "log and status), else 0.", 1 if st["apply_error"] else 0)
        stats = node.log.stats()
        yield gauge("nameserver_apply_queue_length", "Committed entries waiting for the apply thread.",
                    stats.apply_queue)
        yield counter("nameserver_leader_changes_seen", "Leader changes this node has seen (a new leader or "
                      "a new term with a leader), the first leader included.", m.leader_changes_seen)
        yield counter("nameserver_leadership_transitions", "Times this node became or stopped being the "
                      "leader.", node.log.leader_changes)
        yield counter("nameserver_entries_applied", "Log entries applied by this node since it started.",
                      m.entries_applied)
        records = CounterMetricFamily("nameserver_records_applied", "Records applied by this node since it "
                                      "started, by record type and operation.", labels=["type", "op"])
        for (rtype, op), n in sorted(dict(m.records_applied).items()):
            records.add_metric([rtype, op], n)
        yield records
        yield counter("nameserver_proposals", "Batches this node proposed as leader (group commit input).",
                      stats.batches_proposed)
        yield counter("nameserver_proposed_entries", "Log entries this node appended as leader (group commit "
                      "output).", stats.entries_proposed)
        yield counter("nameserver_read_index_lease", "Linearizable read indexes this leader answered under its "
                      "read lease, without a round trip (docs/architecture.md, linearizable reads); its worker "
                      "processes' reads under the lease read its lease page instead, uncounted here.",
                      stats.lease_reads)
        yield counter("nameserver_read_index_rounds", "Heartbeat rounds this leader ran to confirm its "
                      "leadership (reads without a lease, and lease renewals).", stats.read_rounds)
        yield counter("nameserver_read_index_asks", "Read indexes this follower asked of its leader over "
                      "the Raft link (one per round of waiting reads, one out at a time).", stats.read_asks)
        yield counter("nameserver_votes_refused_under_lease", "Vote requests this node refused because "
                      "it had promised a leader its lease.", stats.votes_refused)
        yield counter("nameserver_pre_vote_rounds", "Pre-vote rounds this node started (its election timer ran "
                      "out, or its leader's link went down).", stats.pre_vote_rounds)
        yield counter("nameserver_leader_links_lost", "Times this follower's Raft link to its leader went down "
                      "and brought its election timer forward (a leader process that exits closes its "
                      "links at once).", stats.leader_links_lost)
        guard = node.guard
        yield counter("nameserver_translations_unlocked", "Write translations (request -> records) made without "
                      "the state lock and not overtaken by an apply (nameserver/core/stateguard.py).",
                      guard.optimistic_reads)
        yield counter("nameserver_translations_overtaken", "Translation attempts dropped because an entry was "
                      "applied while they read; each is made again.", guard.optimistic_retries)
        yield counter("nameserver_translations_locked", "Translations that lost every race with apply and were "
                      "made under the state lock (apply and reads waited for them).", guard.locked_fallbacks)
        yield counter("nameserver_idle_noops", "Empty entries this node appended as an idle leader so apply "
                      "lag stays measurable.", m.idle_noops)
        if node.cfg.groups > 1:  # the leader-balancing duty runs only with several groups
            yield counter("nameserver_leader_balance_transfers", "Times this node's leader of the group handed "
                          "the leadership to the group's preferred member ([sharding] leader_balance_s).",
                          m.leader_balance_transfers)
        yield counter("nameserver_brokers_expired", "Broker addresses this node expired as leader (silent "
                      "past their timeout).", node.expired_total)
        yield gauge("nameserver_live_brokers", "Registered broker addresses (not yet expired or "
                    "unregistered).", live_brokers)
        yield gauge("nameserver_topics", "Topics with at least one queue.", topics)
        if node.cfg.group == GROUP0:  # a group k core serves no controller: no controller gauges
            yield from _controller_gauges(broker_sets, m.broker_alive, m.max_broker_sets)
        yield from _quota_gauges(node)
        if m.write_channel is not None:  # nameserver/api/writechannel.py: calls per frame is its batching
            yield counter("nameserver_write_channel_calls", "Writes the worker processes passed to this core "
                          "on the write channel.", m.write_channel.calls)
            yield counter("nameserver_write_channel_read_indexes", "Read indexes the worker processes asked "
                          "on the write channel for linearizable reads (one per round of reads).",
                          m.write_channel.read_indexes)
            yield counter("nameserver_write_channel_frames", "Frames those writes and asks came in (several "
                          "calls each when batched).", m.write_channel.frames)
            yield counter("nameserver_write_channel_cancels", "Calls on the write channel whose worker cancelled "
                          "them before the core answered (the client went away or its deadline passed).",
                          m.write_channel.cancels)
        yield gauge("nameserver_state_keys", "Keys in the replicated state.", st["keys"])
        routes = CounterMetricFamily("nameserver_route_reads", "Route reads this node answered, by whether the "
                                     "route was kept from an earlier read (hit) or computed (miss).",
                                     labels=["cache"])
        routes.add_metric(["hit"], node.routes.hits)
        routes.add_metric(["miss"], node.routes.misses)
        yield routes
        watches = getattr(node, "watches", None)
        if watches is not None:
            yield gauge("nameserver_watchers", "Open watch streams on this node.", len(watches))
            yield counter("nameserver_watchers_cut_off", "Watch streams cut off for falling behind.",
                          getattr(watches, "cut_off_total", 0))
        snap = _newest_snapshot_file(node.store.directory)
        if snap is not None:
            yield gauge("nameserver_snapshot_age_seconds", "Time since this node's newest snapshot file was "
                        "written.", max(0.0, m.clock() - snap.st_mtime))
            yield gauge("nameserver_snapshot_size_bytes", "Size of this node's newest snapshot file.",
                        snap.st_size)


# ---- gRPC interceptor --------------------------------------------------------------------------

def _split_method(full: str) -> tuple[str, str]:
    # "/rip18.nameserver.NameServer/GetRoute" -> ("rip18.nameserver.NameServer", "GetRoute")
    service, _, method = full.lstrip("/").rpartition("/")
    return service or "unknown", method or full


def _code_name(context: grpc.ServicerContext, failed: bool) -> str:
    try:
        code = context.code()  # type: ignore[attr-defined]  # grpc's real context has it; its stubs do not
        active = context.is_active()
    except Exception:
        code, active = None, True
    if isinstance(code, grpc.StatusCode):
        return code.name
    if not active:
        return "CANCELLED"  # the client cancelled or its deadline passed while we worked
    return "UNKNOWN" if failed else "OK"


class RpcMetricsInterceptor(grpc.ServerInterceptor):
    """Times every call and counts it by (service, method, type, status code)."""

    def __init__(self, metrics: RequestMetrics) -> None:
        self.m = metrics

    def intercept_service(self, continuation: Callable, handler_call_details: grpc.HandlerCallDetails
                          ) -> grpc.RpcMethodHandler | None:
        handler = continuation(handler_call_details)
        if handler is None:
            return None  # unknown method: gRPC answers UNIMPLEMENTED itself
        service, method = _split_method(handler_call_details.method)
        # counted when the call runs, not here: the handler this returns may serve many calls (the Go front
        # end's worker keeps it per method and metadata, nameserver/api/frontchannel.py)
        forwarded = any(k == headers.FORWARDED for k, _ in handler_call_details.invocation_metadata or ())
        return wrap_handler(handler, lambda behavior, kind: (
            self._stream if kind in STREAMING_RESPONSE else self._unary)(behavior, service, method, kind, forwarded))

    def _record(self, service: str, method: str, kind: str, code: str, t0: float) -> None:
        self.m.rpc_handled.labels(service, method, kind, code).inc()
        self.m.rpc_seconds.labels(service, method, kind).observe(time.perf_counter() - t0)

    def _unary(self, behavior: Callable, service: str, method: str, kind: str, forwarded: bool) -> Callable:
        def wrapped(request: Any, context: grpc.ServicerContext) -> Any:
            if forwarded:
                self.m.forwarded.labels(method).inc()
            t0 = CALL_RECEIVED.get() or time.perf_counter()
            failed = True
            try:
                response = behavior(request, context)
                failed = False
                return response
            finally:
                self._record(service, method, kind, _code_name(context, failed), t0)

        return wrapped

    def _stream(self, behavior: Callable, service: str, method: str, kind: str, forwarded: bool) -> Callable:
        def wrapped(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            if forwarded:
                self.m.forwarded.labels(method).inc()
            t0 = time.perf_counter()
            code = None
            try:
                yield from behavior(request, context)
            except GeneratorExit:
                code = "CANCELLED"  # the client went away before the stream ended
                raise
            except BaseException:
                code = _code_name(context, True)
                raise
            finally:
                self._record(service, method, kind, code or _code_name(context, False), t0)

        return wrapped


# ---- HTTP endpoint -----------------------------------------------------------------------------

def parse_listen(addr: str) -> tuple[str, int]:
    """"host:port", "[v6]:port" or ":port" (all interfaces) -> (host, port)."""
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"metrics listen address must be host:port, not {addr!r}")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass  # one line per scrape would drown the node's log


class MetricsEndpoint:
    """Serves a registry at http://addr/metrics. Binds in the constructor so a busy port fails early.

    At most `max_connections` scrapes are served at once (a thread each); more are closed at accept.
    A connection must send its request within `timeout_s`, so idle connections cannot pile up threads."""

    def __init__(self, registry: CollectorRegistry, addr: str, max_connections: int = 16,
                 timeout_s: float = 10.0) -> None:
        host, port = parse_listen(addr)
        slots = threading.BoundedSemaphore(max_connections)
        self.refused_total = 0
        endpoint = self

        class _Handler(_QuietHandler):
            timeout = timeout_s  # socket timeout for reading the request and writing the reply

        class _Server(ThreadingMixIn, WSGIServer):
            daemon_threads = True
            block_on_close = False
            request_queue_size = 128  # socketserver's 5 left a burst of scrapers waiting on SYN retries
            address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

            def process_request(self, request: Any, client_address: Any) -> None:
                if not slots.acquire(blocking=False):
                    endpoint.refused_total += 1
                    self.shutdown_request(request)
                    return
                try:
                    super().process_request(request, client_address)
                except Exception:
                    slots.release()
                    raise

            def process_request_thread(self, request: Any, client_address: Any) -> None:
                try:
                    super().process_request_thread(request, client_address)
                finally:
                    slots.release()

        try:
            self._httpd = make_server(host, port, make_wsgi_app(registry), _Server, handler_class=_Handler)
        except OSError as exc:
            raise OSError(f"cannot listen on {addr} for metrics: {exc}") from exc
        self.addr = addr
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="metrics-http", daemon=True)

    @property
    def port(self) -> int:
        return self._httpd.server_port

    def start(self) -> None:
        self._thread.start()
        log.info("serving Prometheus metrics on http://%s/metrics", self.addr)

    def stop(self) -> None:
        if self._thread.is_alive():
            self._httpd.shutdown()
            self._thread.join(timeout=5)
        self._httpd.server_close()


# ---- background helpers ------------------------------------------------------------------------

class LeaderWatch:
    """Logs one line per leader change this node sees, and counts them (etcd's leader_changes_seen).

    It listens to the log's leader stream (ReplicatedLog.watch_leader), which carries every change
    of leader or term this node sees, its own role's and the followers' alike: a new term with a
    known leader is one change.
    """

    def __init__(self, rlog: ReplicatedLog, metrics: NodeMetrics | None = None) -> None:
        self.log = rlog
        self.metrics = metrics
        self.self_id = rlog.cfg.self_addr
        self._seen: tuple[str, int] | None = None
        self._subscription: Subscription | None = None

    def start(self) -> None:
        self._subscription = self.log.watch_leader(self.observe)

    def stop(self) -> None:
        if self._subscription is not None:
            self._subscription.close()

    def observe(self, view: LeaderView) -> bool:
        """One view of the stream; True when it shows a new leader."""
        leader, term = view.leader, view.term
        if not leader or (self._seen is not None and (leader, term) == self._seen):
            return False  # the stream is in order, so a term never goes back
        previous = self._seen[0] if self._seen else ""
        self._seen = (leader, term)
        if self.metrics is not None:
            self.metrics.leader_changes_seen += 1
        log.info("leader is now %s at term %d (was %s)", leader, term, previous or "unknown",
                 extra={"event": "leader_change", "leader": leader, "term": term, "previous_leader": previous,
                        "self_is_leader": leader == self.self_id})
        return True
