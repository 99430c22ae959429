"""A sharded node's Shards service and per-group Admin.Status, answered by its workers, which hold a replica of
every group (docs/scaling.md, "Sharding"; proto/nameserver/pb/shards.proto).

- ListShards: group 0's directory (its shard/ records) and each group's apply offset, read together over the
  replicas (MergedReads: the same waits and group-order locks as a merged route).
- AssignShard, MoveShard: checked, then passed to group 0's core on this node as the node's own call
  (Admin.AssignSet with pin, Admin.MoveSet), which runs them on its leader (a move by its move duty:
  groups/moveduty.py); the core's status and message come back as they are. A one-group node serves none of
  this: UNIMPLEMENTED, which nsctl reads as "sharding is not enabled".
- Admin.Status: group 0's core's status (what a one-group node answers) with `groups` holding every group
  core's own, each asked on its private socket as the node itself (the worker's auth already let the caller
  call Admin.Status). A group core that does not answer is listed not ready, naming why. The node's own
  `ready` is every group's: a write to a set of group k needs group k's core, so a node whose group k core
  is loading, restarting or not answering this worker is not ready (its `groups` row says which).
- grpc.health.v1 Health/Check: the same readiness, from each group core's own health (SERVING only when every
  group core's is), so a load balancer's check agrees with Admin.Status (Watch still streams group 0's).
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from nameserver import validation
from nameserver.api.corelink import own_metadata
from nameserver.api.rpc import call_timeout, rpc
from nameserver.config import NodeConfig, group_config
from nameserver.errors import ValidationError
from nameserver.groups.reads import MergedReads
from nameserver.pb import api_pb2, api_pb2_grpc, shards_pb2, shards_pb2_grpc
from nameserver.state import MetadataState

ADMIN = api_pb2.DESCRIPTOR.services_by_name["Admin"]
HEALTH = health_pb2.DESCRIPTOR.services_by_name["Health"]
SHARDS = shards_pb2.DESCRIPTOR.services_by_name["Shards"]
MOVE_CAP_S = 120.0  # the longest a MoveShard call runs (a move under load with a leader change: tens of seconds)
STATUS_TIMEOUT_S = 2.0  # a group core's Status when the caller set no deadline: a stuck core must not hang nsctl


def directory_reply(states: Sequence[MetadataState], groups: int, broker_name: str) -> shards_pb2.ListShardsReply:
    """The directory of group 0's state (one set's record, or every set's), with every group's offset."""
    directory = states[0].directory
    names = [broker_name] if broker_name else directory.names()
    reply = shards_pb2.ListShardsReply(groups=groups, apply_offsets=[state.offset for state in states])
    for name in names:
        entry = directory.entry(name)
        if entry is not None:
            reply.sets.add(broker_name=name, set=entry)
    return reply


class ShardsService(shards_pb2_grpc.ShardsServicer):
    """The Shards service over a worker's replicas of every group (reads[k]: group k's)."""

    def __init__(self, cfg: NodeConfig, reads: MergedReads, core0: grpc.Channel) -> None:
        self.cfg = cfg
        self.reads = reads
        self.admin = api_pb2_grpc.AdminStub(core0)  # group 0's core on this node
        self.metadata = own_metadata(cfg)

    @rpc
    def ListShards(self, request: shards_pb2.ListShardsRequest, context: grpc.ServicerContext
                   ) -> shards_pb2.ListShardsReply:
        if request.broker_name:
            validation.check_name("broker_name", request.broker_name, "broker name")
        timeout = call_timeout(context, self.cfg.write_timeout_ms / 1000, self.cfg.max_wait_ms / 1000)  # as every read
        return self.reads.read(lambda states: directory_reply(states, self.cfg.groups, request.broker_name),
                               0, timeout, context.is_active)

    @rpc
    def AssignShard(self, request: shards_pb2.ShardPlacement, context: grpc.ServicerContext
                    ) -> shards_pb2.AssignShardReply:
        self._check(request)
        reply = self.admin.AssignSet(api_pb2.AssignSetRequest(broker_name=request.broker_name, pin=True,
                                                              group=request.group),
                                     timeout=self._timeout(context), metadata=self.metadata)
        return shards_pb2.AssignShardReply(offset=reply.offset, records=reply.records)

    @rpc
    def MoveShard(self, request: shards_pb2.ShardPlacement, context: grpc.ServicerContext
                  ) -> shards_pb2.MoveShardReply:
        self._check(request)
        reply: shards_pb2.MoveShardReply = self.admin.MoveSet(request, timeout=self._timeout(context),
                                                              metadata=self.metadata)
        return reply

    def _timeout(self, context: grpc.ServicerContext) -> float:
        """The caller's deadline (a move runs as long as it is given, up to max_wait; then the leader
        finishes it and the caller is told where it stands)."""
        return call_timeout(context, self.cfg.write_timeout_ms / 1000, max(MOVE_CAP_S, self.cfg.max_wait_ms / 1000))

    def _check(self, request: shards_pb2.ShardPlacement) -> None:
        validation.check_name("broker_name", request.broker_name, "broker name")
        if not 0 <= request.group < self.cfg.groups:
            raise ValidationError("group", f"{request.group} is not one of this cluster's groups "
                                           f"(0 to {self.cfg.groups - 1})")

    def handlers(self) -> dict[str, grpc.RpcMethodHandler]:
        """The service's methods by full name, for the worker's CoreForwarder (`local`)."""
        return {f"/{SHARDS.full_name}/{m.name}": grpc.unary_unary_rpc_method_handler(
            getattr(self, m.name), request_deserializer=getattr(shards_pb2, m.input_type.name).FromString,
            response_serializer=getattr(shards_pb2, m.output_type.name).SerializeToString)
            for m in SHARDS.methods}


def _timeout(context: grpc.ServicerContext) -> float:
    left = context.time_remaining()
    return STATUS_TIMEOUT_S if left is None or left > 1e6 else max(0.1, left)


class GroupStatus:
    """Admin.Status and Health/Check of a sharded node: group 0's core's status with every group core's in
    `groups`, ready when all are."""

    def __init__(self, cfg: NodeConfig, cores: Sequence[grpc.Channel]) -> None:
        self.cfg = cfg
        self.admins = [api_pb2_grpc.AdminStub(channel) for channel in cores]  # admins[k]: group k's core
        self.healths = [health_pb2_grpc.HealthStub(channel) for channel in cores]
        self.metadata = own_metadata(cfg)

    def Status(self, request: api_pb2.StatusRequest, context: grpc.ServicerContext) -> api_pb2.NodeStatus:
        timeout = _timeout(context)
        futures = [admin.Status.future(api_pb2.StatusRequest(), timeout=timeout, metadata=self.metadata)
                   for admin in self.admins]
        try:
            reply: api_pb2.NodeStatus = futures[0].result()
        except grpc.RpcError as err:  # as a one-group node's worker passing the call on: the core's status
            context.abort(err.code(), err.details() or "")
        own = api_pb2.NodeStatus()
        own.CopyFrom(reply)  # group 0's, without groups
        reply.groups.append(own)
        for group, future in enumerate(futures[1:], start=1):
            try:
                reply.groups.append(future.result())
            except grpc.RpcError as err:
                reply.groups.add(node_id=group_config(self.cfg, group).raft_addr, ready=False,
                                 not_ready_reason=f"group {group}'s core did not answer: "
                                                  f"{err.code().name}: {err.details()}")
        reply.ready = all(status.ready for status in reply.groups)
        return reply

    def Check(self, request: health_pb2.HealthCheckRequest, context: grpc.ServicerContext
              ) -> health_pb2.HealthCheckResponse:
        timeout = _timeout(context)
        futures = [health.Check.future(request, timeout=timeout, metadata=self.metadata) for health in self.healths]
        try:
            reply: health_pb2.HealthCheckResponse = futures[0].result()
        except grpc.RpcError as err:  # as a one-group node's worker passing the call on (NOT_FOUND: no service)
            context.abort(err.code(), err.details() or "")
        for future in futures[1:]:
            try:
                serving = future.result().status == health_pb2.HealthCheckResponse.SERVING
            except grpc.RpcError:
                serving = False
            if not serving:
                reply.status = health_pb2.HealthCheckResponse.NOT_SERVING
        return reply

    def handlers(self) -> dict[str, grpc.RpcMethodHandler]:
        return {f"/{ADMIN.full_name}/Status": grpc.unary_unary_rpc_method_handler(
            self.Status, request_deserializer=api_pb2.StatusRequest.FromString,
            response_serializer=api_pb2.NodeStatus.SerializeToString),
            f"/{HEALTH.full_name}/Check": grpc.unary_unary_rpc_method_handler(
            self.Check, request_deserializer=health_pb2.HealthCheckRequest.FromString,
            response_serializer=health_pb2.HealthCheckResponse.SerializeToString)}
