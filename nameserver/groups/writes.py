"""A worker's writes with several groups (docs/scaling.md, "Sharding", Step 2 item 4): each routed by
shards.router with group 0's directory (this worker's group 0 replica) to its group's core on this node,
which proposes it in its group (forwarding it to its group's leader when it does not lead).

- AssignFirst (a set's first registration): group 0's core writes the set's directory record
  (Admin.AssignSet, idempotent), this worker waits for its replica to hold it, and routes again.
- Moving: refused, retriable (UNAVAILABLE; remoting SYSTEM_BUSY), before the hop.
- Split (a heartbeat batch, a topic on brokers of several groups, a topic deleted): one call per group in
  group order, the answers merged; not atomic across groups (each part is, and the request is idempotent).
- A remoting REGISTER_TOPIC_IN_NAMESRV (217, REQUESTS' `routed`) is answered by the worker's own handlers, whose
  RegisterTopic (RoutedService) is GroupCalls.register_topic: placed and merged as the gRPC call, so a
  set with no directory record goes to group 0 there too, and group 0's refusal of a broker it does not hold
  stops the parts after it (the handlers then answer SUCCESS with nothing written, as one group does).
- A call a peer forwarded (FORWARDED) was routed where it began: it goes to the group its GROUP header
  names (a group core's forward), else group 0's core, unrouted. GROUP is honoured only on forwarded calls,
  which only peers may send (auth), so a client cannot pick a set's group.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import grpc
from google.protobuf.message import Message

from nameserver import headers, validation
from nameserver.api.corelink import SETTLE_S, CoreForwarder, own_metadata
from nameserver.api.rpc import rpc
from nameserver.api.writechannel import NAMESERVER, WRITE_METHODS, method_path
from nameserver.config import NodeConfig
from nameserver.groups.reads import MergedReads, MergedService
from nameserver.pb import api_pb2, api_pb2_grpc
from nameserver.remoting import codes
from nameserver.remoting.command import Command
from nameserver.remoting.corechannel import CoreChannel
from nameserver.remoting.handlers import REPLICA_CODES, ROUTED_CODES
from nameserver.replica import ReadReplica, ReplicaNode
from nameserver.state.shards.moves import SetMoving
from nameserver.state.shards.router import AssignFirst, Moving, Placement, Split, ToGroup, route

STREAM = "RegisterBrokerStream"  # a client stream: placed by its header chunk
MAX_ASSIGNS = 3  # AssignFirst rounds for one request (the directory record lands, then it routes)


def first_group(placement: ToGroup | Split) -> int:
    """The group a request that travels whole goes to: its group, or a split's first part's."""
    return placement.group if isinstance(placement, ToGroup) else placement.parts[0][0]


class Placer:
    """Where a request goes, with group 0's directory from `replica0`; assigns a new set first."""

    def __init__(self, cfg: NodeConfig, replica0: ReadReplica, core0: grpc.Channel) -> None:
        self.cfg = cfg
        self.replica0 = replica0
        self.admin = api_pb2_grpc.AdminStub(core0)
        self.metadata = own_metadata(cfg)  # the worker's own call: the node itself, whatever the client

    def place(self, request: Message, timeout: float) -> ToGroup | Split:
        deadline = time.monotonic() + timeout
        for _ in range(MAX_ASSIGNS):
            with self.replica0.lock:
                placement: Placement = route(request, self.replica0.state.directory, self.cfg.groups)
            if isinstance(placement, Moving):
                raise SetMoving(placement.broker_name, placement.target)
            if not isinstance(placement, AssignFirst):
                return placement
            left = max(0.1, deadline - time.monotonic())
            reply = self.admin.AssignSet(api_pb2.AssignSetRequest(broker_name=placement.broker_name,
                                                                  cluster_name=placement.cluster),
                                         timeout=left, metadata=self.metadata)
            if not self.replica0.wait_applied(reply.offset, max(0.1, deadline - time.monotonic())):
                break
        raise TimeoutError("the broker set's directory record did not reach this worker in time")


_REQUESTS = {name: getattr(api_pb2, NAMESERVER.methods_by_name[name].input_type.name) for name in WRITE_METHODS}
_REPLIES = {name: getattr(api_pb2, NAMESERVER.methods_by_name[name].output_type.name) for name in WRITE_METHODS}
_NO_DEADLINE_S = 1e6


def merge_replies(replies: Sequence[tuple[int, Message]], groups: int) -> Message:
    """One answer of a split write's parts (group order): a write's records summed, its offset group 0's
    when group 0 had a part, else the first part's, and its offset vector (`offsets`: each part's offset in
    its group, 0 for a group with no part; stamp_offsets); any other reply (a heartbeat's unknown addresses
    and versions) merged field by field."""
    first = replies[0][1]
    merged = type(first)()
    for _group, reply in replies:
        merged.MergeFrom(reply)
    if isinstance(merged, api_pb2.WriteReply):
        merged.offset = first.offset  # type: ignore[attr-defined]
        merged.records = sum(reply.records for _, reply in replies)  # type: ignore[attr-defined]
    if _VECTOR in merged.DESCRIPTOR.fields_by_name:
        vector = [0] * groups
        for group, reply in replies:
            vector[group] = reply.offset  # type: ignore[attr-defined]
        merged.offsets[:] = vector  # type: ignore[attr-defined]
    return merged


