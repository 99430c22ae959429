"""Process wiring: a NameServerNode behind a gRPC server with health checking and reflection."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from nameserver import localfeed
from nameserver.api import auth, coreindex, corelink, grpcserver, writechannel
from nameserver.api.adminservice import AdminService
from nameserver.api.follow import FollowFeed
from nameserver.api.inprocess import InProcessStub
from nameserver.api.logservice import LogService, ReadReplicas
from nameserver.api.service import NameServerService
from nameserver.api.writechannel import WriteCalls, WriteChannelServer
from nameserver.config import REMOTING_CONNECTIONS_FLOOR, NodeConfig
from nameserver.controller import ControllerService, ElectionScan, HeartbeatTable, RoleChangeNotifier
from nameserver.core.idlenoop import IdleNoop
from nameserver.core.node import NameServerNode
from nameserver.groups.leaderbalance import LeaderBalance
from nameserver.groups.moveduty import MoveDuty
from nameserver.localfeed import FeedServer
from nameserver.ops import fdlimits, gofront, workermetrics
from nameserver.ops.gofront import FrontProcess
from nameserver.ops.metrics import LeaderWatch, MetricsEndpoint, NodeMetrics
from nameserver.ops.workers import WorkerSpec, WorkerSupervisor, group_cores_of
from nameserver.pb import api_pb2, api_pb2_grpc
from nameserver.remoting import RemotingServer
from nameserver.remoting.controller import ControllerHandlers
from nameserver.remoting.corechannel import (
    CHANNEL_MAX_FRAME,
    LINK_INFLIGHT,
    CoreHandlers,
    channel_config,
    socket_path,
)
from nameserver.remoting.handlers import Handlers
from nameserver.remoting.minbroker import MinBrokerIdNotifier
from nameserver.state.shards.directory import GROUP0
from raftlog.fdreserve import RESERVE as FD_RESERVE
from raftlog.log import LeaderView, Subscription

log = logging.getLogger("nameserver.server")

PRIVATE_CONNECTIONS_PER_WORKER = 4  # a worker's channels to the core's private socket (gRPC may open a few)
SERVICE_NAMES = (
    api_pb2.DESCRIPTOR.services_by_name["NameServer"].full_name,
    api_pb2.DESCRIPTOR.services_by_name["Admin"].full_name,
    auth.CONTROLLER_SERVICE,
)
LOG_SERVICE = api_pb2.DESCRIPTOR.services_by_name["Log"].full_name


def service_names(cfg: NodeConfig) -> tuple[str, ...]:
    """What this process's health knows and its reflection lists (with Log, Health and reflection): a group k
    core serves no Controller (group 0's core alone does: every ctrl/ record is group 0's), so it lists none."""
    return SERVICE_NAMES if cfg.group == GROUP0 else tuple(n for n in SERVICE_NAMES if n != auth.CONTROLLER_SERVICE)


def _both(first: Callable[[int], None] | None, then: Callable[[int], None]) -> Callable[[int], None]:
    def call(pid: int) -> None:
        if first is not None:
            first(pid)
        then(pid)

    return call


class Server:
    def __init__(self, cfg: NodeConfig, log_format: str = "text", log_level: str = "INFO",
                 metrics: bool = False) -> None:
        """`log_format`, `log_level`: the node's, for its worker processes; `metrics`: keep metrics without a
        metrics port (a group core's, read by its node's core: nameserver/ops/groupmetrics.py)."""
        # [node] grpc_front settled first ("auto": "go" when built), so the workers and the group cores are
        # given what this core runs; an explicit "go" that cannot be built stops the start here (OSError)
        front = gofront.settle(cfg) if cfg.group == GROUP0 else gofront.Settled(cfg, "", "")
        cfg, self.front_binary, self.front_note = front
        self.cfg = cfg
        # Descriptors first: connection limits that fit the open-file limit, and a reserve that no
        # connection can take, so a flood is refused at the door and never stops the journal.
        self.budget = fdlimits.budget(cfg, fdlimits.raise_nofile())
        FD_RESERVE.hold(cfg.reserved_fds)
        self.node = NameServerNode(cfg)
        # Prometheus metrics (nameserver/ops/metrics.py): RPCs are counted by an interceptor.
        self.metrics = (NodeMetrics(self.node, max_broker_sets=cfg.metrics_max_broker_sets)
                        if cfg.metrics_addr or metrics else None)
        counter = self.metrics.requests.interceptor() if self.metrics is not None else None
        if cfg.worker_processes:
            # The workers serve the public address; the core only its private socket (their forwarded
            # calls, their replicas' Follow and read indexes: nameserver/api/corelink.py).
            # No RPC counter there: the workers count the calls they pass on (nameserver/ops/workermetrics.py).
            # Its writes come on the write channel instead (nameserver/api/writechannel.py), through the
            # same interceptors: one set of guards, whichever way a worker's call comes.
            chain = grpcserver.interceptors(cfg, outermost=corelink.WorkerCallers(lambda: self.node.log.apply_offset))
            self.grpc = grpcserver.new_server(cfg, PRIVATE_CONNECTIONS_PER_WORKER * cfg.worker_processes + 8,
                                              chain=chain)
        else:
            self.grpc = grpcserver.new_server(cfg, self.budget.grpc, metrics=counter)
        self.service = NameServerService(self.node)
        self.writes = None
        if cfg.worker_processes:
            calls = WriteCalls(self.service, chain)
            # the workers' LINEARIZABLE reads ask their read indexes here too (corelink.core_read_index)
            calls.handlers[writechannel.READ_INDEX] = corelink.ReadIndexes(self.node.linearizable_index,
                                                                       cfg).method_handler()
            self.writes = WriteChannelServer(writechannel.socket_path(cfg.data_dir), calls, cfg.workers,
                                             cfg.max_message_bytes, read_index=self.node.start_linearizable_index,
                                             inline=frozenset(writechannel.INLINE_WRITES))
            # the lease and commit index on a page the workers read: a leased read index without an ask
            self.node.log.publish_lease(coreindex.lease_path(cfg.data_dir))
            self.node.log.hold_read_index_answers(writechannel.sends_held)  # a TELL's answers in one frame
        api_pb2_grpc.add_NameServerServicer_to_server(self.service, self.grpc)
        replicas = ReadReplicas()  # the read replicas following this node (Log.Follow), listed by Status
        admin = AdminService(self.node, replicas)
        api_pb2_grpc.add_AdminServicer_to_server(admin, self.grpc)
        follow = FollowFeed(self.node)  # one followers' bound over both transports
        api_pb2_grpc.add_LogServicer_to_server(LogService(self.node, replicas, follow), self.grpc)  # export, Follow
        # the workers' replicas take the same messages on a Unix socket, without gRPC's per-message work
        self.feed = FeedServer(localfeed.socket_path(cfg.data_dir), follow.messages,
                               cfg.grpc_progress_timeout_ms / 1000) if cfg.worker_processes else None
        # Controller mode (RIP-44; nameserver/controller): served over gRPC by every node, so a follower
        # can forward to whichever node leads; its remoting port only where [controller] listen is set.
        # With [sharding] groups > 1 only group 0's core serves it: every controller record (ctrl/) is group
        # 0's (docs/scaling.md, "Controller mode with groups"), so a group k core has no Controller service
        # and no election scan.
        self.heartbeats = HeartbeatTable(default_timeout_s=cfg.controller_heartbeat_timeout_ms / 1000)
        if self.metrics is not None and cfg.group == GROUP0:
            self.metrics.broker_alive = self.heartbeats.alive
        self.notifier = RoleChangeNotifier()  # used while the replicated notifyBrokerRoleChanged is on
        self.controller = ControllerService(self.node, self.service, self.heartbeats, self.notifier)
        if cfg.group == GROUP0:
            api_pb2_grpc.add_ControllerServicer_to_server(self.controller, self.grpc)
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.grpc)
        self.service_names = service_names(cfg)
        # reflection lists every service this listener answers: Log too (Follow, ReadLog, DumpState, DigestAt)
        reflection.enable_server_reflection(self.service_names + (LOG_SERVICE, health.SERVICE_NAME,
                                                                  reflection.SERVICE_NAME), self.grpc)
        if cfg.worker_processes:
            if self.grpc.add_insecure_port(corelink.prepare_socket(cfg)) == 0:
                raise OSError(f"cannot listen on {corelink.socket_path(cfg)}")
            os.chmod(corelink.socket_path(cfg), 0o600)
        else:
            grpcserver.listen_public(self.grpc, cfg)
        # Optional listeners started and stopped with the node (each has start() and stop()):
        # the RocketMQ remoting listener, the Prometheus endpoint, the log archiver.
        self.extras: list = [LeaderWatch(self.node.log, self.metrics)]  # one log line per leader change
        if self.writes is not None:
            self.extras.append(self.writes)
        if self.feed is not None:
            self.extras.append(self.feed)
        if self.metrics is not None and cfg.metrics_addr:
            self.extras.append(MetricsEndpoint(self.metrics.registry, cfg.metrics_addr,
                                               max_connections=self.budget.metrics,
                                               timeout_s=cfg.metrics_timeout_ms / 1000))
        if cfg.idle_noop_ms:  # keeps apply lag meaningful when nothing changes (KRaft's idle no-op)
            noop = IdleNoop(self.node.log, interval_s=cfg.idle_noop_ms / 1000,
                            on_noop=self.metrics.count_idle_noop if self.metrics else None)
            self.node.duties.add("idle-noop", noop.check_every_s, noop.tick)
        if cfg.groups > 1 and cfg.leader_balance_s > 0:  # each group's leadership to its preferred member
            balance = LeaderBalance(self.node.log, cfg.raft_addr, cfg.group, cfg.leader_balance_s, self._status_of,
                                    on_transfer=self.metrics.count_leader_balance if self.metrics else None)
            self.node.duties.add("leader-balance", balance.check_every_s, balance.tick)
        self.workers: WorkerSupervisor | None = None
        self.front: FrontProcess | None = None  # [node] grpc_front = "go": the Go front end
        self.group_cores: WorkerSupervisor | None = None
        self.core_channel: CoreHandlers | None = None  # the private remoting socket's, with workers and remoting
        # The RocketMQ port refuses connections until the node is first ready, so a client tries another
        # nameserver rather than reading errors here (docs/remoting.md, "A starting node").
        self.until_ready: list[RemotingServer] = []
        self.broker_channels: list[Handlers] = []  # whose brokers' connections this node holds
        self.min_broker_id: MinBrokerIdNotifier | None = None  # 905 pushes (replicated notifyMinBrokerIdChanged)
        observer = self.metrics.requests.observe_remoting if self.metrics is not None else None
        if cfg.worker_processes:
            self._add_workers(WorkerSpec(cfg, log_format, log_level), observer)
            if self.front is not None:  # Admin.Status says how the Go front end is (nsctl status)
                admin.front = self.front.status
        elif cfg.remoting_addr:  # RocketMQ remoting protocol (nameserver/remoting)
            listener = RemotingServer(cfg, self.service, max_connections=self.budget.remoting,
                                      observer=observer, accept_later=True)
            self.until_ready.append(listener)
            self.extras.append(listener)
        if cfg.groups > 1 and cfg.group == GROUP0:  # group 0's core runs the others (nameserver/groupcore.py)
            self.group_cores = WorkerSupervisor(WorkerSpec(cfg, log_format, log_level), children=group_cores_of(cfg))
            self.extras.insert(0, self.group_cores)  # started first, stopped last: after the workers
            moving = MoveDuty(self.node, cfg)  # its leader moves sets between groups (nameserver/groups/moveduty.py)
            admin.mover = moving.move
            self.extras.append(moving)
        if cfg.remoting_addr:
            self.broker_channels += [lis.handlers for lis in self.until_ready if isinstance(lis.handlers, Handlers)]
            self.min_broker_id = MinBrokerIdNotifier(self._holds_broker)
        if cfg.group == GROUP0:
            controller = InProcessStub(self.controller, auth.CONTROLLER_SERVICE)  # the node's own calls: all rights
            elections = ElectionScan(self.node, controller, self.heartbeats, cfg.controller_scan_interval_ms / 1000)
            elections.add_to(self.node.duties)
        if cfg.controller_addr:
            # RocketMQ 5 brokers' controllerAddr; the protocol carries no credentials ([controller] role)
            role = (cfg.controller_role or "peer") if cfg.auth_enabled else ""
            handlers = ControllerHandlers(InProcessStub(self.controller, auth.CONTROLLER_SERVICE, role),
                                          InProcessStub(self.service, auth.NAMESERVER_SERVICE, role), cfg,
                                          cfg.write_timeout_ms / 1000)
            # Only controller-mode brokers connect here: the default remoting limit's descriptors are the
            # remoting port's, so this port keeps the fixed floor (a set limit applies to both, as before).
            cap = (self.budget.remoting if cfg.remoting_max_connections
                   else min(self.budget.remoting, REMOTING_CONNECTIONS_FLOOR))
            self.extras.append(RemotingServer(cfg, None, listen_addr=cfg.controller_addr, handlers=handlers,
                                              max_connections=cap))
        if cfg.archive_dir:  # Parquet log segments as entries commit (imports pyarrow only when on)
            from nameserver.ops.archive import LogArchiver
            self.extras.append(LogArchiver(self.node.log, cfg.archive_dir))
        self._ready_seen: bool | None = None
        self._health_feed: Subscription | None = None
        self._change_feed: Subscription | None = None

    def _status_of(self, raft_addr: str, timeout: float) -> api_pb2.NodeStatus:
        """The Admin.Status of the node whose member (of this core's group) is `raft_addr`, asked through its
        public gRPC address as a write forwarded there would reach it (the leader-balancing duty's readiness
        check: nameserver/groups/leaderbalance.py)."""
        addr = self.node.grpc_of(raft_addr)
        if not addr:
            raise LookupError(f"no gRPC address known for member {raft_addr}")
        reply: api_pb2.NodeStatus = self.node.forwarder.ask(addr, "Status", api_pb2.StatusRequest(), timeout,
                                                            service=api_pb2_grpc.AdminStub)
        return reply

    def _holds_broker(self, broker_addr: str) -> bool:
        return any(h.holds(broker_addr) for h in self.broker_channels)

    def _add_workers(self, spec: WorkerSpec, observer: Callable[[str, int, float], None] | None) -> None:
        """The worker processes (nameserver/ops/workers.py; started last, stopped first), and the private
        socket the workers pass remoting frames through."""
        cfg = self.cfg
        on_exit: Callable[[int], None] | None = None
        reply_sizes: Callable[[], dict[int, int]] | None = None
        if cfg.remoting_addr:
            # The workers alone hold the public remoting port, opened once the core is ready (nameserver/worker.py):
            # the core's only remoting listener is the private socket their forwarded frames come on.
            role = (cfg.remoting_role or "peer") if cfg.auth_enabled else ""
            channel = CoreHandlers(Handlers(InProcessStub(self.service, auth.NAMESERVER_SERVICE, role), cfg,
                                            cfg.write_timeout_ms / 1000), lambda: self.node.log.apply_offset)
            self.broker_channels.append(channel.inner)  # brokers connected through the workers
            self.core_channel = channel
            private = RemotingServer(channel_config(cfg, cfg.worker_processes), None, handlers=channel,
                                     unix_path=socket_path(cfg), max_frame_bytes=CHANNEL_MAX_FRAME,
                                     inflight_per_connection=LINK_INFLIGHT)  # counted by workers
            self.extras.append(private)
            # a restarted worker's reply budget starts from the core's replies to the frames passed on
            on_exit, reply_sizes = channel.worker_gone, private.budget.learned
        if cfg.group != GROUP0:  # a group core: the node's workers are group 0's core's to run
            return
        metrics_dir: str | None = None
        if self.metrics is not None:  # the workers count in files the core's /metrics adds up
            sums = self.metrics.worker_sums
            metrics_dir = sums.directory = workermetrics.prepare_dir(cfg)
            on_exit = _both(on_exit, sums.retire)
        self.workers = WorkerSupervisor(spec, on_exit=on_exit, reply_sizes=reply_sizes, metrics_dir=metrics_dir)
        self.extras.append(self.workers)
        if cfg.grpc_front == "go":  # after the workers: it dials their front sockets (nameserver/ops/gofront.py)
            self.front = FrontProcess(cfg, self.budget.grpc, self.front_binary)
            self.extras.append(self.front)
        if self.metrics is not None:
            self.metrics.workers = self.workers
            self.metrics.front = self.front
            self.metrics.write_channel = self.writes

    def start(self) -> None:
        self._set_health(False)
        self.grpc.start()
        for extra in self.extras:
            extra.start()
        self._health_feed = self.node.log.watch_leader(self._on_leader_view)
        notifier = self.min_broker_id
        if notifier is not None:
            self._change_feed = self.node.log.subscribe(lambda entry: notifier.on_changes(entry.changes,
                                                                                           self.node.state))
        through = " (the Go front end)" if self.front is not None else ""
        where = (f"{self.cfg.grpc_addr}{through} through {self.cfg.worker_processes} worker processes"
                 if self.cfg.worker_processes else self.cfg.grpc_addr)
        if self.cfg.group != GROUP0:
            where = f"{where} (group {self.cfg.group}: private sockets only)"
        if self.front_note:
            log.warning("node %s serves gRPC with grpcio ([node] grpc_front = \"auto\", the default): %s",
                        self.cfg.raft_addr, self.front_note)
        if self.cfg.workers_off_reason:
            log.warning("node %s runs no worker processes: %s; set [node] worker_processes (0 to silence this, or "
                        "a shorter data_dir for workers)", self.cfg.raft_addr, self.cfg.workers_off_reason)
        log.info("node %s serving gRPC on %s (data in %s; security %s, TLS %s, client certificates %s, "
                 "auth %s)", self.cfg.raft_addr, where, self.cfg.data_dir, self.cfg.security_mode,
                 "on" if self.cfg.tls_enabled else "off", self.cfg.tls_client_auth,
                 "on" if self.cfg.auth_enabled else "off")

    def _set_health(self, ready: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if ready else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("",) + self.service_names:
            self.health.set(name, status)

    def _on_leader_view(self, view: LeaderView) -> None:
        """gRPC health follows readiness, from the log's leader stream (its first view included)."""
        if view.ready != self._ready_seen:
            self._ready_seen = view.ready
            self._set_health(view.ready)
            log.info("node %s is %s", self.cfg.raft_addr, "ready" if view.ready else "not ready")
            if view.ready:  # the first time opens them; one not ready later (apply stopped) answers SYSTEM_BUSY
                for listener in self.until_ready:
                    listener.accept_connections()

    def stop(self, grace: float = 1.0) -> None:
        for feed in (self._health_feed, self._change_feed):
            if feed is not None:
                feed.close()
        if self.min_broker_id is not None:
            self.min_broker_id.stop()
        for extra in reversed(self.extras):
            extra.stop()
        self.grpc.stop(grace).wait()
        self.notifier.stop()
        self.node.close()

    def wait(self) -> None:
        self.grpc.wait_for_termination()
