"""The nameserver's replicated state: a KVState plus derived in-memory indexes for reads.

The KVState is the truth (it is what the log builds, what snapshots store and what the digest
covers). The indexes here are derived from it by a change listener, so they are rebuilt exactly by
replaying the log or restoring a snapshot, and every read is O(its result) instead of a scan.
Pure and deterministic: no clocks, threads or I/O. Not thread-safe (the owner holds a lock).
"""

from __future__ import annotations

import sys
from bisect import bisect_left
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import Any, TypeVar

from google.protobuf.message import DecodeError, Message

from nameserver.errors import ValidationError
from nameserver.logformat import records
from nameserver.pb import api_pb2, state_pb2
from nameserver.state import keys, pendingroutes, topicqueues
from nameserver.state.pendingroutes import CHUNK_KEYS, PendingRoutes
from nameserver.state.quotas import Usage
from nameserver.state.sessions import SessionBook
from nameserver.state.shards.directory import Directory
from raftlog.kvstate import ChangeTuple, KVState
from raftlog.pb import entry_pb2

ORDER_TOPIC_CONFIG = "ORDER_TOPIC_CONFIG"  # KV namespace of order-topic configuration (RocketMQ)
# The one KV namespace a route reads (a topic's order config): another namespace's change moves no route.
_ORDER_KV_PREFIX = keys.kv_prefix(ORDER_TOPIC_CONFIG)
MASTER_ID = 0
PERM_READ = 4
PERM_WRITE = 2
SYS_FLAG_UNIT = 1
SYS_FLAG_UNIT_SUB = 2
SYNC_BROKER_MEMBER_GROUP_PREFIX = "rmq_sys_SYNC_BROKER_MEMBER_"  # never acting-master rewritten

# A lazy_routes state's changed topic keys noted before its apply indexes them itself (a load that never reads
# routes, writing keys enough to note this many distinct ones: the noting stays bounded).
STALE_ROUTE_KEYS = 4096
_TOPIC_KEYS_END = keys.TOPIC_PREFIX[:-1] + "0"  # "0" follows "/": the first key past every topic/ key
_UNIT_KINDS = (api_pb2.TOPIC_LIST_UNIT, api_pb2.TOPIC_LIST_HAS_UNIT_SUB,
               api_pb2.TOPIC_LIST_HAS_UNIT_SUB_NOT_UNIT)

M = TypeVar("M", bound=Message)


def _decode(cls: type[M], data: bytes | None) -> M | None:
    # Apply must never raise: a value that does not parse is treated as absent by the indexes
    # (it still counts in the KVState and its digest, so replicas stay identical).
    if data is None:
        return None
    msg = cls()
    try:
        msg.ParseFromString(data)
    except DecodeError:
        return None
    return msg


SYS_FLAGS_KEPT = 4096  # distinct queue datas whose topicSysFlag is kept (emptied when full)


class _SysFlags(dict[bytes, int | None]):
    """Encoded queue data -> its topicSysFlag, or None when it does not parse; `flags[raw]` decodes one not held.
    Kept because a broker's queue datas are mostly byte-identical, and this is on every applied route record of
    every node: a subscript, where the lru_cache it replaces cost a call (0.04 against 0.12 us, twice for each
    queue data rewritten on a core). Threads share it: a miss meanwhile only decodes again."""

    def __missing__(self, raw: bytes) -> int | None:
        qd = _decode(state_pb2.QueueData, raw)
        flag = None if qd is None else qd.topic_sys_flag
        if len(self) >= SYS_FLAGS_KEPT:
            self.clear()
        self[raw] = flag
        return flag


_SYS_FLAGS = _SysFlags()
_queue_sys_flag: Callable[[bytes], int | None] = _SYS_FLAGS.__getitem__  # a function of the same answers


def _unit_kinds(sys_flag: int) -> list[int]:
    """The unit topic-list kinds one queue data's topicSysFlag qualifies for."""
    unit = bool(sys_flag & SYS_FLAG_UNIT)
    sub = bool(sys_flag & SYS_FLAG_UNIT_SUB)
    kinds: list[int] = []
    if unit:
        kinds.append(api_pb2.TOPIC_LIST_UNIT)
    if sub:
        kinds.append(api_pb2.TOPIC_LIST_HAS_UNIT_SUB)
        if not unit:
            kinds.append(api_pb2.TOPIC_LIST_HAS_UNIT_SUB_NOT_UNIT)
    return kinds


def _put_or_pop(index: dict[str, Any], key: str, value: Any) -> None:
    """An index entry follows its record: set to the decoded value, or gone with the record."""
    if value is None:
        index.pop(key, None)
    else:
        index[key] = value


def _copy(msg: M) -> M:
    out = type(msg)()
    out.CopyFrom(msg)
    return out


# One broker's part of a topic's route: (broker name, encoded QueueData, its BrokerData or None).
RoutePart = tuple[str, bytes, state_pb2.BrokerData | None]