_VECTOR = "offsets"  # a write reply's offset vector (WriteReply, RegisterBrokerReply)


def stamp_offsets(reply_type: type[Message], raw: bytes, group: int, groups: int) -> bytes:
    """A reply of a write that went whole to `group`, with its offset vector (`offsets`: its offset at
    `group`, 0 elsewhere) when its type has one: what a client passes as a read's min_offsets to read its
    write in every group (docs/scaling.md, "Sharding": the offset vector). Other replies as they are."""
    if _VECTOR not in reply_type.DESCRIPTOR.fields_by_name:
        return raw
    reply = reply_type.FromString(raw)
    reply.offsets[:] = [reply.offset if k == group else 0 for k in range(groups)]  # type: ignore[attr-defined]
    return reply.SerializeToString()


# The requests the router splits over groups (router.route's Split), by type: each part would be checked by
# its own group's core alone, so a bad entry in one part would leave the others written.
SPLIT_CHECKS: dict[type[Message], Callable[[Any], None]] = {
    api_pb2.HeartbeatRequest: validation.validate_heartbeat,
    api_pb2.RegisterTopicRequest: validation.validate_register_topic,
    api_pb2.DeleteTopicRequest: validation.validate_delete_topic,
}


class GroupCalls(grpc.GenericRpcHandler):
    """A worker's gRPC calls with several groups, placed before its CoreForwarder (group 0's, which
    answers what this leaves: None)."""

    def __init__(self, forwarders: Sequence[CoreForwarder], placer: Placer) -> None:
        self.forwarders = list(forwarders)  # forwarders[k]: to group k's core on this node
        self.placer = placer
        self.routed: dict[str, grpc.RpcMethodHandler] = {
            method_path(name): grpc.unary_unary_rpc_method_handler(self._routing(name)) for name in WRITE_METHODS}
        self.routed[method_path(STREAM)] = grpc.stream_unary_rpc_method_handler(self._routing_stream)

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        md: Mapping[str, Any] = dict(handler_call_details.invocation_metadata or ())
        method = handler_call_details.method
        if headers.FORWARDED in md:
            group = md.get(headers.GROUP, "")
            if isinstance(group, str) and group.isdigit() and 0 < int(group) < len(self.forwarders):
                return self.forwarders[int(group)].service(handler_call_details)
            return None
        return self.routed.get(method)

    def _routing(self, name: str) -> Callable[[bytes, grpc.ServicerContext], bytes]:
        path = method_path(name)
        parse, reply_type = _REQUESTS[name].FromString, _REPLIES[name]

        def routed(raw: bytes, context: grpc.ServicerContext) -> bytes:
            try:
                request = parse(raw)
            except Exception:  # as the core would: its decode guard names the request
                return self._call(0, path, raw, context)
            self._checked(request, context)
            placement = self._place(request, context)
            if isinstance(placement, ToGroup):
                return stamp_offsets(reply_type, self._call(placement.group, path, raw, context), placement.group,
                                     len(self.forwarders))
            replies = [(group, reply_type.FromString(self._call(group, path, part.SerializeToString(), context)))
                       for group, part in placement.parts]
            return merge_replies(replies, len(self.forwarders)).SerializeToString()

        return routed

    @rpc
    def _checked(self, request: Message, context: grpc.ServicerContext) -> None:
        """A request the router may split (SPLIT_CHECKS) is checked whole by the core's own validator before
        any part is placed or written: bad input is refused naming its field (rpc's error table) and no group
        writes a part of it, as one group refuses it whole."""
        check = SPLIT_CHECKS.get(type(request))
        if check is not None:
            check(request)

    def _place(self, request: Message, context: grpc.ServicerContext) -> ToGroup | Split:
        left = context.time_remaining()
        try:
            return self.placer.place(request, min(left if left is not None else _NO_DEADLINE_S,
                                                  self.placer.cfg.max_wait_ms / 1000))
        except (SetMoving, TimeoutError) as exc:
            context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        except grpc.RpcError as exc:  # group 0's core refused the assignment: its status
            context.abort(exc.code(), exc.details() or "assigning the broker set failed")

    def _routing_stream(self, chunks: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
        """A registration in chunks: placed by its first (the header naming the set), passed on whole."""
        first = next(chunks, None)
        group = 0
        if first is not None:
            try:
                header = api_pb2.RegisterBrokerChunk.FromString(first).header
            except Exception:  # the core's decode guard names the request
                header = None
            if header is not None and header.broker_name:
                placement = self._place(api_pb2.RegisterBrokerRequest(broker_name=header.broker_name,
                                                                      cluster_name=header.cluster_name), context)
                group = first_group(placement)
        handler = self.forwarders[group].handlers[method_path(STREAM)]
        assert handler.stream_unary is not None
        raw = handler.stream_unary(itertools.chain([first] if first is not None else [], chunks), context)
        return stamp_offsets(api_pb2.RegisterBrokerReply, raw, group, len(self.forwarders))

    def _call(self, group: int, path: str, raw: bytes, context: grpc.ServicerContext) -> bytes:
        handler = self.forwarders[group].handlers[path]
        assert handler.unary_unary is not None
        return handler.unary_unary(raw, context)

    def register_topic(self, request: api_pb2.RegisterTopicRequest, context: grpc.ServicerContext
                       ) -> api_pb2.WriteReply:
        """RegisterTopic for the worker's remoting handlers (217), placed and merged as the gRPC call: each
        part written by its group's core as the worker itself (the handlers' in-process stub checked the
        remoting port's role first, as the core's does), a refused part ending the call; the answer held
        until this worker's replica of each group has its part (the connection's next read sees it)."""
        placement = self._place(request, context)
        parts = [(placement.group, request)] if isinstance(placement, ToGroup) else list(placement.parts)
        replies: list[tuple[int, Message]] = []
        for group, part in parts:
            forwarder = self.forwarders[group]
            left = context.time_remaining()
            reply = api_pb2_grpc.NameServerStub(forwarder.channel).RegisterTopic(
                part, timeout=left, metadata=self.placer.metadata)
            forwarder.settle(reply.offset, min(SETTLE_S, left if left is not None else SETTLE_S), context.is_active)
            replies.append((group, reply))
        merged = merge_replies(replies, len(self.forwarders))
        assert isinstance(merged, api_pb2.WriteReply)
        return merged


class RoutedService(MergedService):
    """A sharded worker's service: MergedService's reads, and the writes its remoting handlers make themselves
    (REQUESTS' `routed` codes) routed by `calls`. Its gRPC port serves only the reads (corelink.local_handlers):
    a gRPC write goes to GroupCalls."""

    def __init__(self, node: ReplicaNode, reads: MergedReads, calls: GroupCalls) -> None:
        super().__init__(node, reads)
        self.calls = calls

    @rpc
    def RegisterTopic(self, request: api_pb2.RegisterTopicRequest, context: grpc.ServicerContext
                      ) -> api_pb2.WriteReply:
        validation.validate_register_topic(request)  # bad input refused whole, before any group writes a part
        return self.calls.register_topic(request, context)


def _placed_request(cmd: Command) -> Message | None:
    """The part of a remoting request the router needs (None: group 0's, unrouted)."""
    fields = cmd.ext_fields
    name = fields.get("brokerName", "")
    if not name:
        return None
    if cmd.code == codes.REGISTER_BROKER:
        return api_pb2.RegisterBrokerRequest(broker_name=name, cluster_name=fields.get("clusterName", ""))
    if cmd.code == codes.UNREGISTER_BROKER:
        return api_pb2.UnregisterBrokerRequest(broker_name=name)
    if cmd.code in (codes.WIPE_WRITE_PERM_OF_BROKER, codes.ADD_WRITE_PERM_OF_BROKER):
        return api_pb2.BrokerPermRequest(broker_name=name)
    if cmd.code == codes.BROKER_HEARTBEAT:
        return api_pb2.HeartbeatRequest(heartbeats=[api_pb2.BrokerHeartbeat(broker_name=name)])
    return None


class RoutedFront:
    """A worker's remoting FrontEnd with several groups: the replica and routed codes answered here (the
    worker's handlers over RoutedService), each other frame to its group's core (channels[k]); a topic
    deleted to every group (group 0's answer, unless a group refused)."""

    local_codes = REPLICA_CODES | ROUTED_CODES  # ROUTED_CODES: the handlers call RoutedService

    def __init__(self, channels: Sequence[CoreChannel], placer: Placer) -> None:
        self.channels = list(channels)
        self.placer = placer

    async def forward(self, cmd: Command, conn: Any) -> Command:
        if cmd.code == codes.DELETE_TOPIC_IN_NAMESRV:
            answers = [await channel.forward(cmd, conn) for channel in self.channels]
            return next((a for a in answers if a.code != codes.SUCCESS), answers[0])
        request = _placed_request(cmd)
        group = 0
        if request is not None:
            try:
                placement = await asyncio.get_running_loop().run_in_executor(
                    None, self.placer.place, request, self.placer.cfg.write_timeout_ms / 1000)
            except (SetMoving, TimeoutError, grpc.RpcError) as exc:
                return cmd.response(codes.SYSTEM_BUSY, f"[SHARDING] {exc}; try again later")
            group = first_group(placement)
        return await self.channels[group].forward(cmd, conn)

    async def settle(self, conn: Any) -> None:
        for channel in self.channels:
            await channel.settle(conn)

    def settled(self, conn: Any) -> bool:
        return all(channel.settled(conn) for channel in self.channels)

    def closed(self, conn: Any) -> None:
        for channel in self.channels:
            channel.closed(conn)
