"""Controller mode (RIP-44): the leader's decisions on a broker set, as records. Pure, like translate.py.

Apache RocketMQ 5's controller elects each broker set's master and keeps, per set, the broker ids and
addresses (BrokerReplicaInfo) and the master, its epoch and the in-sync replicas (SyncStateInfo). Here a
set is one record, `ctrl/<brokerName>` (a ControllerBrokerSet), and every decision that changes it is a
batch with a precondition on that record's version: a concurrent decision turns it into a no-op and the
leader decides again, so decisions are linearizable like every other write.

The decisions follow Apache RocketMQ's ReplicasInfoManager and DefaultElectPolicy (read as the spec,
docs/controller.md): the same checks in the same order, the same response codes and remarks. Whether a
broker is alive comes from the deciding node's heartbeat table, passed in as a `Liveness`.
Departures, each on purpose:
- A first election elects the asking broker only when it has a broker id in the set.
- Candidates of equal rank are ordered by broker id (RocketMQ's TreeSet keeps an arbitrary one).
- Cleaning the last in-sync replica or the last replica removes the whole set (RocketMQ drops only
  the emptied table, which leaves the set half-registered).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from nameserver.pb import api_pb2, state_pb2
from nameserver.state import keys
from nameserver.state.metadata import MetadataState
from nameserver.state.translate import Translation, canonical
from raftlog.pb import entry_pb2

FIRST_BROKER_ID = 1  # RocketMQ's MixAll.FIRST_BROKER_CONTROLLER_ID
NO_BROKER = -1       # an election not asked for by a broker (the controller's scan, or an admin by policy)

# Apache RocketMQ's response codes for the controller (ResponseCode.java).
SUCCESS = 0
FENCED_MASTER_EPOCH = 2000
FENCED_SYNC_STATE_SET_EPOCH = 2001
INVALID_MASTER = 2002
INVALID_REPLICAS = 2003
MASTER_NOT_AVAILABLE = 2004
INVALID_REQUEST = 2005
BROKER_NOT_ALIVE = 2006
NOT_LEADER = 2007
BROKER_METADATA_NOT_EXIST = 2008
INVALID_CLEAN_BROKER_METADATA = 2009
BROKER_NEED_TO_BE_REGISTERED = 2010
MASTER_STILL_EXIST = 2011
ELECT_MASTER_FAILED = 2012
ALTER_SYNC_STATE_SET_FAILED = 2013
BROKER_ID_INVALID = 2014


class Liveness(Protocol):
    """The deciding node's view of broker heartbeats (nameserver/controller/heartbeats.py)."""

    def alive(self, broker_name: str, broker_id: int) -> bool: ...

    def rank(self, broker_name: str, broker_id: int) -> tuple[int, int, int] | None:
        """(epoch, max offset, election priority) from the broker's last heartbeat; None if unknown."""
        ...


@dataclass(slots=True)
class Decision(Translation):
    """A controller decision: the batch to propose (maybe empty) and what to answer."""

    broker_name: str = ""
    code: int = SUCCESS
    remark: str = ""
    after: state_pb2.ControllerBrokerSet | None = None  # the set as the decision leaves it (None: absent)
    next_broker_id: int = 0
    read_version: int = 0  # the version of the set's record the decision read (0: absent)
    elected: bool = False  # a new master was elected: the set's brokers are told (NOTIFY_BROKER_ROLE_CHANGED)


def _refuse(broker_name: str, code: int, remark: str, current: state_pb2.ControllerBrokerSet | None = None,
            version: int = 0) -> Decision:
    return Decision(broker_name=broker_name, code=code, remark=remark, after=current, read_version=version)


def _write(state: MetadataState, broker_name: str, version: int, new: state_pb2.ControllerBrokerSet | None,
           code: int = SUCCESS, remark: str = "") -> Decision:
    """A decision that writes the set (or deletes it: `new` None), guarded by the version it was read at."""
    key = keys.controller_key(broker_name)
    batch = entry_pb2.Batch()
    if new is None:
        batch.records.append(entry_pb2.Record(type=keys.CONTROLLER_TYPE, op=entry_pb2.OP_DELETE, key=key))
    else:
        value = canonical(new)
        if value == state.kv.get(key):
            return Decision(broker_name=broker_name, code=code, remark=remark, after=new, read_version=version)
        batch.records.append(entry_pb2.Record(type=keys.CONTROLLER_TYPE, op=entry_pb2.OP_PUT, key=key, value=value))
    batch.preconditions.append(entry_pb2.Precondition(key=key, version=version))
    return Decision(batch=batch, broker_name=broker_name, code=code, remark=remark, after=new, read_version=version)


