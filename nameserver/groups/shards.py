"""A sharded node's Shards service, answered by its workers, which hold a replica of
every group (docs/scaling.md, "Sharding"; proto/nameserver/pb/shards.proto).

- ListShards: group 0's directory (its shard/ records) and each group's apply offset, read together over the
  replicas (MergedReads: the same waits and group-order locks as a merged route).
- AssignShard, MoveShard: checked, then passed to group 0's core on this node as the node's own call
  (Admin.AssignSet with pin, Admin.MoveSet), which runs them on its leader (a move by its move duty:
  groups/moveduty.py); the core's status and message come back as they are. A one-group node serves none of
  this: UNIMPLEMENTED, which nsctl reads as "sharding is not enabled".
- Admin.Status and grpc.health.v1 Health/Check and Watch: the node's readiness, every group core's
  (nameserver/api/corehealth.py: a worker answers them whatever the node's groups).
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from nameserver import validation
from nameserver.api.corelink import own_metadata
from nameserver.api.rpc import call_timeout, rpc
from nameserver.config import NodeConfig
from nameserver.errors import ValidationError
from nameserver.groups.reads import MergedReads
from nameserver.pb import api_pb2, api_pb2_grpc, shards_pb2, shards_pb2_grpc
from nameserver.state import MetadataState

SHARDS = shards_pb2.DESCRIPTOR.services_by_name["Shards"]
MOVE_CAP_S = 120.0  # the longest a MoveShard call runs (a move under load with a leader change: tens of seconds)


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