def build_route(parts: Iterable[RoutePart], topic: str, zone_name: str, support_acting_master: bool,
                filter_servers: Callable[[str, str], list[str] | None], order_topic_conf: str | None
                ) -> api_pb2.TopicRoute | None:
    """RocketMQ pickupTopicRouteData (+ the zone filter hook) from a topic's parts in broker-name order;
    None means TOPIC_NOT_EXIST. `filter_servers(broker name, addr)`: an address's filter servers;
    `order_topic_conf`: the topic's order config when the client asked for it (orderMessageEnable)."""
    route = api_pb2.TopicRoute()
    for _name, raw, bd in parts:
        if bd is not None:
            route.broker_datas.append(bd)
        route.queue_datas.add().ParseFromString(raw)
    if not route.broker_datas:
        return None
    if support_acting_master and not topic.startswith(SYNC_BROKER_MEMBER_GROUP_PREFIX):
        _acting_master_view(route)
    if zone_name:
        _zone_filter(route, zone_name)
    for bd in route.broker_datas:
        for ba in bd.addrs:
            servers = filter_servers(bd.broker_name, ba.addr)
            if servers:
                route.filter_server_table[ba.addr].addrs.extend(servers)
    if order_topic_conf is not None:
        route.order_topic_conf = order_topic_conf
    return route


def _acting_master_view(route: api_pb2.TopicRoute) -> None:
    # A master-less group whose queues lost write permission is shown with its lowest-id slave
    # as broker id 0, so clients can still read from it (RocketMQ supportActingMaster).
    perms = {qd.broker_name: qd.perm for qd in route.queue_datas}
    for bd in route.broker_datas:
        ids = [ba.broker_id for ba in bd.addrs]
        if not ids or MASTER_ID in ids or not bd.enable_acting_master:
            continue
        perm = perms.get(bd.broker_name)
        if perm is None or perm & PERM_WRITE:
            continue
        lowest = min(bd.addrs, key=lambda ba: ba.broker_id)
        lowest.broker_id = MASTER_ID
        bd.addrs.sort(key=lambda ba: ba.broker_id)


def _zone_filter(route: api_pb2.TopicRoute, zone_name: str) -> None:
    # RocketMQ ZoneRouteRPCHook: keep this zone's groups, and any group without a master
    # (so a consumer can still fall back to a slave elsewhere).
    wanted = zone_name.lower()
    kept = []
    removed = set()
    for bd in route.broker_datas:
        has_master = any(ba.broker_id == MASTER_ID for ba in bd.addrs)
        if not bd.addrs or not has_master or bd.zone.lower() == wanted:
            kept.append(_copy(bd))
        else:
            removed.add(bd.broker_name)
    if not removed:
        return
    queues = [_copy(qd) for qd in route.queue_datas if qd.broker_name not in removed]
    del route.broker_datas[:]
    route.broker_datas.extend(kept)
    del route.queue_datas[:]
    route.queue_datas.extend(queues)


# Each record kind's handler in MetadataState, by record type: what _on_change calls for a record of it.
# Which kinds route() reads is the registry's `routes` flag (nameserver/logformat/records.py).
_OnChange = Callable[["MetadataState", str, "bytes | None"], None]
_HANDLERS: dict[int, _OnChange] = {}
_TOPIC_PREFIX = records.TOPIC.prefix
_TOPIC_CUT = len(_TOPIC_PREFIX)
_LIVE_CUT = len(records.LIVE.prefix)


def _handles(kind: records.RecordKind) -> Callable[[_OnChange], _OnChange]:
    """Make a MetadataState method the handler of `kind`'s records (one handler per kind)."""
    def register(on_change: _OnChange) -> _OnChange:
        if kind.rtype in _HANDLERS:
            raise ValueError(f"two handlers for {kind.prefix} records")
        _HANDLERS[kind.rtype] = on_change
        return on_change
    return register