def _ids(bs: state_pb2.ControllerBrokerSet) -> list[int]:
    return [r.broker_id for r in bs.replicas]


def _address(bs: state_pb2.ControllerBrokerSet, broker_id: int) -> str:
    return next((r.address for r in bs.replicas if r.broker_id == broker_id), "")


def _set_sync(bs: state_pb2.ControllerBrokerSet, ids: Iterable[int]) -> None:
    del bs.sync_state_set[:]
    bs.sync_state_set.extend(sorted(set(ids)))


def _fmt_set(ids: Iterable[int]) -> str:
    return "[" + ", ".join(str(i) for i in sorted(ids)) + "]"


# ---- reads ---------------------------------------------------------------------------------------

def next_broker_id(state: MetadataState, broker_name: str) -> int:
    found = state.controller_set(broker_name)
    return FIRST_BROKER_ID if found is None else found[0].next_broker_id


def view(state: MetadataState, broker_name: str, live: Liveness) -> api_pb2.BrokerSetView | None:
    found = state.controller_set(broker_name)
    return None if found is None else set_view(broker_name, found[0], live)


def set_view(broker_name: str, bs: state_pb2.ControllerBrokerSet, live: Liveness) -> api_pb2.BrokerSetView:
    in_sync = set(bs.sync_state_set)
    return api_pb2.BrokerSetView(
        cluster_name=bs.cluster_name, broker_name=broker_name, master_id=bs.master_id,
        master_address=_address(bs, bs.master_id), master_epoch=bs.master_epoch,
        sync_state_set=bs.sync_state_set, sync_state_set_epoch=bs.sync_state_set_epoch,
        next_broker_id=bs.next_broker_id,
        replicas=[api_pb2.ControllerReplicaView(broker_id=r.broker_id, address=r.address,
                                                alive=live.alive(broker_name, r.broker_id),
                                                in_sync=r.broker_id in in_sync) for r in bs.replicas])


def replica_info(state: MetadataState, broker_name: str) -> Decision:
    """CONTROLLER_GET_REPLICA_INFO: the master (alive or not) and the in-sync replicas."""
    found = state.controller_set(broker_name)
    if found is None:
        return _refuse(broker_name, BROKER_METADATA_NOT_EXIST, "Broker metadata is not existed")
    return Decision(broker_name=broker_name, after=found[0], read_version=found[1])


def needs_election(state: MetadataState, live: Liveness) -> list[str]:
    """Sets whose master stopped heartbeating while another of their brokers still does (the leader's scan)."""
    out = []
    for name in state.controller_set_names():
        found = state.controller_set(name)
        if found is None:
            continue
        bs = found[0]
        if bs.master_id and not live.alive(name, bs.master_id) and any(live.alive(name, i) for i in _ids(bs)):
            out.append(name)
    return out


# ---- registration --------------------------------------------------------------------------------

def apply_broker_id(state: MetadataState, cluster_name: str, broker_name: str, broker_id: int,
                    register_check_code: str) -> Decision:
    """CONTROLLER_APPLY_BROKER_ID: a broker claims the id it was offered (or the one on its disk)."""
    address = register_check_code.split(";")[0]
    found = state.controller_set(broker_name)
    if found is None:
        if broker_id != FIRST_BROKER_ID:
            return _refuse(broker_name, BROKER_ID_INVALID,
                           f"Broker-set: {broker_name} hasn't been registered in controller, but broker try to "
                           f"apply brokerId: {broker_id}")
        new = state_pb2.ControllerBrokerSet(
            cluster_name=cluster_name, next_broker_id=FIRST_BROKER_ID + 1,
            replicas=[state_pb2.ControllerReplica(broker_id=broker_id, address=address,
                                                  register_check_code=register_check_code)])
        return _write(state, broker_name, 0, new)
    bs, version = found
    current = next((r for r in bs.replicas if r.broker_id == broker_id), None)
    if current is not None:
        if current.register_check_code == register_check_code:
            return Decision(broker_name=broker_name, after=bs, read_version=version)  # this broker again
        return _refuse(broker_name, BROKER_ID_INVALID,
                       f"Fail to apply brokerId: {broker_id} in broker-set: {broker_name}", bs, version)
    new = state_pb2.ControllerBrokerSet()
    new.CopyFrom(bs)
    new.replicas.append(state_pb2.ControllerReplica(broker_id=broker_id, address=address,
                                                    register_check_code=register_check_code))
    new.replicas.sort(key=lambda r: r.broker_id)
    new.next_broker_id += 1  # RocketMQ counts assignments, whatever id was applied
    return _write(state, broker_name, version, new)


