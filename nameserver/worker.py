"""A worker process: `python -m nameserver.worker --index I --core-pid P`, started by its node's core
(nameserver/ops/workers.py), which writes the node's configuration to its stdin.

It follows the core's state in a read replica (nameserver/replica; first loaded from the core's newest snapshot
file while the core loads it: nameserver/replica/seed.py), and once the replica is ready it binds the node's
[grpc] and [remoting] addresses with the other workers (SO_REUSEPORT: the kernel spreads new connections over the
workers; the core holds neither port). The core serves its Log.Follow only once it is ready, so a starting node's
ports refuse connections until then; a core whose apply stopped never is, and its workers then open the ports
anyway (Admin.Status, the core's, says why; reads are refused). Admin.Status and gRPC health are the core's (every
group core's on a sharded node) as the worker asks them, but for a core that stopped answering it, frozen or
stalled with its sockets open: not ready and NOT_SERVING once its feed has been silent past the replica's bound
(nameserver/api/corehealth.py). The eventual reads (gRPC: corelink.REPLICA_METHODS and Watch; remoting: the codes
REQUESTS marks `replica`) are answered here by the same service and handler code the core runs, over the replica;
every other call or frame goes to the core over its private sockets (nameserver/api/corelink.py,
nameserver/remoting/corechannel.py). It stops at SIGTERM, at the end of its stdin (the core is gone), and the
kernel kills it when the core dies.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import grpc
from grpc_health.v1 import health_pb2
from prometheus_client import CollectorRegistry

from nameserver import headers, tlsconf, validation
from nameserver.api import auth, corelink, frontchannel, grpcserver, writechannel
from nameserver.api.corehealth import CoreStatus
from nameserver.api.coreindex import CoreReadIndex
from nameserver.api.deadlines import DeadlineWatch
from nameserver.api.frontchannel import FrontServer, Generations, IndexFirst, Inline, Reusable, WriteFirst
from nameserver.api.rpc import call_timeout
from nameserver.api.service import NameServerService
from nameserver.api.writechannel import WriteChannel
from nameserver.config import NodeConfig
from nameserver.core import watch
from nameserver.errors import ValidationError
from nameserver.groups.follow import follow_core
from nameserver.groups.links import GroupLinks
from nameserver.groups.reads import needed as merged_needed
from nameserver.ops import fdlimits, logfmt, stopsignal, workermetrics
from nameserver.ops.childproc import started, stop_with_core, tell_core
from nameserver.ops.metrics import RequestMetrics
from nameserver.ops.workers import SERVING, process_share
from nameserver.pb import api_pb2
from nameserver.remoting import RemotingServer, codes, frame
from nameserver.remoting.command import Command
from nameserver.remoting.corechannel import CoreChannel, UnchangedRegistrations, socket_path
from nameserver.remoting.handlers import BIG_REGISTRATION_TIMEOUT_S, REPLICA_CODES
from nameserver.remoting.server import FrontEnd
from nameserver.replica import ReadReplica, ReplicaNode, voters
from nameserver.replica.seed import seed_from_snapshots

log = logging.getLogger("nameserver.worker")

READY_POLL_S = 0.05
READINESS_CHECK_S = 0.5  # how soon a read replica's log says it started or stopped refusing reads
ADMIN_STATUS = f"/{api_pb2.DESCRIPTOR.services_by_name['Admin'].full_name}/Status"
HEALTH_CHECK = f"/{health_pb2.DESCRIPTOR.services_by_name['Health'].full_name}/Check"
# A watch resuming within this many entries of the oldest the replica keeps goes to the core (its ring is
# longer): the replica's ring may move past it before the replay starts.
RESUME_MARGIN = 100


def main(argv: list[str] | None = None) -> int:
    index, spec = started("nameserver.worker", "A node's remoting worker process.", "--index", argv)
    cfg = spec.cfg
    logfmt.configure(spec.log_format, spec.log_level, {"node": cfg.raft_addr, "worker": index})
    stopped = stopsignal.stop_event()
    stop_with_core(stopped)

    share = process_share(cfg)
    budget = fdlimits.budget(share, fdlimits.raise_nofile())
    opts = [("grpc.max_receive_message_length", cfg.max_message_bytes),
            ("grpc.max_send_message_length", cfg.max_message_bytes)]
    replica = follow_core(cfg, 0, f"worker-{index}")  # its core's state, over the core's Unix feed
    seed_from_snapshots(replica, cfg.data_dir)  # the core's newest snapshot file, while the core loads it too
    replica.start()
    groups = GroupLinks(cfg, f"worker-{index}", replica) if cfg.groups > 1 else None  # a replica of every group
    if groups is not None:
        groups.start()
    # Not on the ports before the replica can answer: a starting worker never refuses a read. Unless the core
    # refuses its state for good (apply stopped: a corrupt snapshot): then the ports open so that Admin.Status
    # (passed to the core) says why, and reads are refused naming it, as a remote replica's are.
    while (not (replica.ready and (groups is None or groups.ready)) and not replica.core_stopped
           and not stopped.wait(READY_POLL_S)):
        pass
    remoting, grpc_server, read_indexes = None, None, None
    # its requests counted in files the core's /metrics adds up (nameserver/ops/workermetrics.py)
    counted = bool(cfg.metrics_addr and os.environ.get(workermetrics.ENV))
    registry = CollectorRegistry()
    requests = RequestMetrics(registry) if counted else None
    if not stopped.is_set():
        timeout = max(BIG_REGISTRATION_TIMEOUT_S, cfg.write_timeout_ms / 1000, cfg.max_wait_ms / 1000) + 5
        channel = CoreChannel(socket_path(cfg), lambda: replica.offset, timeout)
        writes = WriteChannel(writechannel.socket_path(cfg.data_dir), cfg.max_message_bytes)
        read_indexes = corelink.core_read_index(writes, cfg, cfg.data_dir)
        core = grpc.insecure_channel(corelink.target(cfg), options=opts)
        # the node's Status and health: the core's, unless it stopped answering (nameserver/api/corehealth.py;
        # with several groups every group core's, from GroupLinks)
        status = CoreStatus(cfg, [core], [replica.unanswered]).handlers() if groups is None else None
        remoting, grpc_server, node = serve_reads(
            share, budget.grpc, budget.remoting, replica, read_indexes.read_index,
            core, channel if cfg.remoting_addr else None,
            requests, spec.reply_sizes, reuse_port=True, local=status, writes=writes, groups=groups,
            front_socket=frontchannel.socket_path(cfg.data_dir, index) if cfg.grpc_front == "go" else None,
            read_index_later=read_indexes.read_index_later)
        if counted:
            held = remoting
            workermetrics.WorkerGauges(index, registry).keep_set(stopped, lambda: (
                replica.offset, held.connections if held else 0, held.budget.held if held else 0,
                len(node.watches), (node.watches.cut_off_total, *unchanged_counts(
                    groups.remoting_channels if groups is not None and groups.remoting_channels else [channel]))))
        log.info("worker %d (pid %d) serving gRPC on %s%s at offset %d%s", index, os.getpid(),
                 cfg.grpc_addr if cfg.grpc_front != "go" else f"{cfg.grpc_addr} (through the Go front end)",
                 f" and remoting on {cfg.remoting_addr}" if cfg.remoting_addr else "", replica.offset,
                 "" if replica.ready else f"; refusing reads: {replica.not_ready_reason()}")
        tell_core(SERVING)  # the core starts the workers it held back (nameserver/ops/workers.py)
        stopsignal.wait_until_set(stopped)
    _stop(remoting, grpc_server, replica, read_indexes)
    if groups is not None:
        groups.stop()
    return 0


def serve_reads(cfg: NodeConfig, grpc_connections: int, remoting_connections: int | None, replica: ReadReplica,
                read_index: Callable[[float], int], onward: Any, front: FrontEnd | None,
                requests: RequestMetrics | None = None, reply_sizes: dict[int, int] | None = None, *,
                reuse_port: bool, local: dict[str, grpc.RpcMethodHandler] | None = None,
                writes: WriteChannel | None = None, groups: GroupLinks | None = None,
                front_socket: str | None = None, read_index_later: ReadIndexLater | None = None
                ) -> tuple[RemotingServer | None, grpc.Server | FrontServer, ReplicaNode]:
    """The ports of a process serving reads from `replica` (a worker; a read replica on another machine),
    started: gRPC answers corelink.REPLICA_METHODS (and `local`) here and passes every other call to
    `onward` (the core's private socket; the followed voter) as bytes, the unary writes on `writes` (a
    worker's batched write channel to its core) when given; remoting answers the codes REQUESTS
    marks `replica` here and hands the rest to `front`. With `groups` (several Raft groups: a worker) routes
    and cluster info are merged over every group and writes routed to their group's core
    (nameserver/groups). With `front_socket` (a worker of a node whose grpc_front is "go") its gRPC calls come
    from the Go front end on that socket (nameserver/api/frontchannel.py), through the same handlers and
    interceptors, instead of a grpcio server on the public port; there, with `read_index_later` (`read_index`
    without a waiting thread: nameserver/api/coreindex.py) and one Raft group, a LINEARIZABLE read asks its
    read index as it arrives and runs when the index comes (frontchannel.IndexFirst). Returns the servers and
    the read API over the replica."""
    # ReplicaNode has the node's read API, which is all the replica methods and codes use
    node = ReplicaNode(replica, cfg, read_index=read_index)
    calls = groups.calls(onward, writes) if groups is not None else None  # before the service: it routes too
    service = NameServerService(node) if groups is None else groups.service(node)  # type: ignore[arg-type]
    metrics = requests.interceptor() if requests is not None else None
    grpc_server: grpc.Server | FrontServer = (
        grpcserver.new_server(cfg, grpc_connections, reuse_port=reuse_port, metrics=metrics) if front_socket is None
        else FrontServer(cfg, front_socket, grpcserver.interceptors(cfg, metrics), _inline_reads(replica, groups),
                         _reusable_reads(groups.replicas if groups is not None else [replica]),
                         _index_first_reads(read_index_later, cfg)
                         if read_index_later is not None and groups is None else None,
                         _write_first(writes, replica) if writes is not None and groups is None else None))
    if groups is not None and calls is not None:  # asked first: a write goes to its group's core
        grpc_server.add_generic_rpc_handlers((calls,))
        local = (local or {}) | groups.local_handlers()
    grpc_server.add_generic_rpc_handlers((corelink.CoreForwarder(
        onward, corelink.local_handlers(service) | (local or {}), replica.wait_applied, writes,
        here={corelink.WATCH: lambda request: watch.resumable(replica.history, request.start_offset, RESUME_MARGIN)}),))
    if isinstance(grpc_server, grpc.Server):
        grpcserver.listen_public(grpc_server, cfg)
    grpc_server.start()
    remoting = None
    if isinstance(front, CoreChannel):  # a worker: unchanged registrations answered here (its core notes them)
        front.unchanged = UnchangedRegistrations(service, cfg)
        if groups is not None:  # each frame to its group's core
            front = groups.front(front, onward)
    if cfg.remoting_addr:
        remoting = RemotingServer(cfg, service, max_connections=remoting_connections, reuse_port=reuse_port,
                                  front=front, observer=requests.observe_remoting if requests is not None else None)
        warm_up(remoting, node, reply_sizes or {})
        remoting.start()
    return remoting, grpc_server, node


# The eventual reads (corelink.REPLICA_METHODS but the linearizable ones), by full name: their request types.
_EVENTUAL = {f"/{corelink.NAMESERVER.full_name}/{name}":
             getattr(api_pb2, corelink.NAMESERVER.methods_by_name[name].input_type.name)
             for name in corelink.REPLICA_METHODS if name not in ("GetBinding", "ListBindings")}


def _inline_reads(replica: ReadReplica, groups: GroupLinks | None) -> Inline:
    """A worker's calls from the Go front end that run on the link's thread: eventual reads that will not
    wait (no offset the request names past what the replica has applied; with several groups, no entry of
    its offset vector past its group's replica: min_offset and min_offsets[0] are group 0's)."""
    def here(method: str, request: bytes) -> bool:
        decoded = _decoded(method, request)
        if decoded is None:
            return False
        wanted = validation.highest_min_offset(decoded)
        if wanted == 0:
            return True
        if groups is None:
            return wanted <= replica.offset
        try:  # each group's need, as the merged read computes it; a vector too long is the pool's (its error)
            need = merged_needed(getattr(decoded, "min_offset", 0), getattr(decoded, "min_offsets", ()),
                                 len(groups.replicas))
        except ValidationError:
            return False
        return all(groups.replicas[group].offset >= offset for group, offset in need.items())
    return Inline(frozenset(_EVENTUAL), here)


# The linearizable reads a worker answers (a read index from its core, then its replica), by full name.
_INDEXED = {f"/{corelink.NAMESERVER.full_name}/{name}": getattr(api_pb2, corelink.NAMESERVER.methods_by_name[name]
                                                                  .input_type.name)
            for name in ("GetBinding", "ListBindings")}
ReadIndexLater = Callable[[float, Callable[[int | None], None]], None]  # CoreReadIndex.read_index_later


def _index_first_reads(later: ReadIndexLater, cfg: NodeConfig) -> IndexFirst:
    """A worker's LINEARIZABLE reads from the Go front end: their read index asked as they arrive (IndexFirst),
    for the time the handler's own ask would have (service.consistent_read). A request that does not decode,
    is not LINEARIZABLE or names a negative min_offset is the pool's, as ever (its error, or no read index)."""
    default, cap = cfg.write_timeout_ms / 1000, cfg.max_wait_ms / 1000

    def start(method: str, request: bytes, context: Any, done: Callable[[int | None], None]) -> bool:
        try:
            decoded = _INDEXED[method].FromString(request)
        except Exception:
            return False
        if decoded.consistency != api_pb2.LINEARIZABLE or decoded.min_offset < 0:
            return False
        later(call_timeout(context, default, cap), done)
        return True
    return IndexFirst(frozenset(_INDEXED), start)


def _write_first(writes: WriteChannel, replica: ReadReplica) -> WriteFirst:
    """A worker's unary writes from the Go front end: sent to the core as they arrive, answered once the core
    answered and this worker's replica has the answer's offset, with no thread waiting (frontchannel.WriteFirst;
    one Raft group: with several, a write is routed to its group's core by nameserver/groups, the pool's)."""
    bounds = DeadlineWatch("write-bounds")  # a core's answer in time, a replica's offset within SETTLE_S
    offsets = corelink.ReplicaOffsets(lambda: replica.offset, replica.publish_listeners, bounds)
    start = corelink.write_first(writes, offsets, bounds)
    return WriteFirst(frozenset(writechannel.method_path(name) for name in writechannel.WRITE_METHODS), start)


def _decoded(method: str, request: bytes) -> Any:
    """An eventual read's request decoded, or None when its bytes are none (the pool answers the error)."""
    try:
        return _EVENTUAL[method].FromString(request)
    except Exception:
        return None


# The reads whose replies the Go front end may keep (nameserver/api/frontchannel.py, Reusable): a function of
# the request, the caller's credential and the replicas' states alone, and of those only of record kinds that
# move their route_generation (frontchannel.py's docstring checks each, merged over several groups too).
_REUSABLE = frozenset(f"/{corelink.NAMESERVER.full_name}/{name}" for name in ("GetRoute", "GetClusterInfo",
                                                                              "GetTopicList"))


def _reusable_reads(replicas: Sequence[ReadReplica]) -> Reusable:
    """Which inline reads' replies the Go front end may answer again, while what they read of the replicas'
    states has not moved: `replicas` is the worker's replica, or with several groups every group's (a merged
    reply reads them all), in group order."""
    generations = Generations()
    # what the kept replies read (see frontchannel.py's docstring): moved by a snapshot swapped in, or by a
    # record of a kind that feeds routes (records.RecordKind.routes) changing, in any group (group 0's
    # directory records, shard/, among them), never by an idle no-op; and when any group's replica turns
    # unready
    generations.follow([replica.publish_listeners for replica in replicas],
                       lambda: all(replica.ready for replica in replicas),
                       lambda: tuple((replica.bootstraps, replica.state.route_generation) for replica in replicas))
    return Reusable(_REUSABLE, generations)


def wanted_offset(method: str, request: bytes) -> int | None:
    """The highest offset an eventual read's request makes it wait for (min_offset, and every entry of
    min_offsets: GetRoute and GetClusterInfo wait for their largest); None for a request that does not
    decode (the pool's call answers INVALID_ARGUMENT, as ever)."""
    decoded = _decoded(method, request)
    return None if decoded is None else validation.highest_min_offset(decoded)


def unchanged_counts(channels: list[CoreChannel]) -> tuple[int, int]:
    """Registrations the worker answered unchanged, and those passed on after a stale note, over its
    channels (one a group)."""
    return sum(c.answered_unchanged for c in channels), sum(c.stale_notes for c in channels)


def _stop(remoting: RemotingServer | None, grpc_server: grpc.Server | FrontServer | None, replica: ReadReplica,
          read_indexes: CoreReadIndex | None = None) -> None:
    if remoting is not None:
        remoting.stop()
    if grpc_server is not None:
        grpc_server.stop(1.0).wait()
    if read_indexes is not None:
        read_indexes.stop()  # a read after this is refused; an ask out ends with the write channel
    replica.stop()


def serve_remote(cfg: NodeConfig) -> int:
    """`nameserver replica --config replica.toml`: a read replica on another machine, following the voters
    of [replica] follow (docs/operations.md, "Read replicas on other machines"). Its ports open at once:
    `nsctl status` sees it loading; reads are refused, naming why, until it is ready."""
    stopped = stopsignal.stop_event()
    budget = fdlimits.budget(cfg, fdlimits.raise_nofile())
    opts = voters.channel_options(cfg)

    def peer(addr: str) -> grpc.Channel:
        return tlsconf.peer_channel(cfg, addr, opts)

    shared_peer = functools.cache(peer)  # one channel a voter for the read indexes and the Status polls

    replica = ReadReplica(cfg.replica_follow, peer, name=cfg.grpc_addr, max_lag=cfg.replica_max_lag_entries,
                          max_silence_s=cfg.replica_max_silence_ms / 1000,
                          metadata=[(headers.READ_REPLICA, cfg.grpc_addr)])  # how the voters list it
    replica.start()
    onward = voters.FollowedChannel(cfg, replica, _acting_role)
    status = grpc.unary_unary_rpc_method_handler(
        lambda request, context: voters.replica_status(cfg, replica),
        request_deserializer=api_pb2.StatusRequest.FromString, response_serializer=api_pb2.NodeStatus.SerializeToString)
    served = [s.full_name for s in api_pb2.DESCRIPTOR.services_by_name.values()]
    check = grpc.unary_unary_rpc_method_handler(
        voters.health(replica, served), request_deserializer=health_pb2.HealthCheckRequest.FromString,
        response_serializer=health_pb2.HealthCheckResponse.SerializeToString)
    try:
        remoting, grpc_server, _ = serve_reads(
            cfg, budget.grpc, budget.remoting, replica, voters.VoterReadIndex(cfg, shared_peer), onward,
            VoterOnlyCodes(cfg.replica_follow), reuse_port=False, local={ADMIN_STATUS: status, HEALTH_CHECK: check})
    except OSError:
        replica.stop()
        raise
    log.info("read replica (pid %d) following %s, serving gRPC on %s%s", os.getpid(), ", ".join(cfg.replica_follow),
             cfg.grpc_addr, f" and remoting on {cfg.remoting_addr}" if cfg.remoting_addr else "")
    readiness = voters.ReadinessLog(replica)
    preference = None if cfg.replica_follow_leader else voters.FollowerPreference(replica, shared_peer)
    while not stopped.wait(READINESS_CHECK_S):
        readiness.check()
        if preference is not None:
            preference.check(time.monotonic())
    _stop(remoting, grpc_server, replica)
    onward.close()
    return 0


def _acting_role() -> str:
    """The role a client's call passed on to a voter acts as when it carries no token: the one the replica's
    own [auth] gave the caller (its certificate's), else the least."""
    caller = auth.current_caller()
    return caller.role if caller is not None else "client"


class VoterOnlyCodes:
    """A read replica's remoting FrontEnd: the codes REQUESTS marks `replica` are answered from its replica;
    every other one (registrations and writes, bound to a voter's connection) is refused naming the voters."""

    local_codes = REPLICA_CODES

    def __init__(self, follow: list[str]) -> None:
        self.remark = f"this nameserver is a read replica: send this request to a voter ({', '.join(follow)})"

    async def forward(self, cmd: Command, conn: object) -> Command:
        return cmd.response(codes.SYSTEM_ERROR, self.remark)

    async def settle(self, conn: object) -> None:
        return None

    def settled(self, conn: object) -> bool:
        return True

    def closed(self, conn: object) -> None:
        return None


def warm_up(server: RemotingServer, node: ReplicaNode, reply_sizes: dict[int, int]) -> None:
    """Before the port: the reply budget starts from the core's reply sizes, and one route read runs here
    (this interpreter's first is slow: imports, caches), its size learned. Without it a burst of fresh
    connections each reserved a connection's whole share for the code's first reply: SYSTEM_BUSY."""
    for code, size in reply_sizes.items():
        server.budget.learn(code, size)
    topic = node.inspect(lambda s: s.some_topic())  # not the whole list: the index may still be building
    req = Command(code=codes.GET_ROUTEINFO_BY_TOPIC, ext_fields={"topic": topic or "-"})
    resp = server.handlers.handle(req)
    if resp.code == codes.SUCCESS:
        server.budget.learn(req.code, len(frame.encode(resp)))


if __name__ == "__main__":
    sys.exit(main())
