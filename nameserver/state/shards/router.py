"""Which Raft group a request goes to, from the directory (docs/scaling.md, "Sharding").

A request about one broker set's NameServer records (its registration, unregistration, heartbeat, write
permission) goes to the set's group, so every precondition its translation writes is on that group's keys.
A request about no broker set (KV, settings, queue bindings) goes to group 0, and so does every controller
request (RIP-44): all controller records (`ctrl/<name>`) are group 0's, whichever group holds the set's
routes (docs/scaling.md, "Controller mode with groups"). A request about several sets
is split, one part per group (a heartbeat batch, a topic registered on several brokers), or sent to every
group (a topic deleted: each group deletes its own brokers' queue datas). With one group everything is
group 0's and the directory is never read.

The answer is a `Placement`: where to send it, or what must happen first (the set has no group yet: group 0
assigns it; the set is moving: refuse, the sender retries).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from google.protobuf.message import Message

from nameserver.pb import api_pb2
from nameserver.state.shards.directory import GROUP0, Directory


@dataclass(frozen=True, slots=True)
class ToGroup:
    """Send the request to this group's core (its leader, by the one forwarding path)."""

    group: int


@dataclass(frozen=True, slots=True)
class AssignFirst:
    """The set has no group yet and this request creates its records: group 0 writes its directory record
    first (moves.assign_set), then the request is routed again."""

    broker_name: str
    cluster: str


@dataclass(frozen=True, slots=True)
class Moving:
    """The set is moving between groups: refuse the write with a retriable error naming `target` (the
    source refuses it anyway; refusing before the hop saves it). Reads and heartbeats still go to `source`."""

    broker_name: str
    source: int
    target: int


@dataclass(frozen=True, slots=True)
class Split:
    """One request per group, each the original's part about that group's sets, in group order."""

    parts: tuple[tuple[int, Message], ...]


Placement = ToGroup | AssignFirst | Moving | Split

_TO_GROUP0 = ToGroup(GROUP0)


def route(request: Message, directory: Directory, groups: int) -> Placement:
    """Where `request` (an api_pb2 request of a write, or of a read about one broker set) goes.
    TypeError for a request of no rule here: routing one of them by guess would break the invariant
    that a translation's preconditions are all in one group."""
    rule = _RULES.get(type(request))
    if rule is None:
        raise TypeError(f"no sharding rule for {type(request).__name__}")
    if groups == 1:
        return _TO_GROUP0
    return rule(request, directory, groups)


def _set_write(name: str, cluster: str, directory: Directory, creates: bool) -> Placement:
    """A write of one set's records. `creates`: it may write the set's first records (a registration)."""
    target = directory.moving_to(name)
    if target is not None:
        return Moving(name, directory.group_of(name), target)
    if creates and not directory.assigned(name):
        return AssignFirst(name, cluster)
    return ToGroup(directory.group_of(name))  # no record: group 0's (a set from before sharding, or none)


def _register(req: Message, directory: Directory, groups: int) -> Placement:
    assert isinstance(req, api_pb2.RegisterBrokerRequest)
    return _set_write(req.broker_name, req.cluster_name, directory, creates=True)


_SET_CHANGES = (api_pb2.UnregisterBrokerRequest, api_pb2.BrokerPermRequest)
_SET_READS = (api_pb2.GetBrokerMemberGroupRequest,)


def _set_change(req: Message, directory: Directory, groups: int) -> Placement:
    """A write that changes an existing set's records (or finds none: its translation is then empty)."""
    assert isinstance(req, _SET_CHANGES)
    return _set_write(req.broker_name, "", directory, creates=False)


def _set_read(req: Message, directory: Directory, groups: int) -> Placement:
    """A read about one set's NameServer records: the group holding them."""
    assert isinstance(req, _SET_READS)
    return ToGroup(directory.group_of(req.broker_name))