def register_broker(state: MetadataState, broker_name: str, broker_id: int, address: str,
                    live: Liveness) -> Decision:
    """CONTROLLER_REGISTER_BROKER: a broker with an id comes (back) online; its address may have moved.
    The answer names the master only while it is alive (`Decision.after` is the set; the caller checks)."""
    found = state.controller_set(broker_name)
    if found is None:
        return _refuse(broker_name, BROKER_NEED_TO_BE_REGISTERED,
                       f"Broker-set: {broker_name} hasn't been registered in controller")
    bs, version = found
    if broker_id not in _ids(bs):
        return _refuse(broker_name, BROKER_NEED_TO_BE_REGISTERED,
                       f"BrokerId: {broker_id} hasn't been registered in broker-set: {broker_name}", bs, version)
    if _address(bs, broker_id) == address:
        return Decision(broker_name=broker_name, after=bs, read_version=version)
    new = state_pb2.ControllerBrokerSet()
    new.CopyFrom(bs)
    for r in new.replicas:
        if r.broker_id == broker_id:
            r.address = address
    return _write(state, broker_name, version, new)


def master_alive(bs: state_pb2.ControllerBrokerSet, broker_name: str, live: Liveness) -> bool:
    return bool(bs.master_id) and live.alive(broker_name, bs.master_id)


# ---- election ------------------------------------------------------------------------------------

def _choose(broker_name: str, candidates: Iterable[int], old_master: int, prefer: int | None,
            live: Liveness) -> int | None:
    """DefaultElectPolicy.tryElect over one candidate set: alive ones only; the old master if still
    alive and not overridden; the preferred one or nobody; else the best (epoch, offset) then priority."""
    alive = sorted(i for i in set(candidates) if live.alive(broker_name, i))
    if not alive:
        return None
    if old_master in alive and (prefer is None or prefer == old_master):
        return old_master
    if prefer is not None:
        return prefer if prefer in alive else None

    def order(broker_id: int) -> tuple[int, int, int, int]:
        epoch, offset, priority = live.rank(broker_name, broker_id) or (0, 0, 0)
        return -epoch, -offset, priority, broker_id

    return min(alive, key=order)


def elect_master(state: MetadataState, broker_name: str, broker_id: int, designate: bool, live: Liveness,
                 unclean: bool = False) -> Decision:
    """CONTROLLER_ELECT_MASTER: from the in-sync replicas (then any replica, when `unclean`); a new master
    bumps both epochs and leaves itself alone in sync. `broker_id` NO_BROKER: asked by the controller's
    scan or by an admin by policy; a failure then records that the set has no master."""
    found = state.controller_set(broker_name)
    if found is None:
        return _refuse(broker_name, BROKER_NEED_TO_BE_REGISTERED, "Broker hasn't been registered")
    bs, version = found
    old = bs.master_id
    new_master: int | None = None
    if bs.master_epoch == 0 and broker_id in _ids(bs):
        new_master = broker_id  # the first election: whoever asks first
    if new_master is None:
        prefer = broker_id if designate and broker_id != NO_BROKER else None  # mqadmin may name none
        new_master = _choose(broker_name, bs.sync_state_set, old, prefer, live)
        if new_master is None and unclean:
            new_master = _choose(broker_name, _ids(bs), old, prefer, live)
    if new_master is not None and new_master == old:
        return _refuse(broker_name, MASTER_STILL_EXIST,
                       f"The old master {old} is still alive, not need to elect new master for broker {broker_name}",
                       bs, version)
    new = state_pb2.ControllerBrokerSet()
    new.CopyFrom(bs)
    if new_master is not None:
        new.master_id = new_master
        new.master_epoch += 1
        _set_sync(new, [new_master])
        new.sync_state_set_epoch += 1
        decision = _write(state, broker_name, version, new)
        decision.elected = True
        return decision
    if broker_id == NO_BROKER:
        new.master_id = 0
        new.master_epoch += 1  # RocketMQ's updateMasterInfo(null): the epoch moves even to "no master"
        return _write(state, broker_name, version, new, MASTER_NOT_AVAILABLE,
                      "Old master has down and failed to elect a new broker master")
    return _refuse(broker_name, ELECT_MASTER_FAILED, "Failed to elect a new master", bs, version)


