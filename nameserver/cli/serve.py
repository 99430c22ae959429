"""`nameserver serve --config node.toml`: run one node in the foreground.
`nameserver replica --config replica.toml`: run a read replica of a cluster (its [replica] follow)."""

from __future__ import annotations

import argparse
import faulthandler
import logging
import signal
import sys

from nameserver import config, worker
from nameserver.ops import logfmt, stopsignal
from nameserver.server import Server
from raftlog.journal import JournalCorrupt


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="nameserver", description="Run a RIP-18 nameserver node.")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="run a node")
    s.add_argument("--config", help="node TOML file")
    s.add_argument("--raft-addr")
    s.add_argument("--grpc-addr")
    s.add_argument("--data-dir")
    s.add_argument("--default-timeout-ms", type=int, help="broker heartbeat timeout (RocketMQ: 120000)")
    s.add_argument("--scan-interval-ms", type=int, help="expiry scan interval")
    s.add_argument("--snapshot-every-entries", type=int)
    s.add_argument("--log-level", default="INFO")
    s.add_argument("--log-format", choices=logfmt.FORMATS,
                   help="text (default) or json: one object per line; overrides [log] format")
    s.add_argument("--metrics-addr", help="Prometheus /metrics listener host:port; overrides [metrics] listen")
    r = sub.add_parser("replica", help="run a read replica: non-voting, follows the voters of [replica] follow")
    r.add_argument("--config", required=True, help="the replica's TOML file (a [replica] section, a node's [grpc], "
                   "[remoting], [tls], [auth], [limits])")
    r.add_argument("--log-level", default="INFO")
    r.add_argument("--log-format", choices=logfmt.FORMATS, help="text (default) or json")
    args = p.parse_args(argv)
    if args.cmd == "replica":
        return _replica(args)
    log_format = args.log_format or logfmt.format_from_config(args.config) or "text"
    if log_format not in logfmt.FORMATS:
        print(f"nameserver: config error: log.format must be one of {', '.join(logfmt.FORMATS)}", file=sys.stderr)
        return 2
    log_handler = logfmt.configure(log_format, args.log_level)
    try:
        cfg = config.load(args.config, {
            "raft_addr": args.raft_addr, "grpc_addr": args.grpc_addr, "data_dir": args.data_dir,
            "default_timeout_ms": args.default_timeout_ms, "scan_interval_ms": args.scan_interval_ms,
            "snapshot_every_entries": args.snapshot_every_entries, "metrics_addr": args.metrics_addr,
        })
    except config.ConfigError as exc:
        print(f"nameserver: config error: {exc}", file=sys.stderr)
        return 2
    if cfg.replica_follow:
        print("nameserver: config error: replica.follow: this is a read replica's config: run "
              "`nameserver replica --config` with it", file=sys.stderr)
        return 2
    log_handler.setFormatter(logfmt.make_formatter(log_format, {"node": cfg.raft_addr}))  # JSON lines name the node
    try:
        server = Server(cfg, log_format, args.log_level)
    except JournalCorrupt as exc:
        # acknowledged entries are unreadable: never serve from a log with a hole in it
        logging.getLogger("nameserver").critical("refusing to start: %s", exc)
        print(f"nameserver: refusing to start: {exc}", file=sys.stderr)
        return 3
    except OSError as exc:
        print(f"nameserver: {exc}", file=sys.stderr)
        return 1
    stopped = stopsignal.stop_event()
    # `kill -USR2 <pid>` writes every thread's stack to the node's log (stderr): what a wedged node waits on
    faulthandler.register(signal.SIGUSR2, all_threads=True)
    server.start()
    stopsignal.wait_until_set(stopped)  # never an untimed wait: see nameserver/ops/stopsignal.py
    logging.getLogger("nameserver").info("stopping %s", cfg.raft_addr)
    server.stop()
    return 0


def _replica(args: argparse.Namespace) -> int:
    log_format = args.log_format or logfmt.format_from_config(args.config) or "text"
    log_handler = logfmt.configure(log_format, args.log_level)
    try:
        cfg = config.load(args.config)
    except config.ConfigError as exc:
        print(f"nameserver: config error: {exc}", file=sys.stderr)
        return 2
    if not cfg.replica_follow:
        print("nameserver: config error: replica.follow is required: the voters' gRPC addresses", file=sys.stderr)
        return 2
    log_handler.setFormatter(logfmt.make_formatter(log_format, {"replica": cfg.grpc_addr}))
    faulthandler.register(signal.SIGUSR2, all_threads=True)
    try:
        return worker.serve_remote(cfg)
    except OSError as exc:
        print(f"nameserver: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
