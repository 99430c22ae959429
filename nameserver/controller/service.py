"""The gRPC Controller service: controller mode's calls on this node (api.proto, service Controller).

Writes go through the NameServer service's one write path (decided on the Raft leader, forwarded by a
follower). Before deciding, the leader confirms a read index, so a refusal or a "nothing to change" is
decided on a state that holds every write acknowledged before the call: refusals are linearizable too,
and decisions that change a set are fenced by its record's version at apply time (state/controller.py).
Reads are linearizable unless SERIALIZABLE is asked for. Heartbeats stay on the node that got them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import grpc

from nameserver import validation
from nameserver.api.rpc import rpc
from nameserver.api.service import NameServerService
from nameserver.controller.heartbeats import HeartbeatTable
from nameserver.core.forwarder import NoLeader
from nameserver.core.node import NameServerNode, WriteResult
from nameserver.pb import api_pb2, api_pb2_grpc
from nameserver.state import MetadataState, settings
from nameserver.state import controller as decide

log = logging.getLogger("nameserver.controller")

RoleChange = Callable[[api_pb2.BrokerSetView], None]


class ControllerService(api_pb2_grpc.ControllerServicer):
    def __init__(self, node: NameServerNode, ns: NameServerService, heartbeats: HeartbeatTable,
                 on_elected: RoleChange | None = None) -> None:
        self.node = node
        self.ns = ns
        self.heartbeats = heartbeats
        self.on_elected = on_elected  # told of each master this node elected (to notify the set's brokers)

    # ---- plumbing --------------------------------------------------------------------------------

    def _view(self, d: decide.Decision) -> api_pb2.BrokerSetView | None:
        return None if d.after is None else decide.set_view(d.broker_name, d.after, self.heartbeats)

    def _reply(self, res: WriteResult) -> api_pb2.ControllerReply:
        d = res.translation
        if not isinstance(d, decide.Decision):  # a retried exactly-once write: the stored reply fills it in
            return api_pb2.ControllerReply()
        reply = api_pb2.ControllerReply(code=d.code, remark=d.remark, next_broker_id=d.next_broker_id,
                                        offset=res.offset if d.batch.records else 0, set_version=d.read_version)
        view = self._view(d)
        if view is not None:
            reply.set.CopyFrom(view)
        return reply

    def _confirm(self, context: grpc.ServicerContext) -> None:
        """Leader: wait until this node has applied a read index taken now (a heartbeat round)."""
        self.ns.consistent_read(context, api_pb2.LINEARIZABLE, 0, lambda s: None)

    def _decide(self, context: grpc.ServicerContext, method: str, request: Any,
                decision: Callable[[MetadataState], decide.Decision]) -> api_pb2.ControllerReply:
        taken: list[tuple[decide.Decision, bool]] = []
        notify_default = self.node.cfg.notify_broker_role_changed

        def translate(state: MetadataState) -> decide.Decision:
            d = decision(state)
            taken[:] = [(d, state.setting_on(settings.NOTIFY_BROKER_ROLE_CHANGED, notify_default))]
            return d

        if self.node.log.is_leader():
            self._confirm(context)
        reply = self.ns.write(context, method, request, translate, self._reply,
                              service=api_pb2_grpc.ControllerStub)
        # Only the node that decided (the leader) notifies; a follower that forwarded never ran `translate`.
        if taken and taken[0][0].elected and taken[0][1] and reply.code == decide.SUCCESS and reply.offset \
                and self.on_elected:
            self.on_elected(reply.set)
        return reply

    def _read(self, context: grpc.ServicerContext, consistency: int, fn: Callable[[MetadataState], Any]
              ) -> tuple[Any, int]:
        return self.ns.consistent_read(context, consistency, 0, fn)

    # ---- brokers' registration -------------------------------------------------------------------

    @rpc
    def GetNextBrokerId(self, request: api_pb2.BrokerSetRequest, context: grpc.ServicerContext
                        ) -> api_pb2.ControllerReply:
        validation.validate_controller_set(request)
        next_id, offset = self._read(context, request.consistency,
                                     lambda s: decide.next_broker_id(s, request.broker_name))
        return api_pb2.ControllerReply(next_broker_id=next_id)

    @rpc
    def ApplyBrokerId(self, request: api_pb2.ApplyBrokerIdRequest, context: grpc.ServicerContext
                      ) -> api_pb2.ControllerReply:
        validation.validate_apply_broker_id(request)
        return self._decide(context, "ApplyBrokerId", request, lambda s: decide.apply_broker_id(
            s, request.cluster_name, request.broker_name, request.broker_id, request.register_check_code))

    @rpc
    def RegisterBroker(self, request: api_pb2.ControllerRegisterRequest, context: grpc.ServicerContext
                       ) -> api_pb2.ControllerReply:
        validation.validate_controller_register(request)
        return self._decide(context, "RegisterBroker", request, lambda s: decide.register_broker(
            s, request.broker_name, request.broker_id, request.broker_address, self.heartbeats))

    # ---- election and in-sync replicas -----------------------------------------------------------

    @rpc
    def ElectMaster(self, request: api_pb2.ElectMasterRequest, context: grpc.ServicerContext
                    ) -> api_pb2.ControllerReply:
        validation.validate_elect_master(request)
        unclean = self.node.cfg.elect_unclean_master  # the default; the replicated setting wins
        return self._decide(context, "ElectMaster", request, lambda s: decide.elect_master(
            s, request.broker_name, request.broker_id, request.designate_elect, self.heartbeats,
            s.setting_on(settings.ENABLE_ELECT_UNCLEAN_MASTER, unclean)))

    @rpc
    def AlterSyncStateSet(self, request: api_pb2.AlterSyncStateSetRequest, context: grpc.ServicerContext
                          ) -> api_pb2.ControllerReply:
        validation.validate_alter_sync_state_set(request)
        return self._decide(context, "AlterSyncStateSet", request, lambda s: decide.alter_sync_state_set(
            s, request.broker_name, request.master_id, request.master_epoch, request.sync_state_set,
            request.sync_state_set_epoch, self.heartbeats))

    @rpc
    def CleanBrokerData(self, request: api_pb2.CleanBrokerDataRequest, context: grpc.ServicerContext
                        ) -> api_pb2.ControllerReply:
        validation.validate_clean_broker_data(request)
        reply = self._decide(context, "CleanBrokerData", request, lambda s: decide.clean_broker_data(
            s, request.broker_name, request.broker_ids, request.clean_living_broker, self.heartbeats))
        if reply.code == decide.SUCCESS:
            self.heartbeats.forget(request.broker_name, list(request.broker_ids))
        return reply

    # ---- reads -----------------------------------------------------------------------------------

    @rpc
    def GetReplicaInfo(self, request: api_pb2.BrokerSetRequest, context: grpc.ServicerContext
                       ) -> api_pb2.ControllerReply:
        validation.validate_controller_set(request)
        d, _ = self._read(context, request.consistency, lambda s: decide.replica_info(s, request.broker_name))
        reply = api_pb2.ControllerReply(code=d.code, remark=d.remark, set_version=d.read_version)
        view = self._view(d)
        if view is not None:
            reply.set.CopyFrom(view)
        return reply

    @rpc
    def ListBrokerSets(self, request: api_pb2.ListBrokerSetsRequest, context: grpc.ServicerContext
                       ) -> api_pb2.ListBrokerSetsReply:
        for i, name in enumerate(request.broker_names):
            validation.validate_name(name, f"broker_names[{i}]")

        def sets(s: MetadataState) -> list[api_pb2.BrokerSetView]:
            names = list(request.broker_names) or s.controller_set_names()
            views = (decide.view(s, name, self.heartbeats) for name in names)
            return [v for v in views if v is not None]

        views, offset = self._read(context, request.consistency, sets)
        return api_pb2.ListBrokerSetsReply(sets=views, apply_offset=offset)

    # ---- this node's own -------------------------------------------------------------------------

    @rpc
    def Heartbeat(self, request: api_pb2.ControllerHeartbeatRequest, context: grpc.ServicerContext
                  ) -> api_pb2.ControllerHeartbeatReply:
        validation.validate_controller_heartbeat(request)
        self.heartbeats.beat(request)
        return api_pb2.ControllerHeartbeatReply()

    @rpc
    def GetLeader(self, request: api_pb2.ControllerLeaderRequest, context: grpc.ServicerContext
                  ) -> api_pb2.ControllerLeaderReply:
        cfg = self.node.cfg
        leader = self.node.log.leader() or ""
        # RocketMQ lists peers as <id>:<address>, its DLedger ids being ours Raft addresses
        peers = [f"{m}:{addr}" for m in self.node.log.members() if (addr := cfg.controller_of(m))]
        reply = api_pb2.ControllerLeaderReply(leader_id=leader, is_leader=self.node.log.is_leader(), peers=peers)
        if reply.is_leader:
            reply.leader_address = cfg.controller_addr
        elif leader:
            reply.leader_address = cfg.controller_of(leader) or self._ask_leader(context)
        return reply

    def _ask_leader(self, context: grpc.ServicerContext) -> str:
        """The leader's own controller address, when this node's config does not list it."""
        try:
            answer = self.node.forwarder.call("GetLeader", api_pb2.ControllerLeaderRequest(), 2.0,
                                              service=api_pb2_grpc.ControllerStub)
        except NoLeader:
            return ""
        except grpc.RpcError as exc:
            log.info("controller: could not ask the leader for its controller address: %s", exc.code())
            return ""
        return answer.leader_address if answer.is_leader else ""


__all__ = ["ControllerService"]
