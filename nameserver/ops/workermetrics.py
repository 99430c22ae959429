"""The worker processes' share of their node's /metrics (docs/operations.md, "Worker processes' metrics").

A worker counts the requests it answers (nameserver/ops/metrics.py, RequestMetrics) with
prometheus_client's multiprocess mode: the core starts it with PROMETHEUS_MULTIPROC_DIR set to
`<data_dir>/channel/metrics` (made fresh, 0700, by the core), so every counter and histogram value the
worker keeps is a slot in a memory-mapped file of that directory, written as it counts, named by the
worker's pid. The core's /metrics (WorkerSums) adds, sample by sample, its own request counters, what
the live workers' files hold and what the dead workers' files held: when a worker exits, the supervisor
tells the core, which adds its files' counts to a total kept in memory and deletes them, so a sum never
goes backwards and the directory holds the live workers' files only. The files of a worker killed with
SIGKILL hold every count it made (the kernel keeps a shared mapping's pages).

A gauge a sum would falsify (each worker's replica offset, its connections) is set by the worker about
once a second and shown per worker, labelled `worker` (its index, as in the supervisor's log lines).
"""

from __future__ import annotations

import glob
import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from nameserver.config import NodeConfig

log = logging.getLogger("nameserver.ops.workermetrics")

ENV = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client reads it when imported: set in the worker's environment
DIR_NAME = os.path.join("channel", "metrics")
GAUGES_EVERY_S = 1.0

SampleKey = tuple[str, tuple[tuple[str, str], ...]]  # (sample name, sorted labels)


def metrics_dir(cfg: NodeConfig) -> str:
    return os.path.join(cfg.data_dir, DIR_NAME)


def prepare_dir(cfg: NodeConfig) -> str:
    """The workers' metric files' directory, 0700 and empty: a previous core's workers counted for that
    core (a node's counters start again with its core, as its own do)."""
    path = metrics_dir(cfg)
    os.makedirs(path, mode=0o700, exist_ok=True)
    os.chmod(os.path.dirname(path), 0o700)
    os.chmod(path, 0o700)
    for name in glob.glob(os.path.join(path, "*.db")):
        os.unlink(name)
    return path


def _pid_of(path: str) -> str:
    return os.path.basename(path).rsplit("_", 1)[-1].removesuffix(".db")  # counter_<pid>.db, gauge_max_<pid>.db


class _Family:
    def __init__(self, metric: Metric) -> None:
        self.name, self.documentation, self.type = metric.name, metric.documentation, metric.type
        self.values: dict[SampleKey, float] = {}

    def add(self, metric: Metric) -> None:
        for s in metric.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            # a gauge is one worker's (its `worker` label), anything else a count to add up
            self.values[key] = s.value if self.type == "gauge" else self.values.get(key, 0.0) + s.value

    def metric(self) -> Metric:
        out = Metric(self.name, self.documentation, self.type)
        for (name, labels), value in self.values.items():
            out.add_sample(name, dict(labels), value)
        return out


def _sum_into(families: dict[str, _Family], metrics: Iterable[Metric]) -> None:
    for m in metrics:
        family = families.get(m.name)
        if family is None:
            family = families[m.name] = _Family(m)
        family.add(m)


def _read(files: Iterable[str]) -> Iterator[Metric]:
    """The files' metrics, histograms' buckets cumulative; a file being created meanwhile is left for the
    next scrape (it holds no count yet)."""
    for path in files:
        try:
            yield from MultiProcessCollector.merge([path], accumulate=True)
        except (OSError, ValueError) as exc:
            log.debug("worker metric file %s not read: %s", path, exc)


