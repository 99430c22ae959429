"""`python -m pipeline JOB ...` (or `spark-submit pipeline/__main__.py JOB ...`).

Jobs: compact, audit, watch (the continuous audit), report (Spark); synth (write a synthetic log);
bench (the 10M-record measurement); standalone (start/stop a Spark standalone cluster here); zip
(package the pipeline for spark-submit --py-files). Exit 0 on success, 1 when an audit finds a
divergence, 2 on bad input.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from typing import Any


def _spark_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--master", default=None,
                   help="Spark master (default local[*]; under spark-submit, spark-submit's)")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="Spark setting (repeatable)")
    p.add_argument("--driver-memory", default=None, help="e.g. 4g (embedded Spark: the whole job's memory)")
    p.add_argument("--executor-python", default=None,
                   help="the Python executors run on a cluster master (default: PYSPARK_PYTHON, else python3)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def _access_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tls-ca", default=None, help="CA certificate (PEM) of nodes serving TLS")
    p.add_argument("--tls-cert", default=None, help="client certificate (PEM) for mutual TLS")
    p.add_argument("--tls-key", default=None, help="its private key (PEM)")
    p.add_argument("--token-file", default=None, help="file holding a bearer token (env NSCTL_TOKEN too)")


def _access(args: argparse.Namespace) -> Any:
    from pipeline.audit import NodeAccess

    token = os.environ.get("NSCTL_TOKEN") or None
    if args.token_file:
        with open(args.token_file) as f:
            token = f.read().strip() or None
    return NodeAccess(args.tls_ca, args.tls_cert, args.tls_key, token)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m pipeline", description=__doc__.split("\n\n")[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="job", required=True, metavar="JOB")

    p = sub.add_parser("compact", help="the state as of an offset, as a Parquet table, with its digest")
    p.add_argument("--log", required=True, help="directory (any Hadoop URI) of exported log segments")
    p.add_argument("--at", type=int, default=None, help="offset (default: the last the log covers)")
    p.add_argument("--out", default=None, help="write the state table here (with _compact.json)")
    p.add_argument("--overwrite", action="store_true")
    _spark_options(p)

    p = sub.add_parser("audit", help="the log's digest at an offset against what nodes and dumps report")
    p.add_argument("--log", required=True)
    p.add_argument("--at", type=int, default=None, help="only claims at this offset (default: each claim's own)")
    p.add_argument("--endpoints", default="", help="comma-separated node gRPC addresses to ask for Status")
    p.add_argument("--dump", action="append", default=[], help="a state dump directory (nsctl state dump)")
    p.add_argument("--claim", action="append", default=[], metavar="NAME=OFFSET:DIGEST",
                   help="a digest from elsewhere (a snapshot, a ticket)")
    p.add_argument("--out", default=None, help="write audit.json and the differing keys (Parquet) here")
    _access_options(p)
    _spark_options(p)

    p = sub.add_parser("watch", help="the continuous audit: follow a segment directory, audit each new cut, "
                                     "serve Prometheus metrics")
    p.add_argument("--log", required=True, help="the directory segments appear in ([archive] dir, or exports)")
    p.add_argument("--endpoints", required=True, help="comma-separated node gRPC addresses")
    p.add_argument("--work", required=True, help="local directory for the last cut's state, dumps, audit.json")
    p.add_argument("--interval", type=float, default=15.0, help="seconds between rounds")
    p.add_argument("--metrics", default="127.0.0.1:9464", help="serve /metrics here (HOST:PORT; '' for none)")
    p.add_argument("--rounds", type=int, default=None, help="stop after this many rounds (default: never)")
    _access_options(p)
    _spark_options(p)

    p = sub.add_parser("report", help="broker sessions, flapping, topic churn, volume; Parquet + HTML")
    p.add_argument("--log", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--flap-ends", type=int, default=3, help="session ends ...")
    p.add_argument("--flap-window-s", type=int, default=3600, help="... within this window mean flapping")
    p.add_argument("--top", type=int, default=20, help="rows in the top-N tables")
    _spark_options(p)

    p = sub.add_parser("synth", help="write a synthetic fleet log (segments) of at least --records records")
    p.add_argument("--out", required=True, help="local directory")
    p.add_argument("--records", type=int, default=100_000)
    p.add_argument("--clusters", type=int, default=3)
    p.add_argument("--groups-per-cluster", type=int, default=8)
    p.add_argument("--topics-per-group", type=int, default=40)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--rows-per-segment", type=int, default=500_000)

    p = sub.add_parser("bench", help="time compact/audit/report on Spark against the single-process replay")
    p.add_argument("--records", type=int, default=10_000_000)
    p.add_argument("--work", required=True, help="local work directory (the log is kept and reused)")
    p.add_argument("--jobs", default="compact,audit,report", help="which of walk,compact,audit,report to time")
    p.add_argument("--result", default=None, help="write the figures here (default WORK/bench.json)")
    _spark_options(p)

    p = sub.add_parser("scaling", help="time walk, compact and audit on local[1], local[2] and a standalone "
                                       "cluster of 1 and 2 workers, with peak memory")
    p.add_argument("--records", type=int, default=10_000_000)
    p.add_argument("--work", required=True, help="local work directory (the log is kept and reused)")
    p.add_argument("--configs", default="local[1],local[2],standalone:1,standalone:2")
    p.add_argument("--worker-memory", default="6g", help="per worker (its executor takes all but 1g)")
    p.add_argument("--driver-memory", default="8g", help="embedded Spark: the whole job's memory")

    p = sub.add_parser("standalone", help="start or stop a Spark standalone cluster (master + workers) here")
    p.add_argument("action", choices=("start", "stop", "status"))
    p.add_argument("--dir", default="build/spark", help="state, logs, work dirs and the executors' Python")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--cores", type=int, default=1, help="cores per worker")
    p.add_argument("--memory", default="1536m", help="memory per worker (executors take 1g by default)")
    p.add_argument("--port", type=int, default=7077, help="the master's port (spark://127.0.0.1:PORT)")
    p.add_argument("--executor-venv", default=None, help="where to make the executors' Python "
                                                           "(default DIR/executor-python)")

    p = sub.add_parser("zip", help="package the pipeline and its codec for spark-submit --py-files")
    p.add_argument("--out", default="build/pipeline.zip")
    return parser


def _conf(args: argparse.Namespace) -> dict[str, str]:
    conf = dict(c.split("=", 1) for c in args.conf)
    if args.driver_memory:
        conf["spark.driver.memory"] = args.driver_memory
    elif (args.master or "local").startswith("local") and "PYSPARK_GATEWAY_PORT" not in os.environ:
        conf.setdefault("spark.driver.memory", "4g")
    return conf


def _emit(args: argparse.Namespace, data: dict[str, Any], text: str) -> None:
    print(json.dumps(data, indent=1, default=str) if args.json else text)


def run(args: argparse.Namespace) -> int:
    if args.job == "synth":
        from pipeline.synth import FleetSpec, generate

        res = generate(args.out, FleetSpec(records=args.records, clusters=args.clusters,
                                           groups_per_cluster=args.groups_per_cluster,
                                           topics_per_group=args.topics_per_group, seed=args.seed,
                                           rows_per_segment=args.rows_per_segment))
        print(f"wrote {res.records:,} records in {res.entries:,} entries (offsets 1..{res.last_offset}, "
              f"{res.failed_batches} raced batches) as {res.segments} segment(s) in {res.out}")
        return 0
    if args.job == "standalone":
        return _standalone(args)
    if args.job == "scaling":
        from pipeline.scaling import run_scaling

        run_scaling(args.records, args.work, [c.strip() for c in args.configs.split(",") if c.strip()],
                    args.worker_memory, args.driver_memory)
        return 0
    if args.job == "zip":
        from pipeline.ship import make_zip

        print(make_zip(args.out))
        return 0
    from pipeline.session import spark_session

    if args.job == "bench":
        from pipeline.bench import run_bench

        jobs = tuple(j.strip() for j in args.jobs.split(",") if j.strip())
        run_bench(args.records, args.work, args.master or "local[*]", _conf(args), args.executor_python, jobs,
                  args.result)
        return 0
    spark = spark_session(args.master, f"rip18-{args.job}", _conf(args), args.executor_python)
    try:
        return _spark_job(spark, args)
    finally:
        spark.stop()


def _watch(spark: Any, args: argparse.Namespace) -> int:
    import threading

    from pipeline.logdf import PipelineError
    from pipeline.watch import Watcher, WatchOptions, serve_metrics

    endpoints = [e.strip() for e in args.endpoints.split(",") if e.strip()]
    if not endpoints:
        raise PipelineError("--endpoints: give at least one node address")
    watcher = Watcher(spark, WatchOptions(args.log, endpoints, args.work, args.interval, _access(args)))
    if args.metrics:
        serve_metrics(watcher.registry, args.metrics)
        print(f"metrics on http://{args.metrics}/metrics", flush=True)
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C ends the watch
        watcher.run(threading.Event(), args.rounds)
    return 0


def _standalone(args: argparse.Namespace) -> int:
    from pipeline import standalone

    if args.action == "start":
        try:
            c = standalone.start(args.dir, args.workers, args.cores, args.memory, args.port, venv=args.executor_venv)
        except standalone.StandaloneError as exc:
            print(f"pipeline: error: {exc}", file=sys.stderr)
            return 1
        print(f"{c.master_url} with {args.workers} worker(s) of {args.cores} core(s) (web UI {c.web_url})\n"
              f"run a job there: python -m pipeline compact --master {c.master_url} "
              f"--executor-python {c.executor_python} --log DIR")
        return 0
    if args.action == "stop":
        print("stopped" if standalone.stop(args.dir) else f"no cluster runs from {args.dir}")
        return 0
    loaded = standalone.load(args.dir)
    print(json.dumps(loaded.__dict__, indent=1) if loaded else f"no cluster runs from {args.dir}")
    return 0 if loaded else 1


def _spark_job(spark: Any, args: argparse.Namespace) -> int:
    if args.job == "compact":
        from pipeline.compact import run_compact

        c = run_compact(spark, args.log, args.at, args.out, args.overwrite)
        _emit(args, c.__dict__, f"state at offset {c.at}: {c.keys} keys, digest {c.digest} "
                                f"({c.failed_batches} batches failed their preconditions)"
              + (f"; written to {c.out}" if c.out else ""))
        return 0
    if args.job == "audit":
        from pipeline.audit import render, run_audit

        endpoints = [e.strip() for e in args.endpoints.split(",") if e.strip()]
        result = run_audit(spark, args.log, args.at, endpoints, args.dump, args.claim, args.out, _access(args))
        _emit(args, result.to_dict(), render(result))
        return 0 if result.ok else 1
    if args.job == "watch":
        return _watch(spark, args)
    from pipeline.report import ReportOptions, run_report

    out = run_report(spark, args.log, args.out, ReportOptions(args.flap_ends, args.flap_window_s, args.top))
    _emit(args, out, f"report: {out['html']} ({out['sessions']} broker sessions, "
                     f"{out['flapping_brokers']} flapping brokers; tables: {', '.join(out['tables'])})")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from pipeline.logdf import PipelineError

    try:
        return run(args)
    except PipelineError as exc:
        print(f"pipeline: error: {exc}", file=sys.stderr)
        return 2