def alter_sync_state_set(state: MetadataState, broker_name: str, master_id: int, master_epoch: int,
                         new_set: Iterable[int], sync_state_set_epoch: int, live: Liveness) -> Decision:
    """CONTROLLER_ALTER_SYNC_STATE_SET: the master reports who is in sync, fenced by both epochs."""
    wanted = set(new_set)
    found = state.controller_set(broker_name)
    if found is None:
        return _refuse(broker_name, ALTER_SYNC_STATE_SET_FAILED, "Broker metadata is not existed")
    bs, version = found
    if wanted == set(bs.sync_state_set):
        return _refuse(broker_name, ALTER_SYNC_STATE_SET_FAILED,
                       "The newSyncStateSet is equal with oldSyncStateSet, no needed to update syncStateSet", bs,
                       version)
    if not bs.master_id or bs.master_id != master_id:
        current = bs.master_id or "null"
        return _refuse(broker_name, INVALID_MASTER, "Rejecting alter syncStateSet request because the current "
                       f"leader is:{{{current}}}, not {{{master_id}}}", bs, version)
    if master_epoch != bs.master_epoch:
        return _refuse(broker_name, FENCED_MASTER_EPOCH, "Rejecting alter syncStateSet request because the "
                       f"current master epoch is:{{{bs.master_epoch}}}, not {{{master_epoch}}}", bs, version)
    if sync_state_set_epoch != bs.sync_state_set_epoch:
        return _refuse(broker_name, FENCED_SYNC_STATE_SET_EPOCH, "Rejecting alter syncStateSet request because "
                       f"the current syncStateSet epoch is:{{{bs.sync_state_set_epoch}}}, not "
                       f"{{{sync_state_set_epoch}}}", bs, version)
    ids = set(_ids(bs))
    for replica in sorted(wanted):
        if replica not in ids:
            return _refuse(broker_name, INVALID_REPLICAS, "Rejecting alter syncStateSet request because the "
                           f"replicas {{{replica}}} don't exist", bs, version)
        if not live.alive(broker_name, replica):
            return _refuse(broker_name, BROKER_NOT_ALIVE, "Rejecting alter syncStateSet request because the "
                           f"replicas {{{replica}}} don't alive", bs, version)
    if bs.master_id not in wanted:
        return _refuse(broker_name, ALTER_SYNC_STATE_SET_FAILED, "Rejecting alter syncStateSet request because "
                       f"the newSyncStateSet don't contains origin leader {{{bs.master_id}}}", bs, version)
    new = state_pb2.ControllerBrokerSet()
    new.CopyFrom(bs)
    _set_sync(new, wanted)
    new.sync_state_set_epoch += 1
    return _write(state, broker_name, version, new)


# ---- administration ------------------------------------------------------------------------------

def clean_broker_data(state: MetadataState, broker_name: str, broker_ids: Iterable[int], clean_living: bool,
                      live: Liveness) -> Decision:
    """CLEAN_BROKER_DATA: forget some brokers of a set (or the whole set). Refused while a named broker
    is alive, or, for the whole set, while it has a master, unless `clean_living`."""
    ids = sorted(set(broker_ids))
    found = state.controller_set(broker_name)
    current, read = found if found is not None else (None, 0)
    if not clean_living:
        if not ids and current is not None and current.master_id:
            return _refuse(broker_name, INVALID_CLEAN_BROKER_METADATA,
                           f"Broker {broker_name} is still alive, clean up failure", current, read)
        for broker_id in ids:
            if live.alive(broker_name, broker_id):
                return _refuse(broker_name, INVALID_CLEAN_BROKER_METADATA,
                               f"Broker [{broker_name},  {broker_id}] is still alive, clean up failure", current,
                               read)
    if found is None:
        return _refuse(broker_name, INVALID_CLEAN_BROKER_METADATA,
                       f"Broker {broker_name} is not existed,clean broker data failure.")
    bs, version = found
    if not ids:
        return _write(state, broker_name, version, None)
    new = state_pb2.ControllerBrokerSet()
    new.CopyFrom(bs)
    keep = [r for r in new.replicas if r.broker_id not in ids]
    del new.replicas[:]
    new.replicas.extend(keep)
    _set_sync(new, [i for i in new.sync_state_set if i not in ids])
    if not new.replicas or not new.sync_state_set and bs.sync_state_set:
        return _write(state, broker_name, version, None)
    return _write(state, broker_name, version, new)


__all__ = [
    "FIRST_BROKER_ID",
    "NO_BROKER",
    "Decision",
    "Liveness",
    "alter_sync_state_set",
    "apply_broker_id",
    "clean_broker_data",
    "elect_master",
    "master_alive",
    "needs_election",
    "next_broker_id",
    "register_broker",
    "replica_info",
    "set_view",
    "view",
]