class WorkerSums(Collector):
    """The core's request counters (`own`) plus its workers' (nameserver/ops/workermetrics.py), one
    family per name: counters and histograms summed, worker gauges labelled per worker."""

    def __init__(self, own: CollectorRegistry) -> None:
        self.own = own
        self.directory: str | None = None  # set when the node has worker processes
        self._retired: dict[str, _Family] = {}  # what workers that exited had counted
        self._lock = threading.Lock()  # a retirement is never seen half done by a scrape

    def describe(self) -> Iterable[Metric]:
        return []  # unchecked collector: the workers' names are known by collecting

    def retire(self, pid: int) -> None:
        """Worker `pid` exited: its counts are kept, its files (and gauges) go."""
        if self.directory is None:
            return
        with self._lock:
            files = [f for f in glob.glob(os.path.join(self.directory, "*.db")) if _pid_of(f) == str(pid)]
            _sum_into(self._retired, (m for m in _read(files) if m.type != "gauge"))
            for f in files:
                try:
                    os.unlink(f)
                except OSError as exc:
                    log.warning("worker metric file %s not removed: %s", f, exc)

    def collect(self) -> Iterator[Metric]:
        families: dict[str, _Family] = {}
        _sum_into(families, self.own.collect())
        with self._lock:
            _sum_into(families, (f.metric() for f in self._retired.values()))
            if self.directory is not None:
                _sum_into(families, _read(sorted(glob.glob(os.path.join(self.directory, "*.db")))))
        for family in families.values():
            yield family.metric()


class WorkerGauges:
    """A worker's own gauges, in its metric files ('max' over pids: one pid per `worker` label), and the
    count of watchers it cut off."""

    def __init__(self, index: int, registry: CollectorRegistry) -> None:
        self.worker = str(index)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, ["worker"], multiprocess_mode="max", registry=registry)

        self.replica_offset = gauge("nameserver_worker_replica_offset", "Last index applied to this worker "
                                    "process's read replica (the core's: nameserver_apply_offset).")
        self.connections = gauge("nameserver_worker_remoting_connections", "Remoting client connections this "
                                 "worker process holds open.")
        self.reply_bytes = gauge("nameserver_worker_remoting_reply_bytes_held", "Reply bytes this worker "
                                 "process holds reserved or unsent ([limits] remoting_max_unsent_bytes, per "
                                 "process).")
        self.watchers = gauge("nameserver_worker_watchers", "Open watch streams this worker process serves "
                              "from its replica ([grpc] max_watchers, per process).")
        # a count: summed over the workers, those that exited too (the core's own: nameserver_watchers_cut_off)
        self.watchers_cut_off = Counter("nameserver_worker_watchers_cut_off", "Watch streams the worker processes "
                                        "cut off (fell behind, or the replica loaded a snapshot).", registry=registry)
        self.unchanged = Counter("nameserver_worker_unchanged_registrations", "Broker registrations the worker "
                                 "processes answered from their replicas as unchanged (the core told by a note).",
                                 registry=registry)
        self.stale_notes = Counter("nameserver_worker_unchanged_registrations_passed_on", "Registrations a worker "
                                   "found unchanged but its core did not hold so (a replica behind): passed on whole.",
                                   registry=registry)

    def keep_set(self, stopped: threading.Event,
                 read: Callable[[], tuple[int, int, int, int, tuple[int, int, int]]]) -> None:
        """Sets (replica offset, connections, reply bytes, watchers, (watchers cut off, unchanged
        registrations, those passed on)) from `read()` about once a second until `stopped`."""
        counters = (self.watchers_cut_off, self.unchanged, self.stale_notes)

        def run() -> None:
            counted = (0, 0, 0)
            while True:
                offset, connections, reply_bytes, watchers, totals = read()
                self.replica_offset.labels(self.worker).set(offset)
                self.connections.labels(self.worker).set(connections)
                self.reply_bytes.labels(self.worker).set(reply_bytes)
                self.watchers.labels(self.worker).set(watchers)
                for counter, total, before in zip(counters, totals, counted, strict=True):
                    counter.inc(total - before)
                counted = totals
                if stopped.wait(GAUGES_EVERY_S):
                    return

        threading.Thread(target=run, name="worker-gauges", daemon=True).start()
