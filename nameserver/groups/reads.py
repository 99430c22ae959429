"""A worker's reads over every group's replica (docs/scaling.md, "Sharding", Step 2 item 3): GetRoute and
GetClusterInfo (gRPC, and the remoting codes, whose handlers call the same service) merged by
shards.merge from the replicas' states, the topic lists as the union of the groups'; every other read
(KV, settings, bindings: group 0's records) as one group's, from group 0's replica.

A merged read takes the replicas' locks in group order (no apply waits on another group's lock, so no
cycle), first waiting (bounded, and never on an event loop: WouldBlock) for each group to reach the caller's
offset vector (min_offsets[k]; min_offset is group 0's) and the directory's floor (ReplicaBehind). GetRoute
and GetClusterInfo answer the vector they were read at (`offsets`). A route computed once is kept
while no group's route generation moved: the cache is keyed by the vector of (state, generation) and looked
up before any lock is taken, as a one-group route read does (MergedReads.kept_route says why that is safe).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from typing import TypeVar

import grpc

from nameserver import validation
from nameserver.api.rpc import call_timeout
from nameserver.api.service import NameServerService
from nameserver.core.nowait import WouldBlock, waiting_allowed
from nameserver.core.reads import NotReady, OffsetNotReached
from nameserver.core.routecache import MISS, RouteCache, RouteKey
from nameserver.pb import api_pb2
from nameserver.replica import ReadReplica, ReplicaNode
from nameserver.state import MetadataState, settings
from nameserver.state.shards.merge import ReplicaBehind, merge_cluster_info, merge_member_group, merge_route

T = TypeVar("T")
MAX_CATCH_UPS = 3  # ReplicaBehind rounds one read waits through (each a directory change meanwhile)


def needed(min_offset: int, min_offsets: Sequence[int], groups: int) -> dict[int, int]:
    """group -> the offset a read must wait for: `min_offsets[k]` (a write reply's `offsets`), group 0's
    at least `min_offset`. ValidationError naming min_offsets for more entries than groups."""
    need = {0: min_offset}
    if min_offsets:
        validation.check_min_offsets("min_offsets", min_offsets, groups)
        for group, offset in enumerate(min_offsets):
            need[group] = max(need.get(group, 0), offset)
    return need


class MergedReads:
    """Reads over `replicas` (replicas[k] is group k's, on this worker)."""

    def __init__(self, replicas: Sequence[ReadReplica]) -> None:
        self.replicas = list(replicas)
        self.routes = RouteCache()

    def needed(self, min_offset: int, min_offsets: Sequence[int] = ()) -> dict[int, int]:
        return needed(min_offset, min_offsets, len(self.replicas))

    def read(self, fn: Callable[[list[MetadataState]], T], min_offset: int, timeout: float,
             alive: Callable[[], bool] | None = None, min_offsets: Sequence[int] = ()) -> T:
        """`fn(states)` once every replica is ready, each group has applied what `needed` says and no group
        is behind the directory's floor. NotReady, OffsetNotReached, WouldBlock as a one-group read."""
        deadline = time.monotonic() + timeout
        need = self.needed(min_offset, min_offsets)
        for _ in range(MAX_CATCH_UPS):
            for group, replica in enumerate(self.replicas):
                if not replica.ready:
                    raise NotReady(f"group {group}'s replica: {replica.not_ready_reason()}")
            for group, offset in need.items():
                self._wait(group, offset, deadline, alive)
            try:
                return self._locked(fn)
            except ReplicaBehind as behind:
                need = behind.waits
        raise OffsetNotReached(self.replicas[0].offset, min_offset)

    def _wait(self, group: int, offset: int, deadline: float, alive: Callable[[], bool] | None) -> None:
        replica = self.replicas[group]
        if replica.offset >= offset:
            return
        if not waiting_allowed():
            raise WouldBlock(f"group {group}'s replica has not applied {offset} yet")
        if not replica.wait_applied(offset, max(0.0, deadline - time.monotonic()), alive):
            raise OffsetNotReached(replica.offset, offset)

    def _locked(self, fn: Callable[[list[MetadataState]], T]) -> T:
        blocking = waiting_allowed()
        with ExitStack() as held:
            for replica in self.replicas:  # group order, always
                if not replica.lock.acquire(blocking=blocking):
                    raise WouldBlock("a group's state is busy")
                held.callback(replica.lock.release)
            return fn([replica.state for replica in self.replicas])

    def route(self, topic: str, zone_name: str, default_order: bool, min_offset: int, timeout: float,
              alive: Callable[[], bool] | None, min_offsets: Sequence[int] = ()
              ) -> tuple[api_pb2.TopicRoute | None, tuple[int, ...]]:
        """The topic's merged route (None: no such topic) and each group's offset it was read at."""
        key = (topic, zone_name)
        need = self.needed(min_offset, min_offsets)
        kept = self.kept_route(key, need)
        if kept is not None:
            return kept

        def compute(states: list[MetadataState]) -> tuple[api_pb2.TopicRoute | None, tuple[int, ...]]:
            group0 = states[0]
            merged = merge_route(states, topic, zone_name,
                                 group0.setting_on(settings.ORDER_MESSAGE_ENABLE, default_order),
                                 group0.setting_on(settings.SUPPORT_ACTING_MASTER, False))
            self.routes.put(key, _generations(states), merged.route)
            return merged.route, merged.offsets

        return self.read(compute, min_offset, timeout, alive, min_offsets)

    def kept_route(self, key: RouteKey, need: dict[int, int]
                   ) -> tuple[api_pb2.TopicRoute | None, tuple[int, ...]] | None:
        """The route kept for `key` at every group's current generation, with each group's offset, read
        without any lock; None when there is none (or a replica is not ready, or a group is below its `need`).

        Why no lock is needed: as for one group (nameserver/core/routecache.py), each group's apply moves its
        route generation before its offset, and this reads each group's offset before its generation, so a
        hit holds every route change of each group up to the offset read. The route was computed under the
        locks with every group at or past the directory's floor (merge_route refuses otherwise): the same
        generations mean the same directory (shard/ records move group 0's generation) and the same state
        objects, whose offsets only grow, so every group is still past that floor. The hit is what a read
        under the locks would compute now."""
        offsets: list[int] = []
        generations: list[tuple[int, int]] = []
        for replica in self.replicas:
            if not replica.ready:
                return None  # the locked read says why
            state = replica.state  # once: a snapshot install swaps it
            offsets.append(state.offset)  # the offset first, then the generation
            generations.append((id(state), state.route_generation))
        if any(offsets[group] < offset for group, offset in need.items()):
            return None
        kept = self.routes.get(key, tuple(generations))
        return None if kept is MISS else (kept, tuple(offsets))


def _generations(states: Sequence[MetadataState]) -> tuple[tuple[int, int], ...]:
    """The route cache's key part: each group's (state, route generation), in group order."""
    return tuple((id(state), state.route_generation) for state in states)


class MergedService(NameServerService):
    """A worker's NameServer service with several groups: routes, the cluster info and topic lists over
    every group (the hooks of NameServerService's reads); the rest as one group's over group 0's replica."""

    def __init__(self, node: ReplicaNode, reads: MergedReads) -> None:
        super().__init__(node)  # type: ignore[arg-type]  # the read API is all the replica methods use
        self.reads = reads

    def _route(self, request: api_pb2.GetRouteRequest, context: grpc.ServicerContext
               ) -> tuple[api_pb2.TopicRoute | None, tuple[int, ...]]:
        return self.reads.route(request.topic, request.zone_name, self.node.cfg.order_message_enable,
                                request.min_offset, self._timeout(context), context.is_active, request.min_offsets)

    def _cluster_info(self, request: api_pb2.GetClusterInfoRequest, context: grpc.ServicerContext
                      ) -> tuple[api_pb2.GetClusterInfoReply, tuple[int, ...]]:
        return self.reads.read(merge_cluster_info, request.min_offset, self._timeout(context), context.is_active,
                               request.min_offsets)

    def _topic_list(self, request: api_pb2.GetTopicListRequest, context: grpc.ServicerContext, switch: str | None
                    ) -> tuple[list[str] | None, int]:
        """The union of the groups' lists (each group lists its own brokers' topics), group 0's switch.
        Exact outside a move's copy-to-drop window (a moved set's leftover is listed until dropped)."""
        def union(states: list[MetadataState]) -> tuple[list[str] | None, int]:
            if switch is not None and not states[0].setting_on(switch, True):
                return None, states[0].offset
            found: set[str] = set()
            for state in states:
                found.update(state.topic_list(request.kind, request.cluster_name))
            return sorted(found), states[0].offset

        return self.reads.read(union, request.min_offset, self._timeout(context), context.is_active)

    def _member_group(self, request: api_pb2.GetBrokerMemberGroupRequest, context: grpc.ServicerContext
                      ) -> tuple[api_pb2.GetBrokerMemberGroupReply, int]:
        """From the group the directory names for the set, once that group's replica is past the directory's
        floor (ReplicaBehind: just after a move, its copy)."""
        reply, offsets = self.reads.read(lambda states: merge_member_group(states, request.cluster_name,
                                                                           request.broker_name),
                                         request.min_offset, self._timeout(context), context.is_active)
        return reply, offsets[0]

    def _timeout(self, context: grpc.ServicerContext) -> float:
        return call_timeout(context, self.default_timeout, self.max_wait)