class MetadataState:
    """RouteInfoManager + KVConfigManager as a deterministic state machine over a KVState."""

    def __init__(self, accounting: bool = True, lazy_routes: bool = False) -> None:
        """`accounting`: keep the digest and the quota totals entry by entry. A state that only serves
        reads (a node's worker processes' replicas: the core admits the writes and reports the digest)
        passes False; they were a quarter of its apply time per entry. Its `usage` then stays empty.

        `lazy_routes`: the route index (topic -> queue datas, broker -> topics, the unit topic lists) follows
        the topic/ records when read, not as each is applied: a changed record notes its key, and the first
        read of the index after it indexes each noted key's value then (settle_routes; a key rewritten by
        every registration is indexed once per read, not once per write: a write-only load never). For a
        state whose every reader holds its owner's lock (a worker's replica: nameserver/replica/follower.py),
        since such a read changes the index; never a core's, whose translations read it without the lock
        (nameserver/core/stateguard.py optimistic). Such a state indexes an entry's changes in apply_entry (its
        KVState has no listener): it is applied through apply_entry, never through its KVState's own."""
        self.kv = KVState(digests=accounting)
        self.lazy_routes = lazy_routes
        # The one listener: the indexes, and the quota totals of an accounting state (a second listener cost
        # a call for each changed record; the totals move only for a record added or dropped, or a KV's). A
        # lazy_routes state has none: its entry's changes are indexed once the entry is in (apply_entry).
        if not lazy_routes:
            self.kv.listeners.append(self._on_change)
        self.accounting = accounting
        # Moves whenever a record that feeds some topic's route changes (topic, broker, filter, setting,
        # KV: the order-topic config), before the entry's offset does: a route computed at one value stays
        # right while it has that value (nameserver/core/routecache.py).
        self.route_generation = 0
        self._reset_indexes()
        # Quota totals (nameserver/state/quotas.py): counted from every change (_on_change), rebuilt on a restore.
        self.usage = Usage()

    def _reset_indexes(self) -> None:
        # Decoded values are cached (never handed out: reads return copies).
        self._brokers: dict[str, state_pb2.BrokerData] = {}
        self._cluster_brokers: dict[str, set[str]] = {}
        self._lives: dict[str, state_pb2.BrokerLive] = {}
        self._filters: dict[str, list[str]] = {}
        # topic -> broker -> encoded QueueData (the KVState's own bytes). Decoded on read: a decoded
        # protobuf message costs ~1.7 KB of upb arena, which at a million queue datas was ~1.6 GiB.
        # A one-broker topic's is a pair, not a dict (nameserver/state/topicqueues.py).
        self._topic_queues: dict[str, topicqueues.Queues] = {}
        self._broker_topics: dict[str, set[str]] = {}
        # unit topic-list kind -> topic -> number of its queue datas qualifying (a topic counts when > 0)
        self._unit_topics: dict[int, dict[str, int]] = {kind: {} for kind in _UNIT_KINDS}
        # A restore's topic keys not in the three route indexes above yet (restore, defer_routes)
        self._pending: PendingRoutes | None = None
        # A lazy_routes state's topic keys changed since the route index last took them (settle_routes)
        self._stale: dict[str, None] = {}
        self._kv: dict[str, dict[str, str]] = {}
        self._kv_namespaces: set[str] = set()  # kvns/ records: namespaces ever written
        self._settings: dict[str, str] = {}  # setting/ records: name -> "true"/"false"
        self._bindings: dict[str, dict[int, state_pb2.QueueBindingValue]] = {}  # topic -> queue id -> binding
        self.session_book = SessionBook()  # exactly-once sessions by owner (nameserver/state/sessions.py)
        self._controller_sets: dict[str, state_pb2.ControllerBrokerSet] = {}  # ctrl/ records by broker name
        self.directory = Directory()  # shard/ records: sharding's directory (group 0's; empty with one group)

    # ---- log application ---------------------------------------------------------------------

    @property
    def offset(self) -> int:
        return self.kv.offset

    @property
    def digest_hex(self) -> str:
        return self.kv.digest_hex

    def apply_entry(self, offset: int, entry: entry_pb2.Entry, changes: list[ChangeTuple] | None = None
                    ) -> list[entry_pb2.BatchResult]:
        if not self.lazy_routes:
            return self.kv.apply_entry(offset, entry, changes)
        # A lazy_routes state (its every reader holds the owner's lock, which the whole entry is applied under):
        # the entry's changes indexed once its records are in, in their order, a topic/ key's noted here with no
        # call (a listener's call for each changed record was a tenth of a worker's replica's apply). Its indexes
        # are functions of the records' values, which no handler reads: the same as indexed record by record.
        # The offset moves after (kv.entry_applied): the route generation first, as a lock-free route cache hit
        # needs (nameserver/core/routecache.py: it reads the offset, then the generation).
        if changes is None:
            changes = []
        start = len(changes)
        results = self.kv.apply_records(offset, entry, changes)
        stale, on_change, counted = self._stale, self._on_change, self.accounting
        for change in changes[start:] if start else changes:
            _, rtype, key, old, new = change
            if key.startswith(_TOPIC_PREFIX) and not (counted and (old is None or new is None)):
                self.route_generation += 1  # what _on_change does for it, inline
                stale[key] = None
                if len(stale) >= STALE_ROUTE_KEYS:
                    self.settle_routes()
                    stale = self._stale
            else:
                on_change(rtype, key, old, new)
        self.kv.entry_applied(offset)
        return results

    def restore(self, offset: int, items: Iterable[tuple[str, bytes, int, int]], digest_hex: str | None = None,
                defer_routes: bool = False) -> None:
        """Load a snapshot's (key, value, version, type) items and rebuild every index from them.
        `digest_hex`: the snapshot's stamped digest, trusted (raftlog/kvstate.py KVState.restore).
        `defer_routes`: leave the route index to `build_routes`, a chunk at a time (a core's restore: the
        index was the largest part of a restart at a million records); reads answer meanwhile
        (nameserver/state/pendingroutes.py)."""
        self.route_generation += 1  # before the offset moves (kv.restore): see __init__
        self.kv.restore(offset, items, None if digest_hex is None else int(digest_hex, 16))
        self._reset_indexes()
        values = self.kv._values
        ordered = list(values)
        ordered.sort()  # a snapshot file's come sorted (LMDB's key order is code point order): one pass
        lo = bisect_left(ordered, keys.TOPIC_PREFIX)
        hi = bisect_left(ordered, _TOPIC_KEYS_END, lo)
        # The quota totals are counted here too, not in a pass of their own over the million keys (0.1 s):
        # every topic/ key counts (a malformed one too, as on_change counts it); the rest by Usage.
        others = []
        for key in ordered[:lo] + ordered[hi:]:
            value = values[key][0]
            others.append((key, value))
            self._on_other(key, value)
        self._pending = PendingRoutes(ordered[lo:hi])
        del ordered
        self.session_book.reorder(lambda sid: self.kv.version(keys.session_key(sid)))
        if self.accounting:
            self.usage.rebuild(hi - lo, others)
        if not defer_routes:
            self.build_routes(None)

    def build_routes(self, budget: int | None = CHUNK_KEYS) -> bool:
        """Build `budget` more keys of the route index a restore left (every one: None); whether some are
        still left. The state's owner calls it as it applies (under the state's lock)."""
        pending = self._pending
        if pending is None:
            return False
        self._index_topic_keys(pending.next_chunk(len(pending.keys) if budget is None else budget), pending.taken)
        if pending.done:
            self._pending = None
        return self._pending is not None

    def _index_topic_keys(self, topic_keys: list[str], skip: set[str] | None) -> None:
        """Add each topic/ key's queue data to the route index (topics in `skip` are built already). The same
        indexes _on_change builds, on a fast path: nothing to remove first. Restart time at a million records
        was mostly this loop."""
        values, cut = self.kv._values, len(keys.TOPIC_PREFIX)
        queues, broker_topics, unit = self._topic_queues, self._broker_topics, self._unit_topics
        sys_flag_of, put, setdefault = _queue_sys_flag, topicqueues.put, queues.setdefault
        # A key's broker part -> (the broker name, interned; its topic set): a broker's thousands of keys
        # look its name up once, not once each (intern and broker_topics.get were a sixth of this loop).
        # Per call: a set emptied by a change between two calls is no longer the index's.
        brokers: dict[str, tuple[str, set[str]]] = {}
        for key in topic_keys:
            # keys.parse_topic_key and _add_queue inlined: the hot loop
            topic, sep, part = key[cut:].partition("/")
            if not (sep and topic and part and "/" not in part) or (skip and topic in skip):
                continue
            item = values.get(key)
            flag = None if item is None else sys_flag_of(item[0])
            found = None if flag is None else brokers.get(part)
            if flag is not None and found is None:
                name = part if "~" not in part else keys.broker_of_part(part)  # a '~': escaped
                if name is not None:
                    name = sys.intern(name)  # one string per broker name, not one per queue data
                    topics = broker_topics.get(name)
                    if topics is None:
                        broker_topics[name] = topics = set()
                    brokers[part] = found = (name, topics)
            if found is not None:
                value = item[0]  # type: ignore[index]  # found: the item is there
                broker, topics = found
                pair = (broker, value)
                entry = setdefault(topic, pair)  # topicqueues.put's common case: a first broker
                if entry is not pair:
                    queues[topic] = put(entry, broker, value)
                topics.add(topic)
                if flag:
                    for kind in _unit_kinds(flag):
                        unit[kind][topic] = unit[kind].get(topic, 0) + 1

    def _take(self, topic: str) -> None:
        """Build `topic` in the route index now if a restore left it pending: a change to it comes."""
        pending = self._pending
        if pending is not None and not pending.built(topic):
            lo, hi = pending.span(topic)
            self._index_topic_keys(pending.keys[lo:hi], None)
            pending.taken.add(topic)

    def settle_routes(self) -> None:
        """Index the topic/ keys a lazy_routes state noted since (each one's value now: the index is a
        function of the records' values, whatever their order); the route index's readers call it first."""
        stale = self._stale
        if stale:
            self._stale = {}
            get = self.kv.get
            for key in stale:
                self._on_topic(key, get(key))

    def _entry(self, topic: str) -> topicqueues.Queues | None:
        """`topic`'s route index entry, built or still pending."""
        if self._stale:
            self.settle_routes()
        entry = self._topic_queues.get(topic)
        pending = self._pending
        if entry is None and pending is not None:
            return pending.entry(topic, self.kv.get, _queue_sys_flag)
        return entry

    def _pending_parts(self) -> Iterator[pendingroutes.Part]:
        """What the keys a restore left pending give the route index (none when it is built)."""
        if self._stale:
            self.settle_routes()
        pending = self._pending
        return iter(()) if pending is None else pending.rest(self.kv.get, _queue_sys_flag)

    def release(self) -> None:
        """Let a state that is replaced be freed by reference counts alone: its change listener (a method of
        itself, held by its own KVState) was its one reference cycle, and a state loaded in
        raftlog/applier.py frozen_load is frozen, so the collector would never free it (all of it)."""
        self.kv.listeners.clear()
        self._pending = None

    def _on_change(self, rtype: int, key: str, old: bytes | None, new: bytes | None) -> None:
        """The KVState's listener, for every changed record: the indexes, and an accounting state's quota totals
        (Usage.on_change's, called here only when they may move: a rewritten queue data, most changed records,
        moves none)."""
        if key.startswith(_TOPIC_PREFIX):  # most changed records (a registration's queue datas): no lookup
            self.route_generation += 1
            if (old is None or new is None) and self.accounting:
                self.usage.on_change(rtype, key, old, new)  # a queue data added or dropped
            if self.lazy_routes:
                stale = self._stale
                stale[key] = None
                if len(stale) >= STALE_ROUTE_KEYS:
                    self.settle_routes()
                return
            # A one-broker topic's queue data rewritten with the same topicSysFlag (nearly every changed record
            # of every replica): its pair replaced here, the key parsed inline (keys.parse_topic_key's rules:
            # a broker part without '/' or an escape is the broker name); anything else by _on_topic.
            if new is not None and self._pending is None:
                topic, sep, part = key[_TOPIC_CUT:].partition("/")
                entry = self._topic_queues.get(topic)
                if (isinstance(entry, tuple) and entry[0] == part and sep and "/" not in part and "~" not in part
                        and _SYS_FLAGS[new] == _SYS_FLAGS[entry[1]]):
                    self._topic_queues[topic] = (entry[0], new)  # the held name: interned once
                    return
            self._on_topic(key, new)
            return
        if self.accounting:
            self.usage.on_change(rtype, key, old, new)
        self._on_other(key, new)

    def _on_other(self, key: str, new: bytes | None) -> None:
        """A record's change outside topic/: its kind's handler, by the key's prefix (the layout, not the record's
        type field, defines meaning: records.kind_of and the kind's handler, looked up at once)."""
        found = _DISPATCH.get(key[:key.find("/") + 1])
        if found is None:
            return
        routes, on_change = found
        if routes and (not key.startswith(keys.KV_PREFIX) or key.startswith(_ORDER_KV_PREFIX)):
            self.route_generation += 1
        if on_change is not None:
            on_change(self, key, new)

    # ---- the state's handler of each record kind (keeps its index; one per kind, or none) ----------

    @_handles(records.TOPIC)
    def _on_topic(self, key: str, new: bytes | None) -> None:
        parsed = keys.parse_topic_key(key)
        if parsed is None:
            return
        topic, broker = parsed
        if self._pending is not None:
            self._take(topic)
        if new is not None:  # a broker's queue data rewritten (every changed registration): in place
            queues = self._topic_queues
            entry = queues.get(topic)
            # a one-broker topic's pair read and made here (topicqueues' get and put, inlined): this is every
            # changed queue data of every replica, nearly all of them on one broker
            if isinstance(entry, tuple):
                held = entry[1] if entry[0] == broker else None
            else:
                held = topicqueues.get(entry, broker)
            if held is not None and _queue_sys_flag(new) == _queue_sys_flag(held):
                # same topic sets, same unit counts; a pair keeps its held name (interned once)
                queues[topic] = (entry[0], new) if isinstance(entry, tuple) else topicqueues.put(entry, broker, new)
                return
        self._remove_queue(topic, broker)
        self._add_queue(topic, broker, new)

    @_handles(records.BROKER)
    def _on_broker(self, key: str, new: bytes | None) -> None:
        name = keys.parse_broker_key(key)
        if name is not None:
            self._set_broker(name, _decode(state_pb2.BrokerData, new))

    @_handles(records.LIVE)
    def _on_live(self, key: str, new: bytes | None) -> None:
        # keys.parse_live_key and _put_or_pop inlined (every registration's live record, on every replica); the
        # dispatch matched the prefix
        addr = key[_LIVE_CUT:]
        if addr:
            live = None if new is None else _decode(state_pb2.BrokerLive, new)
            if live is None:
                self._lives.pop(addr, None)
            else:
                self._lives[addr] = live

    @_handles(records.FILTER)
    def _on_filter(self, key: str, new: bytes | None) -> None:
        addr = keys.parse_filter_key(key)
        if addr is not None:
            fs = _decode(state_pb2.FilterServers, new)
            if fs is None or not fs.addrs:
                self._filters.pop(addr, None)
            else:
                self._filters[addr] = list(fs.addrs)

    @_handles(records.KV)
    def _on_kv(self, key: str, new: bytes | None) -> None:
        parsed_kv = keys.parse_kv_key(key)
        if parsed_kv is not None:
            self._set_kv(*parsed_kv, _decode(state_pb2.KvValue, new))

    @_handles(records.KV_NAMESPACE)
    def _on_kv_namespace(self, key: str, new: bytes | None) -> None:
        namespace = keys.parse_kv_namespace_key(key)
        if namespace is not None:
            if new is None:
                self._kv_namespaces.discard(namespace)
            else:
                self._kv_namespaces.add(namespace)

    @_handles(records.SETTING)
    def _on_setting(self, key: str, new: bytes | None) -> None:
        name = keys.parse_setting_key(key)
        if name is not None:
            setting = _decode(state_pb2.SettingValue, new)
            _put_or_pop(self._settings, name, None if setting is None else setting.value)

    @_handles(records.BIND)
    def _on_bind(self, key: str, new: bytes | None) -> None:
        parsed_bind = keys.parse_bind_key(key)
        if parsed_bind is not None:
            self._set_binding(*parsed_bind, _decode(state_pb2.QueueBindingValue, new))

    @_handles(records.SESSION)
    def _on_session(self, key: str, new: bytes | None) -> None:
        client = keys.parse_session_key(key)
        if client is not None:
            self.session_book.set(client, _decode(state_pb2.ClientSession, new))

    @_handles(records.CONTROLLER)
    def _on_controller(self, key: str, new: bytes | None) -> None:
        broker_name = keys.parse_controller_key(key)
        if broker_name is not None:
            _put_or_pop(self._controller_sets, broker_name, _decode(state_pb2.ControllerBrokerSet, new))

    @_handles(records.SHARD)
    def _on_shard(self, key: str, new: bytes | None) -> None:
        broker_name = keys.parse_shard_key(key)
        if broker_name is not None:
            self.directory.set(broker_name, _decode(state_pb2.ShardSet, new))

    # records.MEMBER keeps no index: member_grpc_addr reads its record.

    def _remove_queue(self, topic: str, broker: str) -> None:
        entry = self._topic_queues.get(topic)
        if entry is None:
            return
        left, raw = topicqueues.pop(entry, broker)
        if raw is None:
            return
        if left is None:
            del self._topic_queues[topic]
        else:
            self._topic_queues[topic] = left
        topics = self._broker_topics.get(broker)
        if topics is not None:
            topics.discard(topic)
            if not topics:
                del self._broker_topics[broker]
        for kind in _unit_kinds(_queue_sys_flag(raw) or 0):
            counts = self._unit_topics[kind]
            counts[topic] -= 1
            if counts[topic] == 0:
                del counts[topic]

    def _add_queue(self, topic: str, broker: str, raw: bytes | None) -> None:
        sys_flag = None if raw is None else _queue_sys_flag(raw)
        if raw is None or sys_flag is None:
            return
        broker = sys.intern(broker)  # one string per broker name, not one per queue data
        self._topic_queues[topic] = topicqueues.put(self._topic_queues.get(topic), broker, raw)
        self._broker_topics.setdefault(broker, set()).add(topic)
        for kind in _unit_kinds(sys_flag):
            counts = self._unit_topics[kind]
            counts[topic] = counts.get(topic, 0) + 1

    def _set_broker(self, name: str, bd: state_pb2.BrokerData | None) -> None:
        old = self._brokers.pop(name, None)
        if old is not None:
            names = self._cluster_brokers.get(old.cluster)
            if names is not None:
                names.discard(name)
                if not names:
                    del self._cluster_brokers[old.cluster]
        if bd is not None:
            self._brokers[name] = bd
            self._cluster_brokers.setdefault(bd.cluster, set()).add(name)

    def _set_kv(self, namespace: str, key: str, value: state_pb2.KvValue | None) -> None:
        if value is None:
            table = self._kv.get(namespace)
            if table is not None:
                table.pop(key, None)
                if not table:
                    del self._kv[namespace]
        else:
            self._kv.setdefault(namespace, {})[key] = value.value

    def _set_binding(self, topic: str, queue_id: int, value: state_pb2.QueueBindingValue | None) -> None:
        if value is None:
            table = self._bindings.get(topic)
            if table is not None:
                table.pop(queue_id, None)
                if not table:
                    del self._bindings[topic]
        else:
            self._bindings.setdefault(topic, {})[queue_id] = value

    # ---- route reads -------------------------------------------------------------------------

    def route(self, topic: str, zone_name: str = "", order_message_enable: bool = False,
              support_acting_master: bool = False) -> api_pb2.TopicRoute | None:
        """RocketMQ pickupTopicRouteData (+ the zone filter hook); None means TOPIC_NOT_EXIST."""
        return build_route(self.route_parts(topic), topic, zone_name, support_acting_master,
                           lambda _name, addr: self._filters.get(addr),
                           (self.kv_get(ORDER_TOPIC_CONFIG, topic) or "") if order_message_enable else None)

    def route_parts(self, topic: str) -> list[RoutePart]:
        """The topic's (broker name, encoded QueueData, the broker's BrokerData or None) by broker name:
        what its route is built from (a sharded read merges them across groups: shards/merge.py)."""
        return [(name, raw, self._brokers.get(name))
                for name, raw in topicqueues.by_broker(self._entry(topic))]

    def cluster_info(self) -> api_pb2.GetClusterInfoReply:
        """brokerAddrTable and clusterAddrTable (apply_offset left for the caller)."""
        reply = api_pb2.GetClusterInfoReply()
        for name, bd in self._brokers.items():
            reply.broker_addr_table[name].CopyFrom(bd)
        for cluster, names in self._cluster_brokers.items():
            reply.cluster_addr_table[cluster].names.extend(sorted(names))
        return reply

    def topic_list(self, kind: int, cluster_name: str = "") -> list[str]:
        """Sorted topic names of one TopicListKind (SYSTEM: cluster and broker names, as RocketMQ)."""
        if self._stale:
            self.settle_routes()
        if kind == api_pb2.TOPIC_LIST_ALL:
            return sorted(self._all_topics())
        if kind == api_pb2.TOPIC_LIST_BY_CLUSTER:
            found: set[str] = set()
            names = self._cluster_brokers.get(cluster_name, set())
            for name in names:
                found.update(self._broker_topics.get(name, ()))
            found.update(topic for topic, broker, _, _ in self._pending_parts() if broker in names)
            return sorted(found)
        if kind == api_pb2.TOPIC_LIST_SYSTEM:
            found = set(self._cluster_brokers)
            for names in self._cluster_brokers.values():
                found.update(names)
            return sorted(found)
        if kind in self._unit_topics:
            pending = {topic for topic, _, _, flag in self._pending_parts() if kind in _unit_kinds(flag)}
            return sorted(pending.union(self._unit_topics[kind]))
        raise ValidationError("kind", f"unknown topic list kind {kind}")

    def first_broker_addr(self) -> str:
        """An address for TopicList.brokerAddr in the system topic list (RocketMQ: any one; here
        the lowest-id address of the first broker name, for determinism). Empty when none."""
        for name in sorted(self._brokers):
            addrs = self._brokers[name].addrs
            if addrs:
                return addrs[0].addr
        return ""

    # ---- broker reads ------------------------------------------------------------------------

    def broker_data(self, broker_name: str) -> state_pb2.BrokerData | None:
        bd = self._brokers.get(broker_name)
        return _copy(bd) if bd is not None else None

    def broker_member_group(self, cluster_name: str, broker_name: str) -> api_pb2.GetBrokerMemberGroupReply:
        # Like RocketMQ, the group is looked up by broker name only; the cluster is echoed back.
        reply = api_pb2.GetBrokerMemberGroupReply(cluster_name=cluster_name, broker_name=broker_name)
        bd = self._brokers.get(broker_name)
        if bd is not None:
            reply.addrs.extend(bd.addrs)
        return reply

    def broker_live(self, broker_addr: str) -> state_pb2.BrokerLive | None:
        live = self._lives.get(broker_addr)
        return _copy(live) if live is not None else None

    def data_versions(self, addrs: Iterable[str], versions: dict[str, state_pb2.DataVersion] | None = None
                      ) -> list[str]:
        """The addresses not registered; fills `versions` with the DataVersion of the registered ones
        (a heartbeat's reply: RocketMQ's QUERY_DATA_VERSION compares it)."""
        unknown = []
        for addr in addrs:
            live = self._lives.get(addr)
            if live is None:
                unknown.append(addr)
            elif versions is not None:
                versions[addr] = _copy(live.data_version)
        return unknown

    def live_version(self, broker_addr: str) -> int:
        """Version (offset of last write) of live/<addr>; 0 when not registered."""
        return self.kv.version(keys.live_key(broker_addr))

    def live_addrs(self) -> list[tuple[str, state_pb2.BrokerLive, int]]:
        """Every registered address with its BrokerLive and key version, sorted (for expiry scans)."""
        return [(addr, _copy(live), self.live_version(addr)) for addr, live in sorted(self._lives.items())]

    def registered_addrs(self) -> list[str]:
        """Every registered broker address, sorted: live_addrs without copying each record (the leader's
        liveness sync and metrics need the addresses only, every scan, at 10,000s of brokers)."""
        return sorted(self._lives)

    def filter_servers(self, broker_addr: str) -> list[str]:
        return list(self._filters.get(broker_addr, ()))

    def cluster_names(self) -> list[str]:
        return sorted(self._cluster_brokers)

    def broker_names(self, cluster_name: str | None = None) -> list[str]:
        """Broker names of one cluster, or of all clusters when None; sorted."""
        if cluster_name is None:
            return sorted(self._brokers)
        return sorted(self._cluster_brokers.get(cluster_name, ()))

    # ---- topic reads -------------------------------------------------------------------------

    def has_topic(self, topic: str) -> bool:
        return self._entry(topic) is not None

    def topic_count(self) -> int:
        return len(self._all_topics())

    def _all_topics(self) -> Collection[str]:
        if self._stale:
            self.settle_routes()
        if self._pending is None:
            return self._topic_queues.keys()
        return {topic for topic, _, _, _ in self._pending_parts()}.union(self._topic_queues)

    def some_topic(self) -> str | None:
        """A topic the state has (any one: a warm-up read's), None when it has none."""
        if self._stale:
            self.settle_routes()
        for topic in self._topic_queues:
            return topic
        for topic, _, _, _ in self._pending_parts():
            return topic
        return None

    def queue_data(self, topic: str, broker_name: str) -> state_pb2.QueueData | None:
        raw = topicqueues.get(self._entry(topic), broker_name)
        return _decode(state_pb2.QueueData, raw)

    def queue_datas(self, topic: str) -> list[state_pb2.QueueData]:
        """The topic's queue datas sorted by broker name."""
        return [_decode(state_pb2.QueueData, raw) or state_pb2.QueueData()
                for _, raw in topicqueues.by_broker(self._entry(topic))]

    def topic_brokers(self, topic: str) -> list[str]:
        return topicqueues.brokers(self._entry(topic))

    def broker_topics(self, broker_name: str) -> list[str]:
        """Topics with queue data on this broker name, sorted."""
        if self._stale:
            self.settle_routes()
        pending = {topic for topic, broker, _, _ in self._pending_parts() if broker == broker_name}
        return sorted(pending.union(self._broker_topics.get(broker_name, ())))

    def broker_has_topic(self, broker_name: str, topic: str) -> bool:
        if self._stale:
            self.settle_routes()
        if self._pending is not None:
            return topicqueues.get(self._entry(topic), broker_name) is not None
        return topic in self._broker_topics.get(broker_name, ())

    # ---- KV config ---------------------------------------------------------------------------

    def kv_get(self, namespace: str, key: str) -> str | None:
        return self._kv.get(namespace, {}).get(key)

    def kv_list(self, namespace: str) -> dict[str, str]:
        """A copy of one namespace's table (empty when the namespace has no keys)."""
        return dict(self._kv.get(namespace, {}))

    # ---- replicated settings ---------------------------------------------------------------------

    def stored_settings(self) -> dict[str, str]:
        """The settings set through the log (name -> "true"/"false"); see settings.effective."""
        return dict(self._settings)

    def setting_on(self, name: str, default: bool) -> bool:
        value = self._settings.get(name)
        return default if value is None else value == "true"

    def kv_namespace_exists(self, namespace: str) -> bool:
        """A key was put in it, even if all are deleted since (RocketMQ keeps emptied namespaces)."""
        return namespace in self._kv_namespaces or namespace in self._kv

    def kv_namespaces(self) -> list[str]:
        return sorted(self._kv)

    # ---- queue bindings and client sessions ----------------------------------------------------

    def binding(self, topic: str, queue_id: int) -> api_pb2.QueueBinding | None:
        value = self._bindings.get(topic, {}).get(queue_id)
        if value is None:
            return None
        return api_pb2.QueueBinding(topic=topic, queue_id=queue_id, owner=value.owner, epoch=value.epoch,
                                    version=self.kv.version(keys.bind_key(topic, queue_id)))

    def bindings(self, topic: str) -> list[api_pb2.QueueBinding]:
        out = []
        for qid in sorted(self._bindings.get(topic, {})):
            b = self.binding(topic, qid)
            if b is not None:
                out.append(b)
        return out

    def session(self, client_id: str) -> tuple[state_pb2.ClientSession, int] | None:
        """A client's latest exactly-once result and the offset that wrote it."""
        s = self.session_book.get(client_id)
        if s is None:
            return None
        return _copy(s), self.kv.version(keys.session_key(client_id))

    # ---- controller mode ---------------------------------------------------------------------------

    def controller_set(self, broker_name: str) -> tuple[state_pb2.ControllerBrokerSet, int] | None:
        """A broker set of controller mode and its record's version (the precondition to write it)."""
        found = self._controller_sets.get(broker_name)
        if found is None:
            return None
        return _copy(found), self.kv.version(keys.controller_key(broker_name))

    def controller_set_names(self) -> list[str]:
        return sorted(self._controller_sets)

    # ---- members added at runtime ----------------------------------------------------------------

    def member_grpc_addr(self, raft_addr: str) -> str | None:
        value = _decode(state_pb2.MemberInfo, self.kv.get(keys.member_key(raft_addr)))
        return value.grpc_addr if value is not None else None


# Each record kind's (moves routes, handler) by key prefix: what _on_change does for a key (one lookup).
_DISPATCH: dict[str, tuple[bool, _OnChange | None]] = {
    kind.prefix: (kind.routes, _HANDLERS.get(kind.rtype)) for kind in records.KINDS}
