"""A group core: `python -m nameserver.groupcore --group K --core-pid P`, started and watched by its node's
core (group 0's: nameserver/ops/workers.py, group_cores_of), which writes the node's configuration to its
stdin as it does a worker's (docs/scaling.md, "Sharding", Step 2).

It is the node's core (nameserver/server.py) run with config.group_config(cfg, K): group K's Raft (every
member's raft_addr port + K x sharding.raft_port_step), its data under data_dir/g<K>/, and only private
sockets there (gRPC, the write channel, remoting), which the node's workers reach; no public, metrics or
controller port and no workers of its own (its metrics, when the node's are on, are read by group 0's core
on a private socket: nameserver/ops/groupmetrics.py). A call it forwards to its group's leader goes to that
node's public gRPC address marked with its group (headers.GROUP), which the workers there pass to their
group K core. It follows group 0's core in a read replica: a registration reads group 0's settings and
order-topic KV from it. It stops at SIGTERM, at the end of its stdin (the core is gone), and the kernel
kills it when the core dies.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys

from nameserver.config import group_config
from nameserver.groups.follow import Group0View, follow_core
from nameserver.ops import groupmetrics, logfmt, stopsignal
from nameserver.ops.childproc import started, stop_with_core
from nameserver.ops.groupmetrics import MetricsSocket
from nameserver.ops.workers import WorkerSpec
from nameserver.remoting.corechannel import CoreHandlers
from nameserver.server import Server
from raftlog.journal import JournalCorrupt

log = logging.getLogger("nameserver.groupcore")
WORKERS_CHECK_S = 1.0  # how soon brokers connected through a worker that died are released here


def release_dead_workers(channel: CoreHandlers) -> None:
    """The node's workers are group 0's core's children, which tells its own channel when one dies
    (ops/workers.py, on_exit); a group core finds out itself: a worker whose clients it holds no longer
    exists. Each broker connection that worker held is then closed here too (the group's leader expires
    those brokers, as RocketMQ unregisters a broker whose channel closed)."""
    for pid in channel.worker_pids():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            log.info("worker pid %d is gone: the broker connections it held are closed in this group", pid)
            channel.worker_gone(pid)
        except PermissionError:  # another user's process took the pid: ours is gone
            channel.worker_gone(pid)


def main(argv: list[str] | None = None) -> int:
    group, spec = started("nameserver.groupcore", "A node's core of Raft group K.", "--group", argv)
    assert isinstance(spec, WorkerSpec)
    cfg = group_config(spec.cfg, group)
    logfmt.configure(spec.log_format, spec.log_level, {"node": cfg.raft_addr, "group": group})
    stopped = stopsignal.stop_event()
    stop_with_core(stopped)
    faulthandler.register(signal.SIGUSR2, all_threads=True)
    try:  # with the node's metrics on, this group's are kept and read by group 0's core's /metrics
        server = Server(cfg, spec.log_format, spec.log_level, metrics=bool(spec.cfg.metrics_addr))
    except JournalCorrupt as exc:  # as `nameserver serve`: never serve from a log with a hole in it
        log.critical("refusing to start group %d: %s", group, exc)
        return 3
    metrics = (MetricsSocket(server.metrics.group_registry, groupmetrics.socket_path(cfg.data_dir))
               if server.metrics is not None else None)
    group0 = follow_core(spec.cfg, 0, name=f"group-{group}-follows-0")
    group0.start()
    server.node.group0 = Group0View(group0)
    server.start()
    if metrics is not None:
        metrics.start()
    channel = server.core_channel
    while not stopped.wait(WORKERS_CHECK_S):  # timed: the main thread runs the stop signal's handler
        if channel is not None:
            release_dead_workers(channel)
    log.info("stopping group %d of %s", group, spec.cfg.raft_addr)
    if metrics is not None:
        metrics.stop()
    server.stop()
    group0.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
