"""The gRPC services: thin shells over NameServerNode.

Reads are served locally (stamped with the apply offset); writes are validated here (so bad input
never leaves this node), then applied by the leader, forwarded over gRPC when this node is not it.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from nameserver import validation
from nameserver.node import FORWARDED_HEADER, NameServerNode, NotReady, OffsetNotReached
from nameserver.pb import api_pb2, api_pb2_grpc
from nameserver.state import translate
from nameserver.validation import TooLargeError, ValidationError
from raftlog.proposer import NotLeader, ProposalError

log = logging.getLogger("nameserver.service")

LEADER_WAIT_S = 3.0  # how long a write waits for an election before giving up


def _timeout(context: grpc.ServicerContext, default: float) -> float:
    left = context.time_remaining()
    return default if left is None else max(0.0, min(left, 3600.0))


def rpc(fn: Callable) -> Callable:
    """Map our exceptions to gRPC statuses, one place for every method."""

    @functools.wraps(fn)
    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return fn(self, request, context)
        except TooLargeError as exc:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{exc.field}: {exc.message}")
        except ValidationError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{exc.field}: {exc.message}")
        except NotReady as exc:
            context.abort(grpc.StatusCode.UNAVAILABLE, f"not ready: {exc}")
        except OffsetNotReached as exc:
            context.set_trailing_metadata((("x-apply-offset", str(exc.apply_offset)),))
            context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        except ProposalError as exc:
            what = "outcome unknown" if exc.unknown_outcome else "not applied"
            context.abort(grpc.StatusCode.UNAVAILABLE, f"write {what}: {exc}")
        except grpc.RpcError as exc:  # a forwarded call's status passes through unchanged
            if hasattr(exc, "code") and callable(exc.code):
                context.abort(exc.code(), exc.details() or "forwarded call failed")
            raise

    return wrapper


class NameServerService(api_pb2_grpc.NameServerServicer):
    def __init__(self, node: NameServerNode) -> None:
        self.node = node
        self.default_timeout = node.cfg.write_timeout_ms / 1000

    # ---- write plumbing ------------------------------------------------------------------------

    def _write(self, context: grpc.ServicerContext, method: str, request: Any,
               translate_fn: Callable, forward: Callable | None = None) -> tuple[Any, Any]:
        """(WriteResult, None) when applied here, or (None, reply) when the leader answered."""
        timeout = _timeout(context, self.default_timeout)
        deadline = time.monotonic() + timeout
        if self.node.log.is_leader():
            try:
                return self.node.write(translate_fn, timeout), None
            except NotLeader:
                pass  # lost leadership meanwhile: forward below
        forwarded = any(k == FORWARDED_HEADER for k, _ in context.invocation_metadata())
        if forwarded:
            # Never forward twice: the caller picks another node or retries.
            context.abort(grpc.StatusCode.UNAVAILABLE, "not the leader (forwarded request)")
        stub = self.node.leader_stub(wait_s=min(LEADER_WAIT_S, timeout))
        if stub is None:
            if self.node.log.is_leader():  # we won the election while waiting
                return self.node.write(translate_fn, max(0.1, deadline - time.monotonic())), None
            context.abort(grpc.StatusCode.UNAVAILABLE, "no leader elected (is a majority of nodes up?)")
        left = max(0.1, deadline - time.monotonic())
        md = [(FORWARDED_HEADER, "1")]
        if forward is not None:
            return None, forward(stub, left, md)
        return None, getattr(stub, method)(request, timeout=left, metadata=md)

    def _write_reply(self, context: grpc.ServicerContext, method: str, request: Any,
                     translate_fn: Callable) -> api_pb2.WriteReply:
        res, reply = self._write(context, method, request, translate_fn)
        if reply is not None:
            return reply
        return api_pb2.WriteReply(offset=res.offset, records=res.records)

    def _read(self, context: grpc.ServicerContext, fn: Callable, min_offset: int) -> tuple[Any, int]:
        if min_offset < 0:
            raise ValidationError("min_offset", "must be >= 0")
        return self.node.read(fn, min_offset, _timeout(context, self.default_timeout))

    # ---- broker side ---------------------------------------------------------------------------

    @rpc
    def RegisterBroker(self, request: api_pb2.RegisterBrokerRequest, context: grpc.ServicerContext
                       ) -> api_pb2.RegisterBrokerReply:
        validation.validate_register_broker(request)
        return self._register(request, context)

    @rpc
    def RegisterBrokerStream(self, request_iterator: Iterator[api_pb2.RegisterBrokerChunk],
                             context: grpc.ServicerContext) -> api_pb2.RegisterBrokerReply:
        request = _assemble_chunks(request_iterator)
        validation.validate_register_broker(request)
        return self._register(request, context)

    def _register(self, request: api_pb2.RegisterBrokerRequest, context: grpc.ServicerContext
                  ) -> api_pb2.RegisterBrokerReply:
        default_ms = self.node.cfg.default_timeout_ms

        def forward(stub: Any, timeout: float, md: list) -> api_pb2.RegisterBrokerReply:
            if request.ByteSize() > self.node.cfg.max_message_bytes // 2:
                return stub.RegisterBrokerStream(_chunks(request), timeout=timeout, metadata=md)
            return stub.RegisterBroker(request, timeout=timeout, metadata=md)

        res, reply = self._write(context, "RegisterBroker", request,
                                 lambda s: translate.register_broker(s, request, default_ms), forward)
        if reply is not None:
            return reply
        self.node.liveness.touch(request.broker_addr)
        t = res.translation
        return api_pb2.RegisterBrokerReply(
            offset=res.offset, records=res.records, master_addr=t.master_addr,
            ha_server_addr=t.ha_server_addr, order_topic_config=t.order_topic_config)

    @rpc
    def UnregisterBroker(self, request: api_pb2.UnregisterBrokerRequest, context: grpc.ServicerContext
                         ) -> api_pb2.WriteReply:
        validation.validate_unregister_broker(request)
        reply = self._write_reply(context, "UnregisterBroker", request, lambda s: translate.unregister_broker(
            s, request.cluster_name, request.broker_name, request.broker_addr, request.broker_id))
        self.node.liveness.forget(request.broker_addr)
        return reply

    @rpc
    def Heartbeat(self, request: api_pb2.HeartbeatRequest, context: grpc.ServicerContext
                  ) -> api_pb2.HeartbeatReply:
        validation.validate_heartbeat(request)
        return api_pb2.HeartbeatReply(unknown_addrs=self.node.heartbeat(request.heartbeats))

    # ---- reads ---------------------------------------------------------------------------------

    @rpc
    def GetRoute(self, request: api_pb2.GetRouteRequest, context: grpc.ServicerContext
                 ) -> api_pb2.GetRouteReply:
        validation.validate_topic_name(request.topic, "topic")
        cfg = self.node.cfg
        route, offset = self._read(context, lambda s: s.route(
            request.topic, zone_name=request.zone_name, zone_mode=cfg.zone_mode,
            order_message_enable=cfg.order_message_enable), request.min_offset)
        if route is None:
            context.set_trailing_metadata((("x-apply-offset", str(offset)),))
            context.abort(grpc.StatusCode.NOT_FOUND, f"topic {request.topic} does not exist")
        return api_pb2.GetRouteReply(route=route, apply_offset=offset)

    @rpc
    def GetClusterInfo(self, request: api_pb2.GetClusterInfoRequest, context: grpc.ServicerContext
                       ) -> api_pb2.GetClusterInfoReply:
        info, offset = self._read(context, lambda s: s.cluster_info(), request.min_offset)
        info.apply_offset = offset
        return info

    @rpc
    def GetTopicList(self, request: api_pb2.GetTopicListRequest, context: grpc.ServicerContext
                     ) -> api_pb2.GetTopicListReply:
        if request.kind == api_pb2.TOPIC_LIST_BY_CLUSTER:
            validation.validate_name(request.cluster_name, "cluster_name")
        topics, offset = self._read(context, lambda s: s.topic_list(request.kind, request.cluster_name),
                                    request.min_offset)
        return api_pb2.GetTopicListReply(topics=topics, apply_offset=offset)

    @rpc
    def GetBrokerMemberGroup(self, request: api_pb2.GetBrokerMemberGroupRequest,
                             context: grpc.ServicerContext) -> api_pb2.GetBrokerMemberGroupReply:
        validation.validate_name(request.broker_name, "broker_name")
        addrs, offset = self._read(
            context, lambda s: s.broker_member_group(request.cluster_name, request.broker_name),
            request.min_offset)
        return api_pb2.GetBrokerMemberGroupReply(cluster_name=request.cluster_name,
                                                 broker_name=request.broker_name, addrs=addrs,
                                                 apply_offset=offset)

    # ---- KV ------------------------------------------------------------------------------------

    @rpc
    def PutKv(self, request: api_pb2.PutKvRequest, context: grpc.ServicerContext) -> api_pb2.WriteReply:
        validation.validate_put_kv(request)
        return self._write_reply(context, "PutKv", request,
                                 lambda s: translate.put_kv(s, request.namespace, request.key, request.value))

    @rpc
    def GetKv(self, request: api_pb2.GetKvRequest, context: grpc.ServicerContext) -> api_pb2.GetKvReply:
        validation.validate_kv_key(request.namespace, request.key)
        value, offset = self._read(context, lambda s: s.kv_get(request.namespace, request.key),
                                   request.min_offset)
        if value is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no KV config {request.namespace}/{request.key}")
        return api_pb2.GetKvReply(value=value, apply_offset=offset)

    @rpc
    def DeleteKv(self, request: api_pb2.DeleteKvRequest, context: grpc.ServicerContext
                 ) -> api_pb2.WriteReply:
        validation.validate_kv_key(request.namespace, request.key)
        return self._write_reply(context, "DeleteKv", request,
                                 lambda s: translate.delete_kv(s, request.namespace, request.key))

    @rpc
    def ListKv(self, request: api_pb2.ListKvRequest, context: grpc.ServicerContext) -> api_pb2.ListKvReply:
        validation.validate_kv_namespace(request.namespace)
        table, offset = self._read(context, lambda s: s.kv_list(request.namespace), request.min_offset)
        return api_pb2.ListKvReply(table=table, apply_offset=offset)

    # ---- topics and permissions ------------------------------------------------------------------

    def _perm(self, context: grpc.ServicerContext, method: str, request: api_pb2.BrokerPermRequest,
              fn: Callable) -> api_pb2.BrokerPermReply:
        validation.validate_name(request.broker_name, "broker_name")
        res, reply = self._write(context, method, request, lambda s: fn(s, request.broker_name))
        if reply is not None:
            return reply
        return api_pb2.BrokerPermReply(topic_count=res.translation.count, offset=res.offset)

    @rpc
    def WipeWritePerm(self, request: api_pb2.BrokerPermRequest, context: grpc.ServicerContext
                      ) -> api_pb2.BrokerPermReply:
        return self._perm(context, "WipeWritePerm", request, translate.wipe_write_perm)

    @rpc
    def AddWritePerm(self, request: api_pb2.BrokerPermRequest, context: grpc.ServicerContext
                     ) -> api_pb2.BrokerPermReply:
        return self._perm(context, "AddWritePerm", request, translate.add_write_perm)

    @rpc
    def RegisterTopic(self, request: api_pb2.RegisterTopicRequest, context: grpc.ServicerContext
                      ) -> api_pb2.WriteReply:
        validation.validate_register_topic(request)
        return self._write_reply(context, "RegisterTopic", request,
                                 lambda s: translate.register_topic(s, request.topic, request.queue_datas))

    @rpc
    def DeleteTopic(self, request: api_pb2.DeleteTopicRequest, context: grpc.ServicerContext
                    ) -> api_pb2.WriteReply:
        validation.validate_topic_name(request.topic, "topic")
        if request.cluster_name:
            validation.validate_name(request.cluster_name, "cluster_name")
        return self._write_reply(context, "DeleteTopic", request,
                                 lambda s: translate.delete_topic(s, request.topic, request.cluster_name))


class AdminService(api_pb2_grpc.AdminServicer):
    def __init__(self, node: NameServerNode) -> None:
        self.node = node

    @rpc
    def Status(self, request: api_pb2.StatusRequest, context: grpc.ServicerContext) -> api_pb2.NodeStatus:
        st = self.node.status()
        st["role"] = {0: api_pb2.ROLE_FOLLOWER, 1: api_pb2.ROLE_CANDIDATE,
                      2: api_pb2.ROLE_LEADER}.get(st["role"], api_pb2.ROLE_UNKNOWN)
        return api_pb2.NodeStatus(**st)

    @rpc
    def Members(self, request: api_pb2.MembersRequest, context: grpc.ServicerContext) -> api_pb2.MembersReply:
        raft = self.node.log.raft_status()
        leader = self.node.log.leader()
        members = []
        for m in self.node.cfg.members:
            me = m.raft_addr == self.node.cfg.raft_addr
            connected = me or raft.get(f"partner_node_status_server_{m.raft_addr}") == 2
            match = raft.get(f"match_idx_server_{m.raft_addr}", 0) if not me else self.node.log.end_offset
            members.append(api_pb2.Member(node_id=m.raft_addr, grpc_addr=m.grpc_addr, is_self=me,
                                          is_leader=m.raft_addr == leader, connected=connected,
                                          match_offset=match if self.node.log.is_leader() else 0))
        return api_pb2.MembersReply(members=members)

    @rpc
    def TakeSnapshot(self, request: api_pb2.TakeSnapshotRequest, context: grpc.ServicerContext
                     ) -> api_pb2.TakeSnapshotReply:
        before = self.node.log.snapshot_offset
        target = self.node.log.apply_offset
        self.node.log.take_snapshot()
        deadline = time.monotonic() + _timeout(context, 60.0)
        while time.monotonic() < deadline:
            if self.node.log.snapshot_offset > before or (before and before >= target):
                return api_pb2.TakeSnapshotReply(offset=self.node.log.snapshot_offset)
            time.sleep(0.05)
        context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "snapshot did not finish in time")


def _assemble_chunks(chunks: Iterator[api_pb2.RegisterBrokerChunk]) -> api_pb2.RegisterBrokerRequest:
    request: api_pb2.RegisterBrokerRequest | None = None
    for i, chunk in enumerate(chunks):
        part = chunk.WhichOneof("part")
        if i == 0:
            if part != "header":
                raise ValidationError("chunks[0]", "the first chunk must be the header")
            request = api_pb2.RegisterBrokerRequest()
            request.CopyFrom(chunk.header)
        elif part == "topics":
            assert request is not None
            request.topics.extend(chunk.topics.topics)
        else:
            raise ValidationError(f"chunks[{i}]", "only the first chunk may be a header")
        if request is not None and len(request.topics) > validation.MAX_TOPICS_PER_REGISTRATION:
            raise TooLargeError("topics", f"more than {validation.MAX_TOPICS_PER_REGISTRATION} topics")
    if request is None:
        raise ValidationError("chunks", "empty registration stream")
    return request


def _chunks(request: api_pb2.RegisterBrokerRequest, per_chunk: int = 5000
            ) -> Iterator[api_pb2.RegisterBrokerChunk]:
    header = api_pb2.RegisterBrokerRequest()
    header.CopyFrom(request)
    del header.topics[:]
    yield api_pb2.RegisterBrokerChunk(header=header)
    for i in range(0, len(request.topics), per_chunk):
        yield api_pb2.RegisterBrokerChunk(topics=api_pb2.TopicConfigs(topics=request.topics[i:i + per_chunk]))


