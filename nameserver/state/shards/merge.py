"""A topic's route (the cluster info, a set's member group) from several groups' states, as one answer (docs/scaling.md,
"Sharding": reads merge).

Each group holds its own broker sets' records, so a topic's route is the union of each group's part of it,
each set's part taken only from the group the directory (group 0's) names: while a set moves, its copy in
the target is not read; once moved, its leftover in the source is not read. The parts are put in broker
name order and finished as one group's route is (acting-master view, zone filter, filter servers, group
0's order-topic config): for the same fleet the answer is the one group's answer.

Staleness rule: an answer carries an offset vector, each group's apply offset it was read at. It is read
only when every group is at least at (a) the offset the client asked for in that group (its min-offset
vector) and (b) the directory's floor for that group (a set moved there is read only once the copy is in).
Across groups an answer is not one cut: each group's part is at least as new as the vector asked.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from nameserver.pb import api_pb2
from nameserver.state.metadata import ORDER_TOPIC_CONFIG, MetadataState, RoutePart, build_route
from nameserver.state.shards.directory import GROUP0, Directory


class ReplicaBehind(Exception):
    """A group's state is older than the read needs: wait until each listed group reaches its offset."""

    def __init__(self, waits: dict[int, int]) -> None:
        super().__init__("groups behind the read: " + ", ".join(f"g{g} < {o}" for g, o in sorted(waits.items())))
        self.waits = waits


@dataclass(frozen=True, slots=True)
class MergedRoute:
    route: api_pb2.TopicRoute | None  # None: TOPIC_NOT_EXIST
    offsets: tuple[int, ...]          # each group's apply offset the answer was read at, by group


def waits_for(groups: Sequence[MetadataState], min_offsets: Sequence[int] = ()) -> dict[int, int]:
    """group -> the offset its state must reach before a merged read (empty: read now): the client's
    min-offset vector (shorter than the groups: no minimum for the rest) and the directory's floor."""
    need = groups[GROUP0].directory.floor()
    for group, offset in enumerate(min_offsets):
        if offset > need.get(group, 0):
            need[group] = offset
    return {group: offset for group, offset in need.items()
            if group >= len(groups) or groups[group].offset < offset}


def _readable(groups: Sequence[MetadataState], min_offsets: Sequence[int]) -> Directory:
    """The directory to read `groups` with, once no group must catch up first (else ReplicaBehind)."""
    waits = waits_for(groups, min_offsets)
    if waits:
        raise ReplicaBehind(waits)
    return groups[GROUP0].directory


def merge_route(groups: Sequence[MetadataState], topic: str, zone_name: str = "",
                order_message_enable: bool = False, support_acting_master: bool = False,
                min_offsets: Sequence[int] = ()) -> MergedRoute:
    """The topic's route over every group's state (`groups[k]` is group k's; group 0 holds the directory).
    ReplicaBehind when a group must catch up first (waits_for)."""
    directory = _readable(groups, min_offsets)
    parts: list[RoutePart] = []
    for group, state in enumerate(groups):
        parts += [part for part in state.route_parts(topic) if directory.group_of(part[0]) == group]
    parts.sort(key=lambda part: part[0])
    order_conf = (groups[GROUP0].kv_get(ORDER_TOPIC_CONFIG, topic) or "") if order_message_enable else None
    route = build_route(parts, topic, zone_name, support_acting_master,
                        lambda name, addr: groups[directory.group_of(name)].filter_servers(addr), order_conf)
    return MergedRoute(route, tuple(state.offset for state in groups))


def merge_cluster_info(groups: Sequence[MetadataState], min_offsets: Sequence[int] = ()
                       ) -> tuple[api_pb2.GetClusterInfoReply, tuple[int, ...]]:
    """GetClusterInfo over every group's state (brokerAddrTable and clusterAddrTable), each set's BrokerData
    from the group the directory names; with the offset vector it was read at. ReplicaBehind as merge_route."""
    directory = _readable(groups, min_offsets)
    reply = api_pb2.GetClusterInfoReply()
    clusters: dict[str, list[str]] = {}
    for group, state in enumerate(groups):
        for name, bd in state.cluster_info().broker_addr_table.items():
            if directory.group_of(name) == group:
                reply.broker_addr_table[name].CopyFrom(bd)
                clusters.setdefault(bd.cluster, []).append(name)
    for cluster, names in clusters.items():
        reply.cluster_addr_table[cluster].names.extend(sorted(names))
    return reply, tuple(state.offset for state in groups)


def merge_member_group(groups: Sequence[MetadataState], cluster_name: str, broker_name: str,
                       min_offsets: Sequence[int] = ()) -> tuple[api_pb2.GetBrokerMemberGroupReply, tuple[int, ...]]:
    """GetBrokerMemberGroup from the group the directory names for the set (its records are there alone),
    with the offset vector it was read at. ReplicaBehind as merge_route: just after a move, the set's new
    group is read only once its replica holds the copy (else the answer would be an empty group)."""
    directory = _readable(groups, min_offsets)
    reply = groups[directory.group_of(broker_name)].broker_member_group(cluster_name, broker_name)
    return reply, tuple(state.offset for state in groups)