def _group0(req: Message, directory: Directory, groups: int) -> Placement:
    return _TO_GROUP0


def _heartbeats(req: Message, directory: Directory, groups: int) -> Placement:
    """Each broker's heartbeat to the leader of its set's group (each group's leader expires its own
    brokers). The fields between nodes (want_silences, handover) are a group's own exchange, never routed."""
    assert isinstance(req, api_pb2.HeartbeatRequest)
    by_group: dict[int, api_pb2.HeartbeatRequest] = {}
    for hb in req.heartbeats:
        group = directory.group_of(hb.broker_name)
        part = by_group.get(group)
        if part is None:
            by_group[group] = part = api_pb2.HeartbeatRequest()
        part.heartbeats.append(hb)
    return _split_or_one(by_group)


def _register_topic(req: Message, directory: Directory, groups: int) -> Placement:
    """Each group registers the topic on its own brokers (not one atomic write: each part is, and the
    request is idempotent, so a sender retries the whole on a failed part). A broker whose set is moving
    refuses the whole request (retriable), as a registration of that set would be."""
    assert isinstance(req, api_pb2.RegisterTopicRequest)
    by_group: dict[int, api_pb2.RegisterTopicRequest] = {}
    for qd in req.queue_datas:
        target = directory.moving_to(qd.broker_name)
        if target is not None:
            return Moving(qd.broker_name, directory.group_of(qd.broker_name), target)
        group = directory.group_of(qd.broker_name)  # no record: group 0's, which refuses an unknown broker
        part = by_group.get(group)
        if part is None:
            by_group[group] = part = api_pb2.RegisterTopicRequest(topic=req.topic)
        part.queue_datas.append(qd)
    if not by_group:
        return _TO_GROUP0  # no queue datas: group 0 answers as one group would (nothing to write)
    return _split_or_one(by_group)


def _every_group(req: Message, directory: Directory, groups: int) -> Placement:
    """A topic deleted: every group deletes its own brokers' queue datas of it."""
    return Split(tuple((group, req) for group in range(groups)))


def _split_or_one(by_group: Mapping[int, Message]) -> Placement:
    if len(by_group) == 1:
        return ToGroup(next(iter(by_group)))
    return Split(tuple(sorted(by_group.items(), key=lambda item: item[0])))


_Rule = Callable[[Message, Directory, int], Placement]
_RULES: dict[type[Message], _Rule] = {
    api_pb2.RegisterBrokerRequest: _register,
    api_pb2.UnregisterBrokerRequest: _set_change,
    api_pb2.HeartbeatRequest: _heartbeats,
    api_pb2.BrokerPermRequest: _set_change,  # wipe / add write permission
    api_pb2.RegisterTopicRequest: _register_topic,
    api_pb2.DeleteTopicRequest: _every_group,
    api_pb2.PutKvRequest: _group0,
    api_pb2.DeleteKvRequest: _group0,
    api_pb2.UpdateSettingsRequest: _group0,
    api_pb2.BindQueueRequest: _group0,
    api_pb2.ReleaseQueueRequest: _group0,
    api_pb2.GetBrokerMemberGroupRequest: _set_read,
    # controller mode (RIP-44): every ctrl/ record is group 0's, never a set's group's (the controller port is
    # group 0's core's; a set's move leaves its ctrl/ record where it is): docs/scaling.md
    api_pb2.ApplyBrokerIdRequest: _group0,
    api_pb2.ControllerRegisterRequest: _group0,
    api_pb2.BrokerSetRequest: _group0,  # GetNextBrokerId, GetReplicaInfo
    api_pb2.ElectMasterRequest: _group0,
    api_pb2.AlterSyncStateSetRequest: _group0,
    api_pb2.CleanBrokerDataRequest: _group0,
    api_pb2.ControllerHeartbeatRequest: _group0,  # kept by the node that got it, read by group 0's leader's scan
    api_pb2.ListBrokerSetsRequest: _group0,
}
