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
- grpc.health.v1 Health/Check and Watch: the same readiness, from each group core's own health (SERVING only
  when every group core's is), so a load balancer's check agrees with Admin.Status. Watch follows a Watch of
  each group core and sends the node's status again whenever it changes (a group core that goes down, or
  whose stream breaks, counts NOT_SERVING until its Watch answers again). The Controller service is group 0's
  core's alone (every ctrl/ record is group 0's; a group k core lists no Controller): its health is that
  core's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from nameserver import validation
from nameserver.api.auth import CONTROLLER_SERVICE
from nameserver.api.corelink import forwarded_metadata, own_metadata
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
WATCH_RETRY_S = 0.2  # between a group core's Watch that ended and the next (which waits for the core's socket)
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN


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

    def _asked(self, service: str) -> int:
        """How many group cores (0 to n - 1) a health call of `service` asks: the Controller service is group
        0's core's alone (a group k core does not serve it)."""
        return 1 if service == CONTROLLER_SERVICE else len(self.healths)

    def Check(self, request: health_pb2.HealthCheckRequest, context: grpc.ServicerContext
              ) -> health_pb2.HealthCheckResponse:
        timeout = _timeout(context)
        futures = [health.Check.future(request, timeout=timeout, metadata=self.metadata)
                   for health in self.healths[:self._asked(request.service)]]
        try:
            reply: health_pb2.HealthCheckResponse = futures[0].result()
        except grpc.RpcError as err:  # as a one-group node's worker passing the call on (NOT_FOUND: no service)
            context.abort(err.code(), err.details() or "")
        for future in futures[1:]:
            try:
                serving = future.result().status == SERVING
            except grpc.RpcError:
                serving = False
            if not serving:
                reply.status = NOT_SERVING
        return reply

    def Watch(self, request: health_pb2.HealthCheckRequest, context: grpc.ServicerContext
              ) -> Iterator[health_pb2.HealthCheckResponse]:
        """The node's health as it changes: a Watch of each group core asked (carrying the caller, as the
        worker passes a one-group node's Watch on, so each core bounds the caller's streams), combined as
        Check combines them. The first answer waits for every core's first (at most STATUS_TIMEOUT_S: one
        not answered by then counts NOT_SERVING); group 0's core's stream ending ends this one with its
        status, as a one-group node's worker passing the Watch on would."""
        watching = _Watching(self.healths[:self._asked(request.service)], request, forwarded_metadata(context))
        context.add_callback(watching.close)
        watching.start()
        try:
            yield from watching.changes(context)
        finally:
            watching.close()
        if watching.ended is not None:
            code, details = watching.ended
            context.abort(code, details)

    def handlers(self) -> dict[str, grpc.RpcMethodHandler]:
        return {f"/{ADMIN.full_name}/Status": grpc.unary_unary_rpc_method_handler(
            self.Status, request_deserializer=api_pb2.StatusRequest.FromString,
            response_serializer=api_pb2.NodeStatus.SerializeToString),
            f"/{HEALTH.full_name}/Check": grpc.unary_unary_rpc_method_handler(
            self.Check, request_deserializer=health_pb2.HealthCheckRequest.FromString,
            response_serializer=health_pb2.HealthCheckResponse.SerializeToString),
            f"/{HEALTH.full_name}/Watch": grpc.unary_stream_rpc_method_handler(
            self.Watch, request_deserializer=health_pb2.HealthCheckRequest.FromString,
            response_serializer=health_pb2.HealthCheckResponse.SerializeToString)}


class _Watching:
    """One Health/Watch of a sharded node: a thread a group core following that core's Watch (again after
    its stream ends, waiting for the core to accept it), and the combined status, sent when it changes."""

    def __init__(self, healths: Sequence[health_pb2_grpc.HealthStub], request: health_pb2.HealthCheckRequest,
                 metadata: Sequence[tuple[str, Any]]) -> None:
        self.healths = list(healths)
        self.request = request
        self.metadata = tuple(metadata)
        self.cond = threading.Condition()
        self.statuses: list[int | None] = [None] * len(self.healths)  # [k]: group k's core's; None: not yet
        self.calls: list[Any] = [None] * len(self.healths)  # [k]: group k's core's Watch, while it runs
        self.closed = False
        self.group0_done = False  # group 0's core's stream ended: so does this Watch
        self.ended: tuple[grpc.StatusCode, str] | None = None  # how it ended, when with an error

    def start(self) -> None:
        for group in range(len(self.healths)):
            threading.Thread(target=self._follow, args=(group,), name=f"health-watch-g{group}", daemon=True).start()

    def close(self) -> None:
        with self.cond:
            self.closed = True
            calls = [call for call in self.calls if call is not None]
            self.cond.notify_all()
        for call in calls:
            call.cancel()

    def _follow(self, group: int) -> None:
        first = True
        while True:
            # the first call fails at once when the core does not accept (counted NOT_SERVING); later ones wait
            # for its socket (a restarted core's), which the worker's channel reconnects to within a second
            call = self.healths[group].Watch(self.request, metadata=self.metadata, wait_for_ready=not first)
            with self.cond:
                if self.closed:
                    call.cancel()
                    return
                self.calls[group] = call
            failure: tuple[grpc.StatusCode, str] | None = None
            try:
                for reply in call:
                    with self.cond:
                        self.statuses[group] = reply.status
                        self.cond.notify_all()
            except grpc.RpcError as err:
                failure = (err.code(), err.details() or "")
            with self.cond:
                self.calls[group] = None
                if self.closed:
                    return
                if group == 0:  # the node's own core: this Watch ends as its stream did
                    self.group0_done, self.ended = True, failure
                    self.cond.notify_all()
                    return
                self.statuses[group] = NOT_SERVING
                self.cond.notify_all()
                self.cond.wait(WATCH_RETRY_S)  # close() wakes it
                if self.closed:
                    return
            first = False

    def _combined(self, first_due: bool) -> int | None:
        """The node's status now (under the lock); None until group 0's core's first answer and, before
        `first_due`, every other core's."""
        group0 = self.statuses[0]
        if group0 is None or (not first_due and None in self.statuses):
            return None
        if group0 == SERVICE_UNKNOWN:
            return SERVICE_UNKNOWN
        return SERVING if all(status == SERVING for status in self.statuses) else NOT_SERVING

    def changes(self, context: grpc.ServicerContext) -> Iterator[health_pb2.HealthCheckResponse]:
        due = time.monotonic() + STATUS_TIMEOUT_S
        sent: int | None = None
        while True:
            with self.cond:
                while True:
                    if self.closed or self.group0_done or not context.is_active():
                        return
                    now = time.monotonic()
                    status = self._combined(now >= due)
                    if status is not None and status != sent:
                        break
                    # woken by any core's change; timed for the first answer's bound and a caller gone unseen
                    self.cond.wait(min(1.0, due - now) if now < due else 1.0)
            sent = status
            yield health_pb2.HealthCheckResponse(status=status)
