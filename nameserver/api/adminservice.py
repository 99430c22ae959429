"""The gRPC Admin service: a node's status, the membership, leadership transfer and snapshots. Changes
of the membership and of the leadership run on the leader; a follower passes them on."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from nameserver import validation
from nameserver.api.logservice import ReadReplicas
from nameserver.api.rpc import call_timeout, forwarded, rpc
from nameserver.core.node import MembershipError, NameServerNode
from nameserver.errors import ValidationError
from nameserver.pb import api_pb2, api_pb2_grpc, shards_pb2
from nameserver.state import MetadataState, Translation
from nameserver.state.shards import moves
from nameserver.state.shards.directory import GROUP0
from raftlog.pb import entry_pb2
from raftlog.roles import Role

_API_ROLE = {Role.FOLLOWER: api_pb2.ROLE_FOLLOWER, Role.CANDIDATE: api_pb2.ROLE_CANDIDATE,
             Role.LEADER: api_pb2.ROLE_LEADER}


class AdminService(api_pb2_grpc.AdminServicer):
    def __init__(self, node: NameServerNode, replicas: ReadReplicas | None = None) -> None:
        self.node = node
        self.replicas = replicas or ReadReplicas()
        # group 0's core of a sharded node: runs MoveSet on its leader (nameserver/groups/moveduty.py)
        self.mover: Callable[[str, int, float], shards_pb2.MoveShardReply] | None = None
        # [node] grpc_front = "go": the Go front end's process as the core sees it (nameserver/ops/gofront.py)
        self.front: Callable[[], api_pb2.GrpcFront] | None = None

    @rpc
    def Status(self, request: api_pb2.StatusRequest, context: grpc.ServicerContext) -> api_pb2.NodeStatus:
        st = self.node.status()
        st["role"] = _API_ROLE.get(st["role"], api_pb2.ROLE_UNKNOWN)
        return api_pb2.NodeStatus(**st, read_replicas=self.replicas.addresses(),
                                  grpc_front=self.front() if self.front is not None else None)

    @rpc
    def Members(self, request: api_pb2.MembersRequest, context: grpc.ServicerContext | None
                ) -> api_pb2.MembersReply:
        links = self.node.log.peer_links()
        leader = self.node.log.leader()
        leading = self.node.log.is_leader()
        members = []
        for addr in self.node.log.members():  # Raft's own view, changes at runtime included
            me = addr == self.node.cfg.raft_addr
            link = links.get(addr)
            connected = me or (link is not None and link.connected)
            match = self.node.log.end_offset if me else (link.match_index if link is not None else 0)
            members.append(api_pb2.Member(node_id=addr, grpc_addr=self.node.grpc_of(addr) or "", is_self=me,
                                          is_leader=addr == leader, connected=connected,
                                          match_offset=match if leading else 0))
        return api_pb2.MembersReply(members=members)

    def _on_leader(self, context: grpc.ServicerContext, method: str, request: Any, local: Callable[[float], Any]
                   ) -> Any:
        """Run an admin change on the leader: here when leading, else forwarded once."""
        timeout = call_timeout(context, 30.0, max(30.0, self.node.cfg.max_wait_ms / 1000))
        return self.node.forwarder.serve_or_forward(local, method, request, timeout, forwarded=forwarded(context),
                                                    service=api_pb2_grpc.AdminStub)

    def _member_reply(self) -> api_pb2.MemberChangeReply:
        return api_pb2.MemberChangeReply(members=self.Members(api_pb2.MembersRequest(), None).members)

    @rpc
    def AddMember(self, request: api_pb2.MemberChangeRequest, context: grpc.ServicerContext
                  ) -> api_pb2.MemberChangeReply:
        validation.check_node_addr("node_id", request.node_id)
        validation.check_node_addr("grpc_addr", request.grpc_addr)

        def local(timeout: float) -> api_pb2.MemberChangeReply:
            self.node.add_member(request.node_id, request.grpc_addr, timeout)
            return self._member_reply()

        return self._on_leader(context, "AddMember", request, local)

    @rpc
    def RemoveMember(self, request: api_pb2.MemberChangeRequest, context: grpc.ServicerContext
                     ) -> api_pb2.MemberChangeReply:
        validation.check_node_addr("node_id", request.node_id)

        def local(timeout: float) -> api_pb2.MemberChangeReply:
            self.node.remove_member(request.node_id, timeout)
            return self._member_reply()

        return self._on_leader(context, "RemoveMember", request, local)

    @rpc
    def TransferLeadership(self, request: api_pb2.TransferLeadershipRequest, context: grpc.ServicerContext
                           ) -> api_pb2.TransferLeadershipReply:
        if request.node_id:
            validation.check_node_addr("node_id", request.node_id)

        def local(timeout: float) -> api_pb2.TransferLeadershipReply:
            # Raft refuses an unknown target as if busy (UNAVAILABLE: retry): say what is wrong instead.
            if request.node_id and request.node_id not in self.node.log.members():
                raise MembershipError(f"{request.node_id} is not a member")
            if request.node_id == self.node.cfg.raft_addr:  # already there: nothing to move
                return api_pb2.TransferLeadershipReply(leader_id=self.node.cfg.raft_addr)
            self.node.log.transfer_leadership(request.node_id or None, timeout)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and self.node.log.is_leader():
                time.sleep(0.05)
            return api_pb2.TransferLeadershipReply(leader_id=self.node.log.leader() or "")

        return self._on_leader(context, "TransferLeadership", request, local)

    @rpc
    def AssignSet(self, request: api_pb2.AssignSetRequest, context: grpc.ServicerContext) -> api_pb2.WriteReply:
        """Group 0's directory record of a set before its first registration (sharding: a worker's call
        when the router says AssignFirst), or with `pin` an operator's choice of its group (moves.pin_set);
        refused on a node with one group, which writes no directory."""
        validation.check_name("broker_name", request.broker_name, "broker name")
        groups = self._directory_groups()
        if request.pin:
            moves.check_group(request.group, groups)
        elif request.group:
            raise ValidationError("group", "is set by pin only (the default assignment chooses the group)")

        def assign(state: MetadataState) -> Translation:
            if request.pin:
                return moves.pin_set(state, request.broker_name, request.group, groups)
            return moves.assign_set(state, request.broker_name, request.cluster_name, groups)

        def local(timeout: float) -> api_pb2.WriteReply:
            res = self.node.write(assign, timeout)
            return api_pb2.WriteReply(offset=res.offset, records=res.records)

        return self._on_leader(context, "AssignSet", request, local)

    @rpc
    def MoveSet(self, request: shards_pb2.ShardPlacement, context: grpc.ServicerContext
                ) -> shards_pb2.MoveShardReply:
        """Move a set between groups, on group 0's leader (its move duty); answered once done."""
        validation.check_name("broker_name", request.broker_name, "broker name")
        moves.check_group(request.group, self._directory_groups())
        mover = self.mover
        if mover is None:
            raise ValidationError("broker_name", "this core runs no move duty")
        return self._on_leader(context, "MoveSet", request,
                               lambda timeout: mover(request.broker_name, request.group, timeout))

    @rpc
    def ProposeStep(self, request: api_pb2.ProposeStepRequest, context: grpc.ServicerContext
                    ) -> api_pb2.WriteReply:
        """A move's step in this core's group, proposed as group 0's move duty made it (peer only: auth.py),
        on its leader. Its preconditions guard it; a step refused at apply answers records 0."""
        if self.node.cfg.groups < 2:
            raise ValidationError("batch", "a node with one group moves no sets")
        try:
            batch = entry_pb2.Batch.FromString(request.batch)
        except DecodeError as exc:  # checked here: the request decoded, its bytes field is the node's own
            raise ValidationError("batch", f"not a raftlog Batch: {exc}") from None
        moves.check_step(batch)

        def local(timeout: float) -> api_pb2.WriteReply:
            applied = self.node.log.propose(batch, timeout)
            return api_pb2.WriteReply(offset=applied.offset,
                                      records=len(batch.records) if applied.result.applied else 0)

        return self._on_leader(context, "ProposeStep", request, local)

    def _directory_groups(self) -> int:
        """[sharding] groups, on the core that holds the directory (group 0's), else a ValidationError."""
        groups = self.node.cfg.groups
        if groups < 2 or self.node.cfg.group != GROUP0:
            raise ValidationError("broker_name", "this core holds no directory: sets are placed in group 0 of "
                                  "a node with [sharding] groups > 1")
        return groups

    @rpc
    def TakeSnapshot(self, request: api_pb2.TakeSnapshotRequest, context: grpc.ServicerContext
                     ) -> api_pb2.TakeSnapshotReply:
        before = self.node.log.snapshot_offset
        target = self.node.log.apply_offset
        self.node.log.take_snapshot()
        deadline = time.monotonic() + call_timeout(context, 60.0, max(60.0, self.node.cfg.max_wait_ms / 1000))
        while time.monotonic() < deadline:
            if self.node.log.snapshot_offset > before or (before and before >= target):
                return api_pb2.TakeSnapshotReply(offset=self.node.log.snapshot_offset)
            time.sleep(0.05)
        context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "snapshot did not finish in time")


__all__ = ["AdminService"]
