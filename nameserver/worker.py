"""A worker process: `python -m nameserver.worker --index I --core-pid P`, started by its node's
core (nameserver/ops/workers.py), which writes the node's configuration to its stdin.

It follows the core's state in a read replica (nameserver/replica), and once the replica is ready it
binds the node's [grpc] address with the other workers and its [remoting] address beside the core
(SO_REUSEPORT: the kernel spreads new connections over the processes). The eventual reads (gRPC:
corelink.REPLICA_METHODS; remoting: the codes REQUESTS marks `replica`) are answered here by the same
service and handler code the core runs, over the replica; every other call or frame goes to the core over
its private sockets (nameserver/api/corelink.py, nameserver/remoting/corechannel.py). It stops at
SIGTERM, at the end of its stdin (the core is gone), and the kernel kills it when the core dies.
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import pickle
import signal
import sys
import threading

import grpc
from prometheus_client import CollectorRegistry

from nameserver.api import corelink, grpcserver, writechannel
from nameserver.api.service import NameServerService
from nameserver.api.writechannel import WriteChannel
from nameserver.ops import fdlimits, logfmt, stopsignal, workermetrics
from nameserver.ops.metrics import RequestMetrics
from nameserver.ops.workers import WorkerSpec, process_share
from nameserver.pb import api_pb2
from nameserver.remoting import RemotingServer, codes, frame
from nameserver.remoting.command import Command
from nameserver.remoting.corechannel import CoreChannel, socket_path
from nameserver.remoting.handlers import BIG_REGISTRATION_TIMEOUT_S
from nameserver.replica import ReadReplica, ReplicaNode

log = logging.getLogger("nameserver.worker")

PR_SET_PDEATHSIG = 1
READY_POLL_S = 0.05


def die_with(core_pid: int) -> None:
    """Have the kernel kill this process when the core dies; exit now if it already has."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the end of stdin still stops it
        pass
    if os.getppid() != core_pid:
        sys.exit(0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="nameserver.worker", description="A node's remoting worker process.")
    p.add_argument("--index", type=int, required=True)
    p.add_argument("--core-pid", type=int, required=True)
    args = p.parse_args(argv)
    die_with(args.core_pid)
    spec: WorkerSpec = pickle.load(sys.stdin.buffer)  # from the core, over the pipe only it holds
    cfg = spec.cfg
    logfmt.configure(spec.log_format, spec.log_level, {"node": cfg.raft_addr, "worker": args.index})
    stopped = stopsignal.stop_event()
    threading.Thread(target=_until_eof, args=(stopped,), name="core-pipe", daemon=True).start()

    share = process_share(cfg)
    budget = fdlimits.budget(share, fdlimits.raise_nofile())
    opts = [("grpc.max_receive_message_length", cfg.max_message_bytes),
            ("grpc.max_send_message_length", cfg.max_message_bytes)]
    own = corelink.own_channel(cfg, opts)  # this worker's own calls: read indexes
    replica = ReadReplica(corelink.target(cfg), lambda target: corelink.own_channel(cfg, opts),
                          name=f"worker-{args.index}")
    replica.start()
    # Not on the ports before the replica can answer: a starting worker never refuses a read.
    while not replica.ready and not stopped.wait(READY_POLL_S):
        pass
    remoting, grpc_server = None, None
    # its requests counted in files the core's /metrics adds up (nameserver/ops/workermetrics.py)
    counted = bool(cfg.metrics_addr and os.environ.get(workermetrics.ENV))
    registry = CollectorRegistry()
    requests = RequestMetrics(registry) if counted else None
    if not stopped.is_set():
        # ReplicaNode has the node's read API, which is all the replica methods and codes use
        node = ReplicaNode(replica, cfg, read_index=corelink.core_read_index(own))
        service = NameServerService(node)  # type: ignore[arg-type]
        # gRPC: the replica's reads here, every other call to the core's private socket as bytes
        grpc_server = grpcserver.new_server(share, budget.grpc, reuse_port=True,
                                            metrics=requests.interceptor() if requests is not None else None)
        writes = WriteChannel(writechannel.socket_path(cfg.data_dir), cfg.max_message_bytes)
        grpc_server.add_generic_rpc_handlers((corelink.CoreForwarder(
            grpc.insecure_channel(corelink.target(cfg), options=opts), corelink.local_handlers(service),
            replica.wait_applied, writes),))
        grpcserver.listen_public(grpc_server, cfg)
        grpc_server.start()
        if cfg.remoting_addr:
            timeout = max(BIG_REGISTRATION_TIMEOUT_S, cfg.write_timeout_ms / 1000, cfg.max_wait_ms / 1000) + 5
            front = CoreChannel(socket_path(cfg), lambda: replica.offset, timeout)
            remoting = RemotingServer(share, service, max_connections=budget.remoting, reuse_port=True, front=front,
                                      observer=requests.observe_remoting if requests is not None else None)
            warm_up(remoting, node, spec.reply_sizes)
            remoting.start()
        if counted:
            held = remoting
            workermetrics.WorkerGauges(args.index, registry).keep_set(stopped, lambda: (
                replica.offset, held.connections if held else 0, held.budget.held if held else 0))
        log.info("worker %d (pid %d) serving gRPC on %s%s at offset %d", args.index, os.getpid(), cfg.grpc_addr,
                 f" and remoting on {cfg.remoting_addr}" if cfg.remoting_addr else "", replica.offset)
        stopsignal.wait_until_set(stopped)
    if remoting is not None:
        remoting.stop()
    if grpc_server is not None:
        grpc_server.stop(1.0).wait()
    replica.stop()
    own.close()
    return 0


def warm_up(server: RemotingServer, node: ReplicaNode, reply_sizes: dict[int, int]) -> None:
    """Before the port: the reply budget starts from the core's reply sizes, and one route read runs here
    (this interpreter's first is slow: imports, caches), its size learned. Without it a burst of fresh
    connections each reserved a connection's whole share for the code's first reply: SYSTEM_BUSY."""
    for code, size in reply_sizes.items():
        server.budget.learn(code, size)
    topics = node.inspect(lambda s: s.topic_list(api_pb2.TOPIC_LIST_ALL))
    req = Command(code=codes.GET_ROUTEINFO_BY_TOPIC, ext_fields={"topic": topics[0] if topics else "-"})
    resp = server.handlers.handle(req)
    if resp.code == codes.SUCCESS:
        server.budget.learn(req.code, len(frame.encode(resp)))


def _until_eof(stopped: threading.Event) -> None:
    try:
        while sys.stdin.buffer.read(4096):
            pass
    except OSError:
        pass
    stopped.set()


if __name__ == "__main__":
    sys.exit(main())
