"""The leader's translation of requests into log records, by diffing against the current state.

Only what changed enters the log: a PUT is emitted only when the canonical value bytes differ from
what is stored, a DELETE only when the key exists. Read-modify-write translations carry
preconditions on the keys they read (at the versions read), so a change that lands between
translation and apply turns the batch into a deterministic no-op; the caller then re-translates
and retries. A translation with no records carries no preconditions: there is nothing to propose.

Functions read the MetadataState and never change it. The batch's request_id is left empty for the
caller to set. Input is assumed validated (nameserver.validation); register_topic additionally
checks that its brokers exist, which depends on the state.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from google.protobuf.message import Message

from nameserver.errors import ValidationError
from nameserver.logformat.records import EXPIRE_TAG, UNREGISTER_TAG
from nameserver.pb import api_pb2, state_pb2
from nameserver.state import keys, sessions, settings
from nameserver.state.metadata import MASTER_ID, ORDER_TOPIC_CONFIG, PERM_READ, PERM_WRITE, MetadataState
from nameserver.state.sessions import SessionQuota
from raftlog.pb import entry_pb2


@dataclass(slots=True)
class Translation:
    """A batch to propose plus the reply fields the request needs."""

    batch: entry_pb2.Batch = field(default_factory=entry_pb2.Batch)
    master_addr: str = ""       # register_broker, for slaves: the master's address when registered
    ha_server_addr: str = ""    # register_broker, for slaves: the master's HA address
    # register_broker: the ORDER_TOPIC_CONFIG namespace's table; None when the broker gets none (the
    # namespace was never written, or returnOrderTopicConfigToBroker is off)
    order_topic_config: dict[str, str] | None = None
    count: int = 0              # wipe/add write perm: queue datas of the broker (RocketMQ's topic count)
    conflict: bool = False      # register_broker: refused, an address with a newer stateVersion holds the id

    @property
    def records(self) -> int:
        return len(self.batch.records)

    @property
    def empty(self) -> bool:
        """Nothing changed: do not propose; answer with the current apply offset."""
        return not self.batch.records


# Request-id prefixes that tell an expiry from an unregister in the log (they write the same records);
# defined with the log's format, which the Spark report reads too.


def _tagged(t: Translation, tag: str) -> Translation:
    if t.batch.records:
        t.batch.request_id = tag + uuid.uuid4().hex
    return t


def canonical(msg: Message) -> bytes:
    return msg.SerializeToString(deterministic=True)


class RecordBuilder:
    """Collects records against a read-only state, seeing its own pending writes (every translation's,
    here and in nameserver/state/shards/moves.py)."""

    def __init__(self, state: MetadataState) -> None:
        self.state = state
        # key -> (type, op, value) of its record (insertion ordered); the Records are made in the batch at
        # build(), not made here and copied into it
        self._records: dict[str, tuple[int, int, bytes | None]] = {}
        self._pending: dict[str, bytes | None] = {}      # key -> value after this batch (None = deleted)
        self._pre: dict[str, int] = {}

    def get(self, key: str) -> bytes | None:
        if key in self._pending:
            return self._pending[key]
        return self.state.kv.get(key)

    def require(self, key: str) -> None:
        """Precondition: key still has the version read now (0 = still absent)."""
        self._pre.setdefault(key, self.state.kv.version(key))

    def put(self, rtype: int, key: str, msg: Message) -> bool:
        return self.put_value(rtype, key, canonical(msg))

    def put_value(self, rtype: int, key: str, value: bytes) -> bool:
        """put() of a value already in canonical bytes (one another state holds: a set's copy)."""
        stored = self.state.kv.get(key)
        pending = self._pending
        if pending.get(key, stored) == value:  # get(key): as it is after this batch
            return False
        if stored == value:  # a pending change undone: net no change
            self._records.pop(key, None)
            pending.pop(key, None)
        else:
            self._records[key] = (rtype, entry_pb2.OP_PUT, value)
            pending[key] = value
        return True

    def delete(self, rtype: int, key: str) -> bool:
        if self.get(key) is None:
            return False
        if key not in self.state.kv:  # only put by this batch
            self._records.pop(key, None)
            self._pending.pop(key, None)
        else:
            self._records[key] = (rtype, entry_pb2.OP_DELETE, None)
            self._pending[key] = None
        return True

    def build(self) -> Translation:
        batch = entry_pb2.Batch()
        if self._records:
            add = batch.records.add
            for key, (rtype, op, value) in self._records.items():
                add(type=rtype, op=op, key=key, value=value)
            require = batch.preconditions.add
            for k, v in self._pre.items():
                require(key=k, version=v)
        return Translation(batch=batch)


def _broker_data(cluster: str, name: str, addrs: dict[int, str], acting: bool, zone: str
                 ) -> state_pb2.BrokerData:
    bd = state_pb2.BrokerData(cluster=cluster, broker_name=name, enable_acting_master=acting, zone=zone)
    for bid in sorted(addrs):  # sorted by id: canonical bytes
        bd.addrs.add(broker_id=bid, addr=addrs[bid])
    return bd


def _queue_data(broker_name: str, read: int, write: int, perm: int, sys_flag: int,
                mapping: state_pb2.QueueMapping | None = None) -> state_pb2.QueueData:
    qd = state_pb2.QueueData(broker_name=broker_name, read_queue_nums=read, write_queue_nums=write,
                             perm=perm, topic_sys_flag=sys_flag)
    if mapping is not None:
        qd.mapping.CopyFrom(mapping)
    return qd


@functools.lru_cache(maxsize=4096)
def _queue_data_bytes(broker_name: str, read: int, write: int, perm: int, sys_flag: int) -> bytes:
    """canonical(_queue_data(...)) of a queue data without a mapping, made once per distinct one: a broker's
    topics mostly share their numbers, and it registers them again and again."""
    return canonical(_queue_data(broker_name, read, write, perm, sys_flag))


def _wipe_write_of_group(b: RecordBuilder, broker_name: str) -> None:
    for topic in b.state.broker_topics(broker_name):
        key = keys.topic_key(topic, broker_name)
        qd = b.state.queue_data(topic, broker_name)
        if qd is not None and qd.perm & PERM_WRITE:
            qd.perm &= ~PERM_WRITE
            b.require(key)
            b.put(keys.TOPIC_TYPE, key, qd)


def _remove_addr(b: RecordBuilder, broker_name: str, addr: str) -> None:
    """Take addr out of broker_name's group; a group left empty disappears with all its queue data."""
    bd = b.state.broker_data(broker_name)
    if bd is None:
        return
    remaining = {ba.broker_id: ba.addr for ba in bd.addrs if ba.addr != addr}
    if len(remaining) == len(bd.addrs):
        return
    key = keys.broker_key(broker_name)
    b.require(key)
    if not remaining:
        b.delete(keys.BROKER_TYPE, key)
        for topic in b.state.broker_topics(broker_name):
            b.delete(keys.TOPIC_TYPE, keys.topic_key(topic, broker_name))
        return
    b.put(keys.BROKER_TYPE, key, _broker_data(bd.cluster, broker_name, remaining,
                                              bd.enable_acting_master, bd.zone))
    if bd.enable_acting_master and min(remaining) > MASTER_ID:
        # The master is gone: an acting-master group stops taking writes (RocketMQ 5 cleanTopic...).
        _wipe_write_of_group(b, broker_name)


# ---- brokers ---------------------------------------------------------------------------------------

def register_broker(state: MetadataState, req: api_pb2.RegisterBrokerRequest, default_timeout_ms: int,
                    group0: MetadataState | None = None) -> Translation:
    """RocketMQ registerBroker as a diff. The replicated setting deleteTopicWithBrokerRegistration (off by
    default, as upstream) drops this group's topics absent from a (master's) changed registration, unless
    it holds static-topic queue mappings (as upstream).

    `group0`: with several Raft groups, group 0's state, which holds the settings and the order-topic KV
    this reads (`state` is the set's group's); None: `state` holds them (one group). Read without a
    precondition: a registration and a settings change in another group are not ordered (as the
    registration and a settings change racing to one leader are not either)."""
    common = state if group0 is None else group0
    b = RecordBuilder(state)
    name, addr, bid = req.broker_name, req.broker_addr, req.broker_id
    lkey, bkey = keys.live_key(addr), keys.broker_key(name)
    b.require(lkey)
    b.require(bkey)
    old_live = state.broker_live(addr)
    old_bd = state.broker_data(name)

    addrs = {ba.broker_id: ba.addr for ba in old_bd.addrs} if old_bd is not None else {}
    # The same address under another id is a role change (slave -> master): one entry per address.
    addrs = {i: a for i, a in addrs.items() if a != addr or i == bid}
    displaced = addrs.get(bid)
    if displaced is not None and displaced != addr:
        holder = state.broker_live(displaced)
        if holder is not None and holder.data_version.state_version > req.data_version.state_version:
            # Another address holds this id with a newer stateVersion: refuse, drop the newcomer's
            # liveness (RocketMQ: "Registering Broker conflicts with the existed one").
            b.require(keys.live_key(displaced))
            b.delete(keys.LIVE_TYPE, lkey)
            b.delete(keys.FILTER_TYPE, keys.filter_key(addr))
            tr = b.build()
            tr.conflict = True
            return tr
    register_first = old_bd is None or displaced != addr
    addrs[bid] = addr

    if old_live is not None and old_live.broker_name != name:
        # The address moved to another group: leave the old one (else it would list it forever).
        _remove_addr(b, old_live.broker_name, addr)

    b.put(keys.BROKER_TYPE, bkey, _broker_data(req.cluster_name, name, addrs,
                                              req.enable_acting_master, req.zone_name))

    live = state_pb2.BrokerLive(
        cluster=req.cluster_name, broker_name=name, broker_id=bid, broker_addr=addr,
        ha_server_addr=req.ha_server_addr,
        heartbeat_timeout_ms=req.heartbeat_timeout_ms or default_timeout_ms, zone=req.zone_name)
    live.data_version.CopyFrom(req.data_version)
    b.put(keys.LIVE_TYPE, lkey, live)

    fkey = keys.filter_key(addr)
    servers = sorted(set(req.filter_servers))
    if servers:
        b.put(keys.FILTER_TYPE, fkey, state_pb2.FilterServers(addrs=servers))
    else:
        b.delete(keys.FILTER_TYPE, fkey)

    is_master = bid == MASTER_ID
    # RocketMQ 5's prime slave: with the master absent, the lowest-id slave of a broker new enough to
    # send enableActingMaster (true or false) registers the group's topics; read-only when acting.
    prime_slave = (not is_master and req.HasField("enable_acting_master") and MASTER_ID not in addrs
                   and bid == min(addrs))
    if is_master or prime_slave:
        # Topic data is rewritten on first registration or when the broker's DataVersion changed.
        changed = register_first or old_live is None or old_live.data_version != req.data_version
        delete_missing = (common.setting_on(settings.DELETE_TOPIC_WITH_BROKER_REGISTRATION, False)
                          and not any(tc.HasField("mapping") for tc in req.topics))
        _register_topics(b, req, changed, prime_slave and req.enable_acting_master, delete_missing)

    tr = b.build()
    if not is_master and MASTER_ID in addrs:
        master_live = state.broker_live(addrs[MASTER_ID])
        if master_live is not None:
            tr.master_addr, tr.ha_server_addr = addrs[MASTER_ID], master_live.ha_server_addr
    if (common.setting_on(settings.RETURN_ORDER_TOPIC_CONFIG_TO_BROKER, True)
            and common.kv_namespace_exists(ORDER_TOPIC_CONFIG)):
        tr.order_topic_config = common.kv_list(ORDER_TOPIC_CONFIG)
    return tr


def _register_topics(b: RecordBuilder, req: api_pb2.RegisterBrokerRequest, changed: bool, acting: bool,
                     delete_missing: bool) -> None:
    name = req.broker_name
    state = b.state
    if changed and delete_missing:
        wanted = {tc.topic_name for tc in req.topics}
        for topic in state.broker_topics(name):
            if topic not in wanted:
                b.delete(keys.TOPIC_TYPE, keys.topic_key(topic, name))
    key_of = keys.topic_keys_of(name)
    for tc in req.topics:
        topic = tc.topic_name
        # Unchanged DataVersion: RocketMQ still re-adds a topic this group has no queue data for.
        if not changed and state.broker_has_topic(name, topic):
            continue
        perm = tc.perm & ~PERM_WRITE if acting else tc.perm  # an acting master is read-only
        if tc.HasField("mapping"):
            value = canonical(_queue_data(name, tc.read_queue_nums, tc.write_queue_nums, perm, tc.topic_sys_flag,
                                          tc.mapping))
        else:
            value = _queue_data_bytes(name, tc.read_queue_nums, tc.write_queue_nums, perm, tc.topic_sys_flag)
        b.put_value(keys.TOPIC_TYPE, key_of(topic), value)


def unregister_broker(state: MetadataState, cluster_name: str, broker_name: str, broker_addr: str,
                      broker_id: int) -> Translation:
    """Remove one address (RocketMQ unregisterBroker). cluster_name and broker_id are accepted for
    protocol parity; the address alone identifies the registration here."""
    del cluster_name, broker_id
    b = RecordBuilder(state)
    lkey = keys.live_key(broker_addr)
    b.require(lkey)
    b.delete(keys.LIVE_TYPE, lkey)
    b.delete(keys.FILTER_TYPE, keys.filter_key(broker_addr))
    _remove_addr(b, broker_name, broker_addr)
    return _tagged(b.build(), UNREGISTER_TAG)


def expire_broker(state: MetadataState, broker_addr: str, expected_live_version: int) -> Translation:
    """Unregister an address that stayed silent, only if live/<addr> still has the version the
    scanner saw: a stale expiry must not wipe a fresh re-registration (RocketMQ issue 11043)."""
    lkey = keys.live_key(broker_addr)
    live = state.broker_live(broker_addr)
    if live is None or state.kv.version(lkey) != expected_live_version:
        return Translation()
    b = RecordBuilder(state)
    b.require(lkey)
    b.delete(keys.LIVE_TYPE, lkey)
    b.delete(keys.FILTER_TYPE, keys.filter_key(broker_addr))
    _remove_addr(b, live.broker_name, broker_addr)
    return _tagged(b.build(), EXPIRE_TAG)


# ---- KV config -------------------------------------------------------------------------------------

def put_kv(state: MetadataState, namespace: str, key: str, value: str) -> Translation:
    b = RecordBuilder(state)
    b.put(keys.KV_TYPE, keys.kv_key(namespace, key), state_pb2.KvValue(value=value))
    # The namespace outlives its keys (RocketMQ keeps an emptied one); written once, a no-op after.
    b.put(keys.KV_NAMESPACE_TYPE, keys.kv_namespace_key(namespace), state_pb2.KvNamespace())
    return b.build()


def update_settings(state: MetadataState, values: Mapping[str, str]) -> Translation:
    """Set replicated settings (settings.py); values must already be canonical ("true"/"false")."""
    b = RecordBuilder(state)
    for name in sorted(values):
        b.put(keys.SETTING_TYPE, keys.setting_key(name), state_pb2.SettingValue(value=values[name]))
    return b.build()


def delete_kv(state: MetadataState, namespace: str, key: str) -> Translation:
    b = RecordBuilder(state)
    b.delete(keys.KV_TYPE, keys.kv_key(namespace, key))
    return b.build()


# ---- topics and permissions ------------------------------------------------------------------------

def _set_write_perm(state: MetadataState, broker_name: str, wipe: bool) -> Translation:
    b = RecordBuilder(state)
    count = 0
    for topic in state.broker_topics(broker_name):
        qd = state.queue_data(topic, broker_name)
        if qd is None:
            continue
        count += 1  # RocketMQ counts every queue data of the broker, changed or not
        perm = qd.perm & ~PERM_WRITE if wipe else PERM_READ | PERM_WRITE
        if perm != qd.perm:
            key = keys.topic_key(topic, broker_name)
            qd.perm = perm
            b.require(key)
            b.put(keys.TOPIC_TYPE, key, qd)
    tr = b.build()
    tr.count = count
    return tr


def wipe_write_perm(state: MetadataState, broker_name: str) -> Translation:
    """Clear the write bit on all the broker's queue datas; .count = queue datas it touched."""
    return _set_write_perm(state, broker_name, wipe=True)


def add_write_perm(state: MetadataState, broker_name: str) -> Translation:
    """Set perm to read|write (6) on all the broker's queue datas; .count = queue datas it touched."""
    return _set_write_perm(state, broker_name, wipe=False)


def register_topic(state: MetadataState, topic: str, queue_datas: Sequence[state_pb2.QueueData]) -> Translation:
    """Put a topic's queue data per broker name; every broker must be registered (else
    ValidationError naming queue_datas[i].broker_name, where RocketMQ silently ignores the request)."""
    b = RecordBuilder(state)
    for i, qd in enumerate(queue_datas):
        if state.broker_data(qd.broker_name) is None:
            raise ValidationError(f"queue_datas[{i}].broker_name",
                                  f"broker {qd.broker_name!r} is not registered")
        b.require(keys.broker_key(qd.broker_name))  # it must still exist when this applies
    for qd in queue_datas:
        # A static topic's queue mapping stays: it is the broker's, and only its registration changes it.
        old = state.queue_data(topic, qd.broker_name)
        b.put(keys.TOPIC_TYPE, keys.topic_key(topic, qd.broker_name),
              _queue_data(qd.broker_name, qd.read_queue_nums, qd.write_queue_nums, qd.perm,
                          qd.topic_sys_flag, old.mapping if old is not None and old.HasField("mapping") else None))
    return b.build()


def delete_topic(state: MetadataState, topic: str, cluster_name: str = "") -> Translation:
    """Delete a topic's queue data: all of it, or only that cluster's brokers' entries."""
    b = RecordBuilder(state)
    brokers = state.broker_names(cluster_name) if cluster_name else state.topic_brokers(topic)
    for name in brokers:
        b.delete(keys.TOPIC_TYPE, keys.topic_key(topic, name))
    return b.build()


# ---- queue bindings --------------------------------------------------------------------------------

class CasFailed(Exception):
    """Compare-and-set refused: the key is not at the version the caller expected."""

    def __init__(self, key: str, expected: int, current: int) -> None:
        super().__init__(f"{key} is at version {current}, not the expected {expected}")
        self.key = key
        self.expected = expected
        self.current = current


def bind_queue(state: MetadataState, topic: str, queue_id: int, owner: str, expected_version: int
               ) -> Translation:
    """Bind (expected 0: unbound) or rebind (expected = current version) a queue; bumps its epoch."""
    key = keys.bind_key(topic, queue_id)
    current = state.kv.version(key)
    if current != expected_version:
        raise CasFailed(key, expected_version, current)
    old = state.binding(topic, queue_id)
    b = RecordBuilder(state)
    b.require(key)
    value = state_pb2.QueueBindingValue(owner=owner, epoch=(old.epoch if old else 0) + 1)
    b.put(keys.BIND_TYPE, key, value)
    return b.build()


def release_queue(state: MetadataState, topic: str, queue_id: int, expected_version: int) -> Translation:
    key = keys.bind_key(topic, queue_id)
    current = state.kv.version(key)
    if current == 0 or current != expected_version:
        raise CasFailed(key, expected_version, current)
    b = RecordBuilder(state)
    b.require(key)
    b.delete(keys.BIND_TYPE, key)
    return b.build()


# ---- exactly-once client sessions ------------------------------------------------------------------

def record_session(t: Translation, state: MetadataState, client_id: str, owner: str, seq: int, reply: bytes,
                   now_ms: int, quota: SessionQuota) -> None:
    """Add the client's session record to a non-empty translation, guarded by its current version; a
    session not live yet takes its room within its owner's quota first (nameserver/state/sessions.py)."""
    key = keys.session_key(client_id)
    t.batch.preconditions.add(key=key, version=state.kv.version(key))
    found = state.session_book.get(client_id)
    if found is None or found.evicted:
        sessions.open_session(t.batch, state.session_book, state.kv.version, client_id, owner, quota)
    value = state_pb2.ClientSession(last_seq=seq, reply=reply, last_write_ms=now_ms, owner=owner)
    t.batch.records.add(type=keys.SESSION_TYPE, op=entry_pb2.OP_PUT, key=key, value=canonical(value))


def expire_sessions(state: MetadataState, idle_ms: Callable[[str], float], ttl_ms: int, limit: int = 1000
                    ) -> Translation:
    """Sessions idle past the TTL become tombstones; tombstones idle past it are deleted (at most `limit`).

    `idle_ms(session id)` is the caller's measure of idleness: the leader's monotonic clock
    (nameserver/core/sessionclock.py), never the wall-clock stamp in the record, which a clock step moves.
    The count of sessions is bounded at translation (sessions.open_session), never by evicting here."""
    b = RecordBuilder(state)
    for sid, stone in sessions.expiry(state.session_book, idle_ms, ttl_ms, limit):
        key = keys.session_key(sid)
        b.require(key)
        if stone is None:
            b.delete(keys.SESSION_TYPE, key)
        else:
            b.put(keys.SESSION_TYPE, key, stone)
    return b.build()


# ---- members --------------------------------------------------------------------------------------

def put_member(state: MetadataState, raft_addr: str, grpc_addr: str) -> Translation:
    b = RecordBuilder(state)
    b.put(keys.MEMBER_TYPE, keys.member_key(raft_addr), state_pb2.MemberInfo(grpc_addr=grpc_addr))
    return b.build()


def delete_member(state: MetadataState, raft_addr: str) -> Translation:
    b = RecordBuilder(state)
    b.delete(keys.MEMBER_TYPE, keys.member_key(raft_addr))
    return b.build()
