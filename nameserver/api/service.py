"""The gRPC NameServer service: a thin shell over NameServerNode (the Admin service: adminservice.py;
the wrapping of every method: rpc.py).

Reads are served locally (stamped with the apply offset); writes are validated here (so bad input
never leaves this node), then applied by the leader, forwarded over gRPC when this node is not it.
"""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from nameserver import headers, validation
from nameserver.api.callguard import Stall
from nameserver.api.deadlines import DeadlineWatch
from nameserver.api.later import Later
from nameserver.api.rpc import call_timeout, client_ref, forwarded, in_time, rpc
from nameserver.chunking import assemble_chunks, register_chunks, should_stream
from nameserver.core.node import (
    ClientRef,
    NameServerNode,
    NotReady,
    WriteResult,
)
from nameserver.core.nowait import WouldBlock, waiting_allowed
from nameserver.core.watch import Watcher, to_events
from nameserver.pb import api_pb2, api_pb2_grpc, state_pb2
from nameserver.state import MetadataState, Translation, keys, settings, translate
from nameserver.validation import ValidationError
from raftlog.history import Compacted
from raftlog.pb import entry_pb2
from raftlog.proposer import NotLeader

log = logging.getLogger("nameserver.api.service")

LEADER_WAIT_S = 3.0  # how long a write waits for an election before giving up
FORWARD_CATCH_UP_S = 2.0  # how long a forwarded write waits for this node to apply it before answering


