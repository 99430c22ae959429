"""A worker's links to every group of its node (docs/scaling.md, "Sharding", Step 2 items 3-4): a read
replica of each group's core (group 0's is the worker's own), ready when all are; the merged reads over
them; and for writes, group k's private gRPC socket, write channel and remoting channel, with the router
choosing among them. With one group none of this exists: the worker runs as before.
"""

from __future__ import annotations

from collections.abc import Callable

import grpc

from nameserver.api import corelink, writechannel
from nameserver.api.corehealth import CoreStatus
from nameserver.api.corelink import CoreForwarder
from nameserver.api.writechannel import WriteChannel
from nameserver.config import NodeConfig, group_config
from nameserver.groups.follow import follow_core
from nameserver.groups.reads import MergedReads
from nameserver.groups.registrations import GroupRegistrations
from nameserver.groups.shards import ShardsService
from nameserver.groups.writes import GroupCalls, Placer, RoutedFront, RoutedService
from nameserver.remoting.corechannel import CoreChannel, UnchangedRegistrations, socket_path
from nameserver.replica import ReadReplica, ReplicaNode
from nameserver.replica.seed import seed_from_snapshots


class GroupLinks:
    def __init__(self, cfg: NodeConfig, name: str, replica0: ReadReplica) -> None:
        self.cfg = cfg
        self.cores = [group_config(cfg, group) for group in range(cfg.groups)]
        self.replicas = [replica0] + [follow_core(cfg, group, f"{name}-g{group}") for group in range(1, cfg.groups)]
        self.reads = MergedReads(self.replicas)
        self._closing: list[WriteChannel | grpc.Channel] = []
        self._placer_made: Placer | None = None
        self.core_channels: list[grpc.Channel] = []  # [k]: group k's core's private socket, once calls() ran
        self._calls: GroupCalls | None = None
        self.remoting_channels: list[CoreChannel] = []  # [k]: group k's core's remoting socket, once front() ran

    def start(self) -> None:
        for core, replica in zip(self.cores[1:], self.replicas[1:], strict=True):
            seed_from_snapshots(replica, core.data_dir)  # each group core's newest snapshot, while it loads too
            replica.start()

    @property
    def ready(self) -> bool:
        return all(replica.ready for replica in self.replicas)

    def not_ready_reason(self) -> str:
        return "; ".join(f"group {group}: {replica.not_ready_reason()}" for group, replica in enumerate(self.replicas)
                         if not replica.ready)

    def service(self, node: ReplicaNode) -> RoutedService:
        """The worker's service (after calls()): merged reads, and the remoting handlers' routed writes."""
        assert self._calls is not None, "calls() routes the service's writes"
        return RoutedService(node, self.reads, self._calls)

    def calls(self, core0: grpc.Channel, writes0: WriteChannel | None) -> GroupCalls:
        """The gRPC handler routing writes (placed before the worker's CoreForwarder)."""
        opts = [("grpc.max_receive_message_length", self.cfg.max_message_bytes),
                ("grpc.max_send_message_length", self.cfg.max_message_bytes),
                # a group core its node restarted is reached again within a second (Admin.Status lists it
                # not ready meanwhile), not after gRPC's default backoff (growing to 120 s while it was down)
                ("grpc.initial_reconnect_backoff_ms", 100), ("grpc.max_reconnect_backoff_ms", 1000)]
        forwarders = [CoreForwarder(core0, {}, self.replicas[0].wait_applied, writes0)]
        self.core_channels = [core0]
        for core, replica in zip(self.cores[1:], self.replicas[1:], strict=True):
            channel = grpc.insecure_channel(corelink.target(core), options=opts)
            writes = WriteChannel(writechannel.socket_path(core.data_dir), self.cfg.max_message_bytes)
            self._closing += [channel, writes]
            self.core_channels.append(channel)
            forwarders.append(CoreForwarder(channel, {}, replica.wait_applied, writes))
        self._calls = GroupCalls(forwarders, self._placer(core0))
        return self._calls

    def local_handlers(self) -> dict[str, grpc.RpcMethodHandler]:
        """What a worker answers itself with several groups (after calls()): the Shards service over the
        replicas (groups/shards.py), and Admin.Status and health with every group core's (api/corehealth.py:
        a group core is heard from on its replica's feed)."""
        assert self.core_channels, "calls() opens the group cores' channels"
        shards = ShardsService(self.cfg, self.reads, self.core_channels[0])
        status = CoreStatus(self.cfg, self.core_channels, [replica.unanswered for replica in self.replicas])
        return shards.handlers() | status.handlers()

    def front(self, channel0: CoreChannel, core0: grpc.Channel) -> RoutedFront:
        """The remoting FrontEnd routing frames to each group's core (`channel0`: group 0's). When group 0's
        channel answers unchanged registrations (a worker's), so does each group's, from its replica."""
        channels = [channel0] + [CoreChannel(socket_path(core), self._offset_of(replica), channel0.timeout_s)
                                 for core, replica in zip(self.cores[1:], self.replicas[1:], strict=True)]
        if channel0.unchanged is not None:
            for group, channel in enumerate(channels[1:], start=1):
                channel.unchanged = UnchangedRegistrations(
                    GroupRegistrations(self.replicas, group, self.cores[group].default_timeout_ms), self.cfg)
        self.remoting_channels = channels
        return RoutedFront(channels, self._placer(core0))

    def _placer(self, core0: grpc.Channel) -> Placer:
        """One placer for both fronts (gRPC and remoting): group 0's directory and core."""
        if self._placer_made is None:
            self._placer_made = Placer(self.cfg, self.replicas[0], core0)
        return self._placer_made

    @staticmethod
    def _offset_of(replica: ReadReplica) -> Callable[[], int]:
        return lambda: replica.offset

    def stop(self) -> None:
        for closing in self._closing:
            closing.close()
        for replica in self.replicas[1:]:
            replica.stop()
