"""`watch`: the continuous audit. It follows a directory of log segments as they are cut (a node's
[archive] directory, or the target of repeated `nsctl log export` runs) and audits every new cut
against the live nodes, with the result as Prometheus metrics.

    python -m pipeline watch --log ARCHIVE --endpoints a:9101,b:9101,c:9101 --work DIR \\
        [--interval 15] [--metrics 127.0.0.1:9464]

A cut is the end N of the log's contiguous coverage. For each new cut:
1. the state at N is the previous cut's state plus the log after it (compact.Base), so a cut costs the
   new records and the state, not the whole log; it is kept in WORK/state-N, from which a restarted
   watcher resumes;
2. every node's digest at N (Log.DigestAt, a consistent cut however far the node has moved on) is compared
   with the state's digest. Not comparable (not applied yet, or older than the node's digest history) and
   unreachable are reported as such, never as divergence;
3. a node whose digest differs is asked for its whole state (Log.DumpState, into WORK/dumps/). Once the
   log covers the dump's offset, the dump is compared with the log's state there key by key, and the
   differing keys are named (printed, in WORK/audit.json and as a count per node).
With no new segment, the last cut is checked again, so a replica that diverges while the log is quiet
is still found (nodes remember their last 50,000 digests).

Metrics (scraped as job "pipeline-audit"; deploy/prometheus/alerts.yml alerts on them):
  pipeline_audit_cut_offset, pipeline_audit_cut_keys, pipeline_audit_cut_duration_seconds,
  pipeline_audit_last_cut_timestamp_seconds, pipeline_audit_cuts_total{result},
  pipeline_audit_errors_total, pipeline_audit_replica_diverged{node}, pipeline_audit_replica_comparable{node},
  pipeline_audit_replica_differing_keys{node}
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server
from pyspark.sql import SparkSession

from nameserver.logformat.segments import merge, ranges_of
from pipeline.audit import Claim, NodeAccess, Verdict, check_dump, fetch_dump, node_claims
from pipeline.compact import Base, state_at
from pipeline.logdf import PipelineError, load_log
from pipeline.session import list_names
from pipeline.sparkdigest import digest_of

STATE_PREFIX = "state-"
CUT_META = "_cut.json"


@dataclass
class WatchOptions:
    log: str
    endpoints: list[str]
    work: str                     # local directory: the last cut's state, dumps, audit.json
    interval_s: float = 15.0
    access: NodeAccess = field(default_factory=NodeAccess)


@dataclass
class NodeResult:
    node: str                      # the endpoint asked
    verdict: str                   # "matches", "DIFFERS", "not comparable: ...", "unreachable: ..."
    digest: str = ""
    differing_keys: int | None = None
    keys: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Cut:
    offset: int
    digest: str
    keys: int
    new: bool                      # a new cut (False: the last cut checked again)
    seconds: float
    nodes: list[NodeResult]

    @property
    def diverged(self) -> list[str]:
        return [n.node for n in self.nodes if n.verdict == "DIFFERS"]


class AuditMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.offset = Gauge("pipeline_audit_cut_offset", "The log offset of the last audited cut", registry=registry)
        self.keys = Gauge("pipeline_audit_cut_keys", "Live keys in the log's state at the last cut",
                          registry=registry)
        self.seconds = Gauge("pipeline_audit_cut_duration_seconds", "How long the last cut's audit took",
                             registry=registry)
        self.last = Gauge("pipeline_audit_last_cut_timestamp_seconds", "When the last cut was audited (unix time)",
                          registry=registry)
        self.cuts = Counter("pipeline_audit_cuts", "Cuts audited, by result (ok, divergence, not_comparable)",
                            ["result"], registry=registry)
        self.errors = Counter("pipeline_audit_errors", "Audit rounds that failed (the log or Spark)",
                              registry=registry)
        self.diverged = Gauge("pipeline_audit_replica_diverged",
                              "1 when the node's digest differed from the log's at the last comparable cut",
                              ["node"], registry=registry)
        self.comparable = Gauge("pipeline_audit_replica_comparable",
                                "1 when the node could be compared at the last cut", ["node"], registry=registry)
        self.differing = Gauge("pipeline_audit_replica_differing_keys",
                               "Keys of the node's state found to differ from the log's (from its dump)",
                               ["node"], registry=registry)
        for result in ("ok", "divergence", "not_comparable"):
            self.cuts.labels(result)

    def record(self, cut: Cut) -> None:
        self.offset.set(cut.offset)
        self.keys.set(cut.keys)
        self.seconds.set(cut.seconds)
        for n in cut.nodes:
            compared = n.verdict in ("matches", "DIFFERS")
            self.comparable.labels(n.node).set(1 if compared else 0)
            if compared:  # a node that cannot be compared keeps its last verdict
                self.diverged.labels(n.node).set(1 if n.verdict == "DIFFERS" else 0)
            if n.verdict == "matches":
                self.differing.labels(n.node).set(0)
            elif n.differing_keys is not None:
                self.differing.labels(n.node).set(n.differing_keys)
        if cut.diverged:
            self.cuts.labels("divergence").inc()
        elif any(n.verdict == "matches" for n in cut.nodes):
            self.cuts.labels("ok").inc()
        else:
            self.cuts.labels("not_comparable").inc()
        self.last.set(time.time())


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def contiguous_end(ranges: list[tuple[int, int]], start: int) -> int | None:
    """The last offset of the coverage that runs unbroken from `start` (None when `start` is not covered)."""
    for first, last in merge(ranges):
        if first <= start <= last:
            return last
    return None


class Watcher:
    def __init__(self, spark: SparkSession, opts: WatchOptions, registry: CollectorRegistry | None = None) -> None:
        self.spark = spark
        self.opts = opts
        self.registry = registry or CollectorRegistry()
        self.metrics = AuditMetrics(self.registry)
        os.makedirs(opts.work, exist_ok=True)
        self.base: Base | None = None
        self.base_digest = ""
        self.base_keys = 0
        self.pending: dict[str, Claim] = {}   # node -> its dump, waiting for the log to cover it
        self.named: dict[str, NodeResult] = {}  # node -> its dump's comparison, once done
        self._resume()

    # ---- the last cut on disk ------------------------------------------------------------------

    def _state_dir(self, offset: int) -> str:
        return os.path.join(self.opts.work, f"{STATE_PREFIX}{offset:020d}")

    def _resume(self) -> None:
        cuts = sorted(n for n in os.listdir(self.opts.work)
                      if n.startswith(STATE_PREFIX) and os.path.exists(os.path.join(self.opts.work, n, CUT_META)))
        if cuts:
            with open(os.path.join(self.opts.work, cuts[-1], CUT_META)) as f:
                meta = json.load(f)
            self.base = Base(int(meta["offset"]), self.spark.read.parquet(os.path.join(self.opts.work, cuts[-1])))
            self.base_digest = str(meta["digest"])
            self.base_keys = int(meta["keys"])

    def _keep(self, offset: int, state: Any) -> tuple[str, int]:
        """Write the cut's state, then drop older ones; (digest, keys) of the state."""
        path = self._state_dir(offset)
        state.write.mode("overwrite").parquet(path)
        kept = self.spark.read.parquet(path)
        digest, keys = digest_of(kept)
        with open(os.path.join(path, CUT_META), "w") as f:
            json.dump({"offset": offset, "digest": digest, "keys": keys}, f)
        for name in os.listdir(self.opts.work):
            if name.startswith(STATE_PREFIX) and name != os.path.basename(path):
                shutil.rmtree(os.path.join(self.opts.work, name), ignore_errors=True)
        self.base, self.base_digest, self.base_keys = Base(offset, kept), digest, keys
        return digest, keys

    # ---- one round -----------------------------------------------------------------------------

    def step(self) -> Cut:
        t0 = time.monotonic()
        start = self.base.offset + 1 if self.base else 1
        names = list_names(self.spark, self.opts.log)
        end = contiguous_end(ranges_of(names), start)
        if end is None and self.base is None:
            raise PipelineError(f"{self.opts.log} does not cover offset 1 yet: nothing to audit")
        log = load_log(self.spark, self.opts.log) if end is not None else None
        if log is not None and end is not None:
            self._name_keys(log, end)  # dumps the log now covers, compared from the previous cut on
            state, _ = state_at(self.spark, log, end, self.base)
            self._keep(end, state)
        assert self.base is not None
        new = end is not None
        nodes = [self._ask(endpoint, self.base.offset) for endpoint in self.opts.endpoints]
        for n in nodes:
            if n.verdict == "DIFFERS" and n.node not in self.pending and n.node not in self.named:
                self._fetch(n.node)
            if n.node in self.named:
                done = self.named[n.node]
                n.differing_keys, n.keys = done.differing_keys, done.keys
        cut = Cut(self.base.offset, self.base_digest, self.base_keys, new, round(time.monotonic() - t0, 3), nodes)
        self.metrics.record(cut)
        with open(os.path.join(self.opts.work, "audit.json"), "w") as f:
            json.dump({**asdict(cut), "diverged": cut.diverged, "log": self.opts.log}, f, indent=1)
        return cut

    def _ask(self, node: str, offset: int) -> NodeResult:
        claims, unanswered = node_claims([node], offset, self.opts.access)
        if not claims:
            return NodeResult(node, unanswered[0].note)
        digest = claims[0].digest
        if digest != self.base_digest:
            return NodeResult(node, "DIFFERS", digest)
        self.named.pop(node, None)  # healthy (again): a later divergence gets a fresh dump
        self.pending.pop(node, None)
        return NodeResult(node, "matches", digest)

    def _fetch(self, node: str) -> None:
        out = os.path.join(self.opts.work, "dumps", f"{_safe(node)}-{int(time.time() * 1000)}")
        try:
            self.pending[node] = fetch_dump(node, out, self.opts.access)
        except Exception as exc:  # the node went away meanwhile: try again at the next cut
            shutil.rmtree(out, ignore_errors=True)
            print(f"watch: could not dump {node}: {exc}", flush=True)

    def _name_keys(self, log: Any, end: int) -> None:
        for node, claim in list(self.pending.items()):
            if claim.offset > end:
                continue
            base = self.base if self.base is not None and self.base.offset <= claim.offset else None
            state, _ = state_at(self.spark, log, claim.offset, base)
            verdict = Verdict(claim.source, claim.offset, claim.digest)
            check_dump(self.spark, verdict, state, claim.dump or "", None)
            self.named[node] = NodeResult(node, "DIFFERS", claim.digest, verdict.differing_keys, verdict.keys)
            del self.pending[node]

    def run(self, stop: threading.Event, rounds: int | None = None) -> None:
        done = 0
        while not stop.is_set() and (rounds is None or done < rounds):
            try:
                print(render_cut(self.step()), flush=True)
            except Exception as exc:
                self.metrics.errors.inc()
                print(f"watch: audit round failed: {exc}", flush=True)
                if not isinstance(exc, PipelineError):
                    traceback.print_exc()
            done += 1
            stop.wait(self.opts.interval_s)


def render_cut(cut: Cut) -> str:
    head = "DIVERGENCE" if cut.diverged else "ok"
    lines = [f"{time.strftime('%H:%M:%S')} cut {cut.offset} ({'new' if cut.new else 'again'}, {cut.keys} keys, "
             f"digest {cut.digest}, {cut.seconds:.1f}s): {head}"]
    for n in cut.nodes:
        lines.append(f"  {n.node}: {n.verdict}" + (f", {n.differing_keys} key(s) differ" if n.differing_keys else ""))
        for k in n.keys:
            lines.append(f"    {k['key']}  {k['kind']}  (log version {k['log_version']}, "
                         f"node version {k['node_version']})")
    return "\n".join(lines)


def serve_metrics(registry: CollectorRegistry, listen: str) -> Any:
    host, port = listen.rsplit(":", 1)
    server, _ = start_http_server(int(port), addr=host or "127.0.0.1", registry=registry)
    return server