class NameServerService(api_pb2_grpc.NameServerServicer):
    def __init__(self, node: NameServerNode) -> None:
        self.node = node
        self.default_timeout = node.cfg.write_timeout_ms / 1000
        self.max_wait = node.cfg.max_wait_ms / 1000
        self.forward_skew_ms = node.cfg.forward_clock_skew_ms
        self.stream_deadlines = DeadlineWatch("stream-deadlines")
        self.write_deadlines = DeadlineWatch("write-deadlines")  # a write answered later: its call's time

    # ---- write plumbing ------------------------------------------------------------------------

    def write(self, context: grpc.ServicerContext, method: str, request: Any, translate_fn: Callable,
              reply_of: Callable[[WriteResult], Any],
              service: Callable[[grpc.Channel], Any] = api_pb2_grpc.NameServerStub, topics: int = 0,
              later: bool = True) -> Any:
        """Apply a write here when leading, else pass `request` on to `method` of the leader's `service`
        (nameserver/core/forwarder.py); returns the method's reply. `topics`: a registration's, for the
        leader's budget (nameserver/core/budget.py). A call that is over (its deadline passed, or the
        forwarder's; its caller cancelled) is neither passed on nor proposed (rpc.in_time).
        A call whose context answers later (`answers_later`: a worker's write on the core's write channel) gets
        a Later when `later` (the caller does nothing after the write that must wait for its commit) and the
        write is proposed with nothing to wait for before (NameServerNode.write_later): no thread waits for its
        commit; the reply is made on the apply thread."""
        client = client_ref(context)
        wanted = in_time(context, self.forward_skew_ms)
        wanted()
        timeout = call_timeout(context, self.default_timeout, self.max_wait)
        deadline = time.monotonic() + timeout
        if later and getattr(context, "answers_later", False):
            reply = self._write_later(translate_fn, reply_of, client, timeout, topics, wanted)
            if reply is not None:
                return reply
        if not waiting_allowed():  # run where nothing may wait (the write channel's reader): nothing done yet
            raise WouldBlock("this write waits before its proposal (write()'s way)")
        md = [(k, v) for k, v in context.invocation_metadata() if k in (headers.CLIENT_ID, headers.CLIENT_SEQ)]
        if client is not None and client.owner:
            md.append((headers.SESSION_OWNER, client.owner))
        reply = self.node.forwarder.serve_or_forward(
            lambda left: self._apply_write(translate_fn, reply_of, client, left, topics, wanted), method, request,
            timeout, forwarded=forwarded(context), wait_s=LEADER_WAIT_S, service=service, metadata=md,
            forward_if_lead_lost=True)
        offset = getattr(reply, "offset", 0)
        if offset:  # a write served on the leader is applied already: no wait there
            # Read-your-writes on this node, as on the leader: answer once this node has applied the
            # write too (a broker that registered through us asks us for its routes next). Bounded: a
            # follower cut off from the leader still answers; the write itself is done.
            self.node.catch_up(offset, min(FORWARD_CATCH_UP_S, max(0.0, deadline - time.monotonic())),
                               context.is_active)
        return reply

    def _write_later(self, translate_fn: Callable, reply_of: Callable[[WriteResult], Any], client: ClientRef | None,
                     timeout: float, topics: int, wanted: Callable[[], None]) -> Any:
        """The write proposed with no thread waiting for its commit: a Later of its reply (or the reply, when
        there is nothing to wait for); None when it would wait before its proposal (write()'s way then)."""
        reply = Later()

        def done(res: WriteResult | None, error: BaseException | None) -> None:
            if error is not None or res is None:
                reply.fail(error or RuntimeError("a write ended with neither a result nor an error"))
                return
            try:
                reply.resolve(self._reply(reply_of, res))
            except Exception as exc:  # a reply_of bug: answered as the servicer's would be (UNKNOWN)
                reply.fail(exc)

        try:
            started = self.node.write_later(translate_fn, timeout, client, reply_of, topics, wanted, done)
        except NotLeader:  # lost the lead before proposing: write()'s way passes it on to the new leader
            return None
        if started is None or isinstance(started, WriteResult):
            return started if started is None else self._reply(reply_of, started)
        bound = self.write_deadlines.after(timeout, started)  # the call's time: then its outcome is unknown
        reply.then(lambda _: bound.cancel())
        return reply

    def _apply_write(self, translate_fn: Callable, reply_of: Callable[[WriteResult], Any],
                     client: ClientRef | None, timeout: float, topics: int, wanted: Callable[[], None]) -> Any:
        return self._reply(reply_of, self.node.write(translate_fn, timeout, client, reply_of, topics, wanted=wanted))

    @staticmethod
    def _reply(reply_of: Callable[[WriteResult], Any], res: WriteResult) -> Any:
        """A write's reply: made from its result, or, for an exactly-once retry, the first attempt's."""
        if res.replayed is not None:
            reply = reply_of(WriteResult(0, 0, None))  # an empty reply of the right type
            reply.ParseFromString(res.replayed)
            reply.offset = res.offset  # stored before the entry had an offset
            if isinstance(reply, api_pb2.BindingReply) and reply.binding.owner:
                reply.binding.version = res.offset
            return reply
        return reply_of(res)

    def _write_reply(self, context: grpc.ServicerContext, method: str, request: Any,
                     translate_fn: Callable) -> api_pb2.WriteReply:
        return self.write(context, method, request, translate_fn,
                           lambda res: api_pb2.WriteReply(offset=res.offset, records=res.records))

    def _read(self, context: grpc.ServicerContext, fn: Callable, min_offset: int) -> tuple[Any, int]:
        if min_offset < 0:
            raise ValidationError("min_offset", "must be >= 0")
        # A read waiting for min_offset stops when its caller goes away, not at its deadline.
        return self.node.read(fn, min_offset, call_timeout(context, self.default_timeout, self.max_wait),
                              alive=context.is_active)

    # ---- broker side ---------------------------------------------------------------------------

    @rpc
    def RegisterBroker(self, request: api_pb2.RegisterBrokerRequest, context: grpc.ServicerContext
                       ) -> api_pb2.RegisterBrokerReply:
        validation.clamp_heartbeat_timeout(request)  # never refused (the remoting port says so in its remark)
        validation.validate_register_broker(request)
        return self._register(request, context)

    @rpc
    def RegisterBrokerStream(self, request_iterator: Iterator[api_pb2.RegisterBrokerChunk],
                             context: grpc.ServicerContext) -> api_pb2.RegisterBrokerReply:
        # A slow sender holds a server thread while its stream arrives: at most limits.max_wait_ms (or its
        # own deadline), then the call is cancelled (one watch thread for every stream) with a status naming
        # the limit. A stream cut short is never registered as if whole: after the cancel, grpcio may end
        # the client's stream rather than fail it.
        stall = Stall(context, "the registration stream did not end",
                      call_timeout(context, self.max_wait, self.max_wait), "limits.max_wait_ms")
        try:
            with self.stream_deadlines.after(stall.progress_s, stall.cancel):
                request = assemble_chunks(request_iterator)
        finally:
            if stall.fired:
                context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, stall.message())
        validation.clamp_heartbeat_timeout(request)  # never refused (the remoting port says so in its remark)
        validation.validate_register_broker(request)
        return self._register(request, context)

    def _register(self, request: api_pb2.RegisterBrokerRequest, context: grpc.ServicerContext
                  ) -> api_pb2.RegisterBrokerReply:
        translate_fn = self._register_translation(request)
        if not self.node.log.is_leader() and not forwarded(context) and client_ref(context) is None:
            unchanged = self.unchanged_registration(request)
            if unchanged is not None:  # nothing to write: a heartbeat, answered here
                self.node.note_alive([api_pb2.BrokerHeartbeat(
                    cluster_name=request.cluster_name, broker_name=request.broker_name,
                    broker_addr=request.broker_addr)])
                return unchanged
        if should_stream(request):  # passed on to the leader in chunks, made only if it is passed on
            reply = self.write(context, "RegisterBrokerStream", _lazy(register_chunks, request), translate_fn,
                               register_reply, topics=len(request.topics))
        else:
            reply = self.write(context, "RegisterBroker", request, translate_fn, register_reply,
                               topics=len(request.topics))
        if self.node.log.is_leader():
            self.node.liveness.touch(request.broker_addr)
        return reply

    def _register_translation(self, request: api_pb2.RegisterBrokerRequest
                              ) -> Callable[[MetadataState], Translation]:
        default_ms = self.node.cfg.default_timeout_ms
        group0 = getattr(self.node, "group0", None)  # a group core's view of group 0 (NameServerNode.group0)
        if group0 is not None:
            return lambda s: group0(lambda s0: translate.register_broker(s, request, default_ms, group0=s0))
        return lambda s: translate.register_broker(s, request, default_ms)

    def unchanged_registration(self, request: api_pb2.RegisterBrokerRequest) -> api_pb2.RegisterBrokerReply | None:
        """The reply to a (validated) registration that changes nothing in this node's state, or None: it
        writes, or the state may be behind. Its liveness is the caller's to note: a follower's core buffers
        it for the leader, a worker tells its core (nameserver/remoting/corechannel.py)."""
        unchanged = self.node.unchanged_here(self._register_translation(request))
        return None if unchanged is None else register_reply(unchanged)

    @rpc
    def UnregisterBroker(self, request: api_pb2.UnregisterBrokerRequest, context: grpc.ServicerContext
                         ) -> api_pb2.WriteReply:
        validation.validate_unregister_broker(request)
        reply = self.write(context, "UnregisterBroker", request, lambda s: translate.unregister_broker(
            s, request.cluster_name, request.broker_name, request.broker_addr, request.broker_id),
            lambda res: api_pb2.WriteReply(offset=res.offset, records=res.records),
            later=False)  # forgotten once the unregistration is written
        self.node.forget_broker(request.broker_addr)
        return reply

    @rpc
    def Heartbeat(self, request: api_pb2.HeartbeatRequest, context: grpc.ServicerContext
                  ) -> api_pb2.HeartbeatReply:
        validation.validate_heartbeat(request)
        versions: dict[str, state_pb2.DataVersion] = {}
        unknown = self.node.heartbeat(request.heartbeats, versions)
        reply = api_pb2.HeartbeatReply(unknown_addrs=unknown, data_versions=versions)
        if forwarded(context) and (request.want_silences or request.HasField("handover")):  # a peer's sync
            silences = self.node.liveness_exchange(request.handover, request.want_silences)
            reply.silences_from_leader = silences is not None
            if silences is not None:
                reply.silences.CopyFrom(silences)
        return reply

    # ---- reads ---------------------------------------------------------------------------------

    @rpc
    def GetRoute(self, request: api_pb2.GetRouteRequest, context: grpc.ServicerContext
                 ) -> api_pb2.GetRouteReply:
        validation.validate_get_route(request)
        route, offsets = self._route(request, context)
        if route is None:
            context.set_trailing_metadata(((headers.APPLY_OFFSET, str(offsets[0])),))
            context.abort(grpc.StatusCode.NOT_FOUND, f"topic {request.topic} does not exist")
        return api_pb2.GetRouteReply(route=route, apply_offset=offsets[0], offsets=_vector(offsets))

    def _group0_min_offset(self, request: api_pb2.GetRouteRequest | api_pb2.GetClusterInfoRequest) -> int:
        """A one-group node's minimum: min_offset, or min_offsets' one entry (group 0's)."""
        if not request.min_offsets:
            return request.min_offset
        validation.check_min_offsets("min_offsets", request.min_offsets, 1)
        return max(request.min_offset, request.min_offsets[0])

    def _route(self, request: api_pb2.GetRouteRequest, context: grpc.ServicerContext
               ) -> tuple[api_pb2.TopicRoute | None, tuple[int, ...]]:
        """The topic's route (None: no such topic) and the offset it was read at, as a vector by group (one
        here; a worker with several groups merges them: nameserver/groups/reads.py)."""
        cfg = self.node.cfg
        route, offset = self.node.read_route(
            (request.topic, request.zone_name), lambda s: s.route(
                # A zone name is the caller's own opt-in (RocketMQ's ZoneRouteRPCHook filters whenever the
                # client sends __ZONE_MODE and __ZONE_NAME, whatever the nameserver's configuration).
                request.topic, zone_name=request.zone_name,
                order_message_enable=s.setting_on(settings.ORDER_MESSAGE_ENABLE, cfg.order_message_enable),
                support_acting_master=s.setting_on(settings.SUPPORT_ACTING_MASTER, False)),
            self._group0_min_offset(request), call_timeout(context, self.default_timeout, self.max_wait),
            context.is_active)
        return route, (offset,)

    @rpc
    def GetClusterInfo(self, request: api_pb2.GetClusterInfoRequest, context: grpc.ServicerContext
                       ) -> api_pb2.GetClusterInfoReply:
        validation.validate_get_cluster_info(request)
        info, offsets = self._cluster_info(request, context)
        info.apply_offset = offsets[0]
        info.offsets[:] = _vector(offsets)
        return info

    def _cluster_info(self, request: api_pb2.GetClusterInfoRequest, context: grpc.ServicerContext
                      ) -> tuple[api_pb2.GetClusterInfoReply, tuple[int, ...]]:
        info, offset = self._read(context, lambda s: s.cluster_info(), self._group0_min_offset(request))
        return info, (offset,)

    @rpc
    def GetTopicList(self, request: api_pb2.GetTopicListRequest, context: grpc.ServicerContext
                     ) -> api_pb2.GetTopicListReply:
        validation.validate_get_topic_list(request)
        switch = settings.ENABLE_ALL_TOPIC_LIST if request.kind == api_pb2.TOPIC_LIST_ALL else (
            None if request.kind == api_pb2.TOPIC_LIST_SYSTEM else settings.ENABLE_TOPIC_LIST)

        topics, offset = self._topic_list(request, context, switch)
        if topics is None:  # RocketMQ answers SYSTEM_ERROR "disable"
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"disable: this topic list is turned off "
                          f"(replicated setting {switch}=false)")
        return api_pb2.GetTopicListReply(topics=topics, apply_offset=offset)

    def _topic_list(self, request: api_pb2.GetTopicListRequest, context: grpc.ServicerContext, switch: str | None
                    ) -> tuple[list[str] | None, int]:
        """The list (None: turned off by the replicated `switch`) and the offset it was read at."""
        def topic_list(s: MetadataState) -> list[str] | None:
            if switch is not None and not s.setting_on(switch, True):
                return None
            return s.topic_list(request.kind, request.cluster_name)

        return self._read(context, topic_list, request.min_offset)

    @rpc
    def GetBrokerMemberGroup(self, request: api_pb2.GetBrokerMemberGroupRequest,
                             context: grpc.ServicerContext) -> api_pb2.GetBrokerMemberGroupReply:
        validation.validate_get_broker_member_group(request)
        group, offset = self._member_group(request, context)
        group.apply_offset = offset
        return group

    def _member_group(self, request: api_pb2.GetBrokerMemberGroupRequest, context: grpc.ServicerContext
                      ) -> tuple[api_pb2.GetBrokerMemberGroupReply, int]:
        """The set's member group and the offset it was read at (a worker with several groups reads the set's
        group: nameserver/groups/reads.py)."""
        return self._read(context, lambda s: s.broker_member_group(request.cluster_name, request.broker_name),
                          request.min_offset)

    # ---- KV ------------------------------------------------------------------------------------

    @rpc
    def PutKv(self, request: api_pb2.PutKvRequest, context: grpc.ServicerContext) -> api_pb2.WriteReply:
        validation.validate_put_kv(request)
        return self._write_reply(context, "PutKv", request,
                                 lambda s: translate.put_kv(s, request.namespace, request.key, request.value))

    @rpc
    def GetKv(self, request: api_pb2.GetKvRequest, context: grpc.ServicerContext) -> api_pb2.GetKvReply:
        validation.validate_get_kv(request)
        value, offset = self._read(context, lambda s: s.kv_get(request.namespace, request.key),
                                   request.min_offset)
        if value is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no KV config {request.namespace}/{request.key}")
        return api_pb2.GetKvReply(value=value, apply_offset=offset)

    @rpc
    def DeleteKv(self, request: api_pb2.DeleteKvRequest, context: grpc.ServicerContext
                 ) -> api_pb2.WriteReply:
        validation.validate_delete_kv(request)
        return self._write_reply(context, "DeleteKv", request,
                                 lambda s: translate.delete_kv(s, request.namespace, request.key))

    @rpc
    def ListKv(self, request: api_pb2.ListKvRequest, context: grpc.ServicerContext) -> api_pb2.ListKvReply:
        validation.validate_list_kv(request)
        (table, exists), offset = self._read(
            context, lambda s: (s.kv_list(request.namespace), s.kv_namespace_exists(request.namespace)),
            request.min_offset)
        return api_pb2.ListKvReply(table=table, apply_offset=offset, namespace_exists=exists)

    # ---- replicated settings ---------------------------------------------------------------------

    @rpc
    def UpdateSettings(self, request: api_pb2.UpdateSettingsRequest, context: grpc.ServicerContext
                       ) -> api_pb2.WriteReply:
        values = settings.canonical_values(request.settings)
        return self._write_reply(context, "UpdateSettings", request,
                                 lambda s: translate.update_settings(s, values))

    @rpc
    def GetSettings(self, request: api_pb2.GetSettingsRequest, context: grpc.ServicerContext
                    ) -> api_pb2.GetSettingsReply:
        stored, offset = self._read(context, lambda s: s.stored_settings(), request.min_offset)
        return api_pb2.GetSettingsReply(
            settings=settings.effective(stored, self.setting_defaults()), stored=sorted(stored),
            apply_offset=offset)

    def setting_defaults(self) -> dict[str, bool]:
        cfg = self.node.cfg
        return settings.node_defaults(cfg.order_message_enable, cfg.elect_unclean_master,
                                      cfg.notify_broker_role_changed)

    # ---- topics and permissions ------------------------------------------------------------------

    def _perm(self, context: grpc.ServicerContext, method: str, request: api_pb2.BrokerPermRequest,
              fn: Callable) -> api_pb2.BrokerPermReply:
        validation.validate_broker_perm(request)
        return self.write(context, method, request, lambda s: fn(s, request.broker_name),
                           lambda res: api_pb2.BrokerPermReply(
                               topic_count=res.translation.count if res.translation else 0, offset=res.offset))

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
        validation.validate_delete_topic(request)
        return self._write_reply(context, "DeleteTopic", request,
                                 lambda s: translate.delete_topic(s, request.topic, request.cluster_name))


    # ---- queue bindings ----------------------------------------------------------------------------

    @staticmethod
    def _binding_reply(topic: str, queue_id: int) -> Callable[[WriteResult], api_pb2.BindingReply]:
        """The binding this write produced: from its own record, never re-read from the state (a
        concurrent bind applied just after it would otherwise leak its owner and version in here).
        Its version is the offset of the write's entry."""

        def reply_of(res: WriteResult) -> api_pb2.BindingReply:
            reply = api_pb2.BindingReply(offset=res.offset)
            records = res.translation.batch.records if res.translation is not None else ()
            key = keys.bind_key(topic, queue_id)
            for rec in records:
                if rec.key == key and rec.op == entry_pb2.OP_PUT:
                    value = state_pb2.QueueBindingValue.FromString(rec.value)
                    reply.binding.CopyFrom(api_pb2.QueueBinding(topic=topic, queue_id=queue_id, owner=value.owner,
                                                                epoch=value.epoch, version=res.offset))
            return reply

        return reply_of

    @rpc
    def BindQueue(self, request: api_pb2.BindQueueRequest, context: grpc.ServicerContext) -> api_pb2.BindingReply:
        validation.validate_bind_queue(request)
        return self.write(context, "BindQueue", request, lambda s: translate.bind_queue(
            s, request.topic, request.queue_id, request.owner, request.expected_version),
            self._binding_reply(request.topic, request.queue_id))

    @rpc
    def ReleaseQueue(self, request: api_pb2.ReleaseQueueRequest, context: grpc.ServicerContext
                     ) -> api_pb2.BindingReply:
        validation.validate_release_queue(request)
        return self.write(context, "ReleaseQueue", request, lambda s: translate.release_queue(
            s, request.topic, request.queue_id, request.expected_version),
            lambda res: api_pb2.BindingReply(offset=res.offset))

    def consistent_read(self, context: grpc.ServicerContext, consistency: int, min_offset: int,
                         fn: Callable) -> tuple[Any, int]:
        if min_offset < 0:  # before the read index: a refused read must not cost a barrier in the log
            raise ValidationError("min_offset", "must be >= 0")
        if consistency == api_pb2.LINEARIZABLE:
            timeout = call_timeout(context, self.default_timeout, self.max_wait)
            index = self.node.linearizable_index(timeout)
            min_offset = max(min_offset, index)
        elif consistency != api_pb2.SERIALIZABLE:
            raise ValidationError("consistency", f"unknown consistency {consistency}")
        return self._read(context, fn, min_offset)

    @rpc
    def GetBinding(self, request: api_pb2.GetBindingRequest, context: grpc.ServicerContext
                   ) -> api_pb2.GetBindingReply:
        validation.validate_topic_name(request.topic, "topic")
        validation.validate_queue_id(request.queue_id, "queue_id")
        binding, offset = self.consistent_read(context, request.consistency, request.min_offset,
                                                lambda s: s.binding(request.topic, request.queue_id))
        if binding is None:
            return api_pb2.GetBindingReply(found=False, apply_offset=offset)
        return api_pb2.GetBindingReply(found=True, binding=binding, apply_offset=offset)

    @rpc
    def ListBindings(self, request: api_pb2.ListBindingsRequest, context: grpc.ServicerContext
                     ) -> api_pb2.ListBindingsReply:
        validation.validate_topic_name(request.topic, "topic")
        bindings, offset = self.consistent_read(context, request.consistency, request.min_offset,
                                                 lambda s: s.bindings(request.topic))
        return api_pb2.ListBindingsReply(bindings=bindings, apply_offset=offset)

    def Watch(self, request: api_pb2.WatchRequest, context: grpc.ServicerContext
              ) -> Iterator[api_pb2.WatchResponse]:
        try:
            prefixes = validation.validate_watch(request)
            if not self.node.log.ready:
                raise NotReady(self.node.not_ready_reason())
        except ValidationError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{exc.field}: {exc.message}")
        except NotReady as exc:
            context.abort(grpc.StatusCode.UNAVAILABLE, f"not ready: {exc}")
        watcher = self.node.watches.subscribe(prefixes)
        if watcher is None:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"this node already serves {self.node.watches.max_watchers} watchers; try another node")
        try:
            yield from self._watch(request, context, watcher)
        finally:
            self.node.watches.unsubscribe(watcher)

    def _watch(self, request: api_pb2.WatchRequest, context: grpc.ServicerContext, watcher: Watcher
               ) -> Iterator[api_pb2.WatchResponse]:
        progress_s = (request.progress_interval_ms or 1000) / 1000
        if request.start_offset > 0:
            last = request.start_offset
            try:  # replay what this node kept, then switch to the live feed (de-duplicated by offset)
                while batch := self.node.log.history.after(last, limit=500):
                    for entry in batch:
                        events = to_events(entry.changes, watcher.prefixes)
                        if events:
                            yield api_pb2.WatchResponse(offset=entry.offset, events=events)
                        last = entry.offset
            except Compacted as exc:
                context.abort(grpc.StatusCode.OUT_OF_RANGE,
                              f"compacted: {exc}; re-list with start_offset=0 (current state first)")
        else:
            last, current = self.node.inspect(lambda s: (s.kv.offset, [
                api_pb2.WatchEvent(type=t, key=k, value=v, version=ver)
                for k, v, ver, t in s.kv.items() if k.startswith(watcher.prefixes)]))
            current.sort(key=lambda e: e.key)
            for i in range(0, len(current), 1000):
                yield api_pb2.WatchResponse(offset=last, events=current[i:i + 1000], initial_state=True)
            yield api_pb2.WatchResponse(offset=last, initial_state=True, initial_state_done=True)
        while context.is_active():
            try:
                msg = watcher.pending.get(timeout=progress_s)
            except queue.Empty:
                # Progress: every entry up to the apply offset read here was offered to this watcher
                # before that offset was published (raftlog's listeners run first), so once the queue is
                # seen empty after the read, nothing at or below it is still owed to the client.
                applied = self.node.log.apply_offset
                if watcher.cut_off:
                    break
                if watcher.pending.empty():
                    yield api_pb2.WatchResponse(offset=max(last, applied))  # never backwards, on a lagging node
                continue
            if msg.offset > last:
                last = msg.offset
                yield msg
        if watcher.reset_at is not None:
            context.abort(grpc.StatusCode.UNAVAILABLE,
                          f"this node loaded a snapshot at offset {watcher.reset_at}; resume with "
                          f"start_offset={last} on another node, or re-list")
        if watcher.overflowed:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"watcher fell more than {self.node.watches.max_pending} entries behind; "
                          f"resume with start_offset={last}")

    @rpc
    def ReadIndex(self, request: api_pb2.ReadIndexRequest, context: grpc.ServicerContext) -> api_pb2.ReadIndexReply:
        if not self.node.log.is_leader():
            context.abort(grpc.StatusCode.UNAVAILABLE, "not the leader")
        index = self.node.leader_read_index(call_timeout(context, self.default_timeout, self.max_wait))
        return api_pb2.ReadIndexReply(read_index=index)


def register_reply(res: WriteResult) -> api_pb2.RegisterBrokerReply:
    """A registration's reply: its offset and records, and what the broker is told back."""
    t = res.translation
    if t is None:
        return api_pb2.RegisterBrokerReply()
    return api_pb2.RegisterBrokerReply(
        offset=res.offset, records=res.records, master_addr=t.master_addr,
        ha_server_addr=t.ha_server_addr, order_topic_config=t.order_topic_config or {},
        order_topic_config_exists=t.order_topic_config is not None)


def _lazy(make: Callable[[Any], list[Any]], arg: Any) -> Iterator[Any]:
    yield from make(arg)


def _vector(offsets: tuple[int, ...]) -> tuple[int, ...]:
    """A reply's `offsets`: each group's apply offset with several groups, empty with one (its apply_offset)."""
    return offsets if len(offsets) > 1 else ()


__all__ = ["FORWARD_CATCH_UP_S", "LEADER_WAIT_S", "NameServerService"]
