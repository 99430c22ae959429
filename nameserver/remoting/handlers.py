"""Request handlers: each remoting request becomes the equivalent call on this node's gRPC service.

The service is called in-process (nameserver/api/inprocess.py), not over gRPC and not through the node
object, so the remoting port has exactly the gRPC semantics: validation with the field named, writes
forwarded to the Raft leader, the same errors, the same role table.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from nameserver import validation
from nameserver.chunking import register_chunks, should_stream
from nameserver.config import LIMITS, NodeConfig
from nameserver.errors import ValidationError
from nameserver.logthrottle import ThrottledLog
from nameserver.pb import api_pb2, state_pb2
from nameserver.remoting import bodies, codes, registerbody, stockconfig
from nameserver.remoting.bodycache import BodyCache
from nameserver.remoting.command import Command
from nameserver.remoting.request import (
    RequestError,
    bool_field,
    dispatch,
    int_field,
    need,
    wants_fastjson,
)
from nameserver.remoting.routerequests import RouteRequests
from nameserver.remoting.status import response_code, rpc_error_parts
from nameserver.safetext import shown

log = logging.getLogger("nameserver.remoting")
# What a caller's request made us leave out: one line per kind per interval, names escaped and cut.
refusals = ThrottledLog(log)

BIG_REGISTRATION_TIMEOUT_S = 60.0
# RocketMQ appends this to the 17 remark (FAQUrl.suggestTodo), with the FAQ's address of its line; clients
# and scripts may match on the text. A request from the 5.x line gets 5.x's address.
FAQ_URL_4 = "http://rocketmq.apache.org/docs/faq/"
FAQ_URL_5 = "https://rocketmq.apache.org/docs/bestPractice/06FAQ"


def _faq_suggestion(req: Command) -> str:
    return f"\nSee {FAQ_URL_5 if req.version >= codes.V5_0_0 else FAQ_URL_4} for further details."


def _storable(check: Callable[[], None]) -> bool:
    """Whether a name passes the check we apply before storing it. One that does not is held nowhere, so a
    read naming it is answered as stock answers a name it does not hold (not found, an empty list or group),
    never SYSTEM_ERROR."""
    try:
        check()
    except ValidationError:
        return False
    return True


def _not_found_if_refused(check: Callable[[], None], code: int, remark: str) -> None:
    """A name we would refuse to store gets the not-found code (17, 22) the stock NameServer gives any name it
    does not hold. Clients act on that code: the 5.x proxy takes only 17 as "no such topic"."""
    if not _storable(check):
        raise RequestError(code, remark)


def _route_missing(req: Command, topic: str) -> Callable[[], str]:
    """A route read's not-found remark, made when it is needed (most reads find their topic)."""
    return lambda: f"No topic route info in name server for the topic: {topic}{_faq_suggestion(req)}"


ORDER_TOPIC_CONFIG = "ORDER_TOPIC_CONFIG"
UNKNOWN_BROKER = "is not registered"  # RegisterTopic's refusal of a queue data naming an unknown broker
# The requests by which a broker makes a connection its own (RocketMQ's brokerLiveTable channel).
BROKER_CHANNEL_CODES = frozenset({codes.REGISTER_BROKER, codes.BROKER_HEARTBEAT, codes.QUERY_DATA_VERSION})



# GET_NAMESRV_CONFIG lists these settings and nothing else: a list of what may be shown, never a list
# of what to hide, so a secret added to NodeConfig later cannot leak by default. No token, hash, role
# map, password or file path is on it.
PUBLIC_SETTINGS = (
    "raft_addr", "grpc_addr", "members", "election_min_ms", "election_max_ms", "snapshot_every_entries",
    "snapshot_every_seconds", "snapshots_kept", "batch_append", "fsync", "read_lease", "group_commit_linger_us",
    "idle_noop_ms", "default_timeout_ms", "scan_interval_ms", "forward_interval_ms", "order_message_enable",
    "max_message_bytes", "workers", "max_watchers", "write_timeout_ms", "remoting_addr",
    "metrics_addr", "session_ttl_ms", "max_sessions", "max_sessions_per_owner", "security_mode", "tls_client_auth",
    "remoting_tls_mode",
) + LIMITS


def parse_properties(text: str) -> dict[str, str]:
    """Java properties text as RocketMQ's 318 body carries it: `key=value` (or `key: value`, `key value`)
    lines; blank lines and `#`/`!` comments skipped. Line continuations and escapes are not needed here:
    every replicated setting is a boolean."""
    out = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        cut = min((i for i in (line.find("="), line.find(":"), line.find(" ")) if i >= 0), default=len(line))
        key, rest = line[:cut].strip(), line[cut:].strip()
        if rest[:1] in ("=", ":"):
            rest = rest[1:].strip()
        out[key] = rest
    return out


def config_properties(cfg: NodeConfig, replicated: dict[str, bool]) -> str:
    """GET_NAMESRV_CONFIG as Java properties text: the replicated settings under RocketMQ's NamesrvConfig
    names (their effective values), RocketMQ's other NamesrvConfig keys (stockconfig), then the node's
    public settings."""
    lines = [f"{name}={'true' if on else 'false'}" for name, on in replicated.items()]
    lines += [f"{name}={value}" for name, value in stockconfig.stock_values(cfg).items() if name not in replicated]
    for name in PUBLIC_SETTINGS:
        value = getattr(cfg, name)
        if name == "members":
            value = ",".join(f"{m.raft_addr}/{m.grpc_addr}" for m in value)
        elif isinstance(value, bool):
            value = "true" if value else "false"
        lines.append(f"{name}={value}")
    lines += [f"tls_enabled={'true' if cfg.tls_enabled else 'false'}",
              f"auth_enabled={'true' if cfg.auth_enabled else 'false'}"]
    return "\n".join(sorted(lines)) + "\n"


def registration_request(req: Command) -> tuple[api_pb2.RegisterBrokerRequest, str | None]:
    """A REGISTER_BROKER frame as the API's request, and the remark when its heartbeat timeout was clamped
    (RocketMQ takes any). Raises RequestError (a body failing its CRC) or BodyError."""
    crc = int_field(req, "bodyCrc32", 0)
    if crc != 0 and registerbody.crc32(req.body) != crc:
        raise RequestError(codes.SYSTEM_ERROR, "crc32 not match")
    body = registerbody.decode(req.body, bool_field(req, "compressed"))
    broker = req.ext("brokerName") or "?"
    ignored = body.attach_mappings(broker)
    if ignored:
        refusals.warning("static_mappings_ignored", "remoting: broker %s: %d static-topic queue mapping(s) "
                         "ignored: %s", shown(broker), len(ignored), shown("; ".join(ignored[:3]), 600))
    request = api_pb2.RegisterBrokerRequest(
        cluster_name=need(req, "clusterName"), broker_name=need(req, "brokerName"),
        broker_addr=need(req, "brokerAddr"), broker_id=int_field(req, "brokerId"),
        ha_server_addr=req.ext("haServerAddr") or "",
        heartbeat_timeout_ms=int_field(req, "heartbeatTimeoutMillis", 0),
        # a missing field (brokers before 5) is kept apart from false: see translate.register_broker
        enable_acting_master=(None if req.ext("enableActingMaster") is None
                              else bool_field(req, "enableActingMaster")),
        zone_name=req.ext("__ZONE_NAME") or "",
        data_version=body.data_version, topics=storable_topics(body.topics, broker),
        filter_servers=body.filter_servers)
    return request, validation.clamp_heartbeat_timeout(request)


def registration_answer(req: Command, reply: api_pb2.RegisterBrokerReply, clamped: str | None) -> Command:
    """What a broker is told back for its registration."""
    ext = {k: v for k, v in (("haServerAddr", reply.ha_server_addr), ("masterAddr", reply.master_addr)) if v}
    # RocketMQ answers with the ORDER_TOPIC_CONFIG namespace's KVTable whenever the namespace exists, an
    # emptied one as {"table":{}} (4.9 brokers then clear their topics' order flag); no body when it
    # was never written. (A table without the flag comes from a leader older than the flag.)
    has_table = reply.order_topic_config_exists or bool(reply.order_topic_config)
    body_out = bodies.encode(bodies.kv_table(reply.order_topic_config)) if has_table else b""
    return req.response(ext_fields=ext, body=body_out, remark=clamped)


def storable_topics(topics: list[api_pb2.TopicConfig], broker: str) -> list[api_pb2.TopicConfig]:
    """The topics we can store. The stock NameServer checks none, and a broker whose registration
    is refused expires; so a topic we cannot hold is left out (with a warning), never the broker."""
    kept: list[api_pb2.TopicConfig] = []
    seen: set[str] = set()
    dropped: list[str] = []
    for i, tc in enumerate(topics):
        try:
            validation.check_topic_config(f"topicConfigTable[{i}].", tc)
        except validation.ValidationError as exc:
            dropped.append(str(exc))
            continue
        if tc.topic_name in seen:
            dropped.append(f"topicConfigTable[{i}]: duplicate topic {tc.topic_name!r}")
            continue
        seen.add(tc.topic_name)
        kept.append(tc)
    if dropped:
        refusals.warning("topics_left_out", "remoting: broker %s registered %d topic(s) this nameserver "
                         "cannot store; left out, the rest registered: %s", shown(broker), len(dropped),
                         shown("; ".join(dropped[:3]), 600))
    return kept


class Handlers:
    def __init__(self, ns: Any, cfg: NodeConfig, timeout_s: float) -> None:
        self.ns = ns  # NameServer's calls, stub-style: ns.GetRoute(request, timeout=...)
        self.cfg = cfg
        self.timeout = timeout_s
        self._bound: dict[str, tuple[object, api_pb2.BrokerHeartbeat]] = {}  # broker addr -> its connection
        self._bound_lock = threading.Lock()
        self.route_bodies = BodyCache()  # 105's JSON, reused while a topic's route is unchanged
        self.route_requests = RouteRequests()  # 105's service requests, checked and built once per topic
        self._table = {code: served.handler(self) for code, served in REQUESTS.items()}

    @property
    def supported_codes(self) -> list[int]:
        return sorted(self._table)

    def handle(self, req: Command, conn: object | None = None) -> Command:
        """Answer one request; `conn` identifies the connection it came on (see connection_closed)."""
        resp = dispatch(self._table, req)
        if conn is not None and resp.code == codes.SUCCESS and req.code in BROKER_CHANNEL_CODES:
            self._bind(req, conn)
        return resp

    # ---- brokers' connections (RocketMQ unregisters a broker when its channel closes) ----------------

    def _bind(self, req: Command, conn: object) -> None:
        """A broker spoke on `conn`: it is the broker's connection to this node. The leader hears of it
        from every 904 and 322 (their heartbeat names this node) and after every registration, so a
        new leader learns it within one registration period."""
        beat = self._beat(req)
        self.bind(beat, conn)
        if req.code == codes.REGISTER_BROKER:
            self._report([beat])

    def bind(self, beat: api_pb2.BrokerHeartbeat, conn: object) -> None:
        """`conn` is the broker's connection to this node (the leader hears of it from `beat`, sent by the caller)."""
        with self._bound_lock:
            self._bound[beat.broker_addr] = (conn, beat)

    def _beat(self, req: Command) -> api_pb2.BrokerHeartbeat:
        return api_pb2.BrokerHeartbeat(cluster_name=req.ext("clusterName") or "",
                                       broker_name=req.ext("brokerName") or "", broker_addr=need(req, "brokerAddr"),
                                       channel_node=self.cfg.raft_addr)

    def holds(self, broker_addr: str) -> bool:
        """The broker at this address spoke on a connection to this listener that is still open."""
        with self._bound_lock:
            return broker_addr in self._bound

    def connection_closed(self, conn: object) -> None:
        """The connection closed: the leader unregisters each broker whose every connection is gone."""
        with self._bound_lock:
            gone = [beat for addr, (c, beat) in self._bound.items() if c is conn]
            for beat in gone:
                del self._bound[beat.broker_addr]
        if gone:
            closed = [api_pb2.BrokerHeartbeat(cluster_name=b.cluster_name, broker_name=b.broker_name,
                                              broker_addr=b.broker_addr, channel_node=b.channel_node,
                                              channel_closed=True) for b in gone]
            self._report(closed)

    def _report(self, beats: list[api_pb2.BrokerHeartbeat]) -> None:
        try:
            self.ns.Heartbeat(api_pb2.HeartbeatRequest(heartbeats=beats), timeout=self.timeout)
        except grpc.RpcError as exc:  # the broker's own timeout still applies
            log.info("remoting: could not report %d broker connection(s) to the leader: %s", len(beats),
                     rpc_error_parts(exc)[1])

    def _call(self, method: Callable[..., Any], request: Any, not_found: int = codes.SYSTEM_ERROR,
              not_found_remark: str | Callable[[], str] | None = None, timeout: float | None = None) -> Any:
        try:
            return method(request, timeout=timeout or self.timeout)
        except grpc.RpcError as exc:
            status, details = rpc_error_parts(exc)
            if status == grpc.StatusCode.NOT_FOUND and not_found_remark is not None:
                details = not_found_remark if isinstance(not_found_remark, str) else not_found_remark()
            raise RequestError(response_code(status, not_found), details) from None

    # ---- KV config -----------------------------------------------------------------------------

    def put_kv(self, req: Command) -> Command:
        self._call(self.ns.PutKv, api_pb2.PutKvRequest(namespace=need(req, "namespace"), key=need(req, "key"),
                                                      value=req.ext("value") or ""))
        return req.response()

    def get_kv(self, req: Command) -> Command:
        namespace, key = need(req, "namespace"), need(req, "key")
        missing = f"No config item, Namespace: {namespace} Key: {key}"
        _not_found_if_refused(lambda: validation.check_kv(namespace, key), codes.QUERY_NOT_FOUND, missing)
        reply = self._call(self.ns.GetKv, api_pb2.GetKvRequest(namespace=namespace, key=key),
                           codes.QUERY_NOT_FOUND, missing)
        return req.response(ext_fields={"value": reply.value})

    def delete_kv(self, req: Command) -> Command:
        self._call(self.ns.DeleteKv, api_pb2.DeleteKvRequest(namespace=need(req, "namespace"),
                                                            key=need(req, "key")))
        return req.response()

    def list_kv(self, req: Command) -> Command:
        namespace = need(req, "namespace")
        missing = f"No config item, Namespace: {namespace}"
        _not_found_if_refused(lambda: validation.check_kv(namespace), codes.QUERY_NOT_FOUND, missing)
        reply = self._call(self.ns.ListKv, api_pb2.ListKvRequest(namespace=namespace))
        if not reply.table and not reply.namespace_exists:  # an emptied namespace answers {"table":{}}
            return req.response(codes.QUERY_NOT_FOUND, missing)
        return req.response(body=bodies.encode(bodies.kv_table(reply.table)))

    # ---- broker side ---------------------------------------------------------------------------

    def register_broker(self, req: Command) -> Command:
        request, clamped = registration_request(req)
        if should_stream(request):
            # Tens of thousands of topics take seconds to translate and replicate: allow more time.
            timeout = max(self.timeout, BIG_REGISTRATION_TIMEOUT_S)
            reply = self._call(
                lambda r, timeout: self.ns.RegisterBrokerStream(iter(register_chunks(r)), timeout=timeout),
                request, timeout=timeout)
        else:
            reply = self._call(self.ns.RegisterBroker, request)
        return registration_answer(req, reply, clamped)

    def unregister_broker(self, req: Command) -> Command:
        self._call(self.ns.UnregisterBroker, api_pb2.UnregisterBrokerRequest(
            cluster_name=need(req, "clusterName"), broker_name=need(req, "brokerName"),
            broker_addr=need(req, "brokerAddr"), broker_id=int_field(req, "brokerId")))
        return req.response()

    def _heartbeat(self, req: Command) -> api_pb2.HeartbeatReply:
        """Refresh the address's liveness; the reply says whether it is known and its DataVersion."""
        return self._call(self.ns.Heartbeat, api_pb2.HeartbeatRequest(heartbeats=[self._beat(req)]))

    def broker_heartbeat(self, req: Command) -> Command:
        self._heartbeat(req)
        return req.response()

    def query_data_version(self, req: Command) -> Command:
        # One point read per call (acting-master brokers send this every second to every nameserver).
        theirs = (bodies.parse_data_version(bodies.parse_json(req.body, "DataVersion"))
                  if req.body else state_pb2.DataVersion())
        reply = self._heartbeat(req)
        addr = need(req, "brokerAddr")
        ours = reply.data_versions.get(addr)
        # Unknown: "changed", so the broker registers in full.
        changed = ours is None or ours != theirs
        body = b""
        if ours is not None:
            # Answer in the broker's dialect: brokers before 5 have no stateVersion in their DataVersion.
            with_state = not req.body or b'"stateVersion"' in req.body
            body = bodies.encode(bodies.data_version(ours, with_state_version=with_state))
        return req.response(ext_fields={"changed": "true" if changed else "false"}, body=body)

    def broker_member_group(self, req: Command) -> Command:
        # RocketMQ looks the group up by broker name only and echoes the cluster, whatever its length; a broker
        # name we could not store is held by no one: stock's empty group (not an error).
        cluster, broker = req.ext("clusterName") or "", need(req, "brokerName")
        if _storable(lambda: validation.check_name("brokerName", broker)):
            reply = self._call(self.ns.GetBrokerMemberGroup, api_pb2.GetBrokerMemberGroupRequest(broker_name=broker))
        else:
            reply = api_pb2.GetBrokerMemberGroupReply(broker_name=broker)
        reply.cluster_name = cluster
        # RocketMQ 5's answer carries its response factory's default remark; so does ours.
        return req.response(body=bodies.encode(bodies.member_group(reply), wants_fastjson(req)),
                            remark="not set any response code")

    # ---- client reads --------------------------------------------------------------------------

    def route(self, req: Command) -> Command:
        topic = need(req, "topic")
        # RocketMQ's ZoneRouteRPCHook: the client opts in per request (the node must run in zone mode too).
        zone = (req.ext("__ZONE_NAME") or "") if bool_field(req, "__ZONE_MODE") else ""
        missing = _route_missing(req, topic)
        request = self.route_requests.get(topic, zone)
        if request is None:  # a name we would refuse to store: stock's not-found (see _not_found_if_refused)
            raise RequestError(codes.TOPIC_NOT_EXIST, missing())
        reply = self._call(self.ns.GetRoute, request, codes.TOPIC_NOT_EXIST, missing)
        fastjson = wants_fastjson(req)
        body = self.route_bodies.get(topic, fastjson, reply.route.SerializeToString(deterministic=True),
                                     lambda: bodies.encode(bodies.topic_route(reply.route, topic), fastjson))
        return req.response(body=body)

    def cluster_info(self, req: Command) -> Command:
        reply = self._call(self.ns.GetClusterInfo, api_pb2.GetClusterInfoRequest())
        return req.response(body=bodies.encode(bodies.cluster_info(reply), wants_fastjson(req)))

    def _topic_list(self, kind: api_pb2.TopicListKind) -> Callable[[Command], Command]:
        def handler(req: Command) -> Command:
            cluster = need(req, "cluster") if kind == api_pb2.TOPIC_LIST_BY_CLUSTER else ""
            if cluster and not _storable(lambda: validation.check_name("cluster", cluster)):
                return req.response(body=bodies.encode(bodies.topic_list([])))  # stock: no such cluster, no topics
            reply = self._call(self.ns.GetTopicList, api_pb2.GetTopicListRequest(kind=kind, cluster_name=cluster))
            broker_addr = self._any_broker_addr() if kind == api_pb2.TOPIC_LIST_SYSTEM else ""
            return req.response(body=bodies.encode(bodies.topic_list(reply.topics, broker_addr)))
        return handler

    def _any_broker_addr(self) -> str:
        # RocketMQ puts one broker address in the system topic list; we take the lowest-id address of
        # the first broker name, so every node answers the same.
        info = self._call(self.ns.GetClusterInfo, api_pb2.GetClusterInfoRequest())
        for name in sorted(info.broker_addr_table):
            addrs = sorted(info.broker_addr_table[name].addrs, key=lambda ba: ba.broker_id)
            if addrs:
                return addrs[0].addr
        return ""

    # ---- topic and permission administration ---------------------------------------------------

    def _perm(self, method: str, count_field: str) -> Callable[[Command], Command]:
        def handler(req: Command) -> Command:
            request = api_pb2.BrokerPermRequest(broker_name=need(req, "brokerName"))
            reply = self._call(getattr(self.ns, method), request)
            return req.response(ext_fields={count_field: str(reply.topic_count)})
        return handler

    def delete_topic(self, req: Command) -> Command:
        self._call(self.ns.DeleteTopic, api_pb2.DeleteTopicRequest(topic=need(req, "topic"),
                                                                  cluster_name=req.ext("clusterName") or ""))
        return req.response()

    def register_topic(self, req: Command) -> Command:
        queue_datas = bodies.parse_queue_datas(req.body) if req.body else []
        try:
            self._call(self.ns.RegisterTopic, api_pb2.RegisterTopicRequest(topic=need(req, "topic"),
                                                                          queue_datas=queue_datas))
        except RequestError as exc:
            if UNKNOWN_BROKER not in exc.remark:
                raise
            # RocketMQ ignores a 217 naming a broker it does not know and answers SUCCESS; so do we
            # (nothing was written: our RegisterTopic is all or nothing).
            refusals.info("unknown_broker_topic", "remoting: 217 for topic %s ignored: %s", shown(req.ext("topic")),
                          shown(exc.remark))
        return req.response()

    # ---- nameserver configuration ----------------------------------------------------------------

    def update_config(self, req: Command) -> Command:
        """Every key RocketMQ's NameServer takes: its NamesrvConfig switches are replicated through the
        log (UpdateSettings), so every node answers the new value and it survives restarts; its other keys,
        and keys it does not know, are accepted with a remark saying they change nothing here (as stock
        ignores keys it does not know). Only its black list is refused, as stock refuses it."""
        try:
            properties = parse_properties(req.body.decode("utf-8")) if req.body else {}
        except UnicodeDecodeError:
            raise RequestError(codes.SYSTEM_ERROR, "string2Properties error: the body is not UTF-8") from None
        if stockconfig.CONFIG_BLACK_LIST & properties.keys():
            raise RequestError(codes.NO_PERMISSION, "Can not update config in black list.")
        replicated, no_effect, unknown = stockconfig.split_update(properties)
        if replicated:  # an empty body changes nothing (RocketMQ answers SUCCESS too)
            self._call(self.ns.UpdateSettings, api_pb2.UpdateSettingsRequest(
                settings={name: properties[name] for name in replicated}))
        return req.response(remark=stockconfig.update_remark(no_effect, unknown))

    def get_config(self, req: Command) -> Command:
        reply = self._call(self.ns.GetSettings, api_pb2.GetSettingsRequest())
        return req.response(body=config_properties(self.cfg, dict(reply.settings)).encode("utf-8"))


@dataclass(frozen=True)
class Served:
    """How one request code is served: its handler, made from the Handlers of a listener."""

    handler: Callable[[Handlers], Callable[[Command], Command]]
    # Answered on the listener's event loop when the node's state is free at once (nameserver/core/nowait.py),
    # else on a worker: route reads, which clients ask every 30 s per topic (a worker thread's hand-off
    # cost several times the read itself: ~15 us in-process against ~200 us for the hop).
    inline: bool = False
    # Answered by a remoting worker process from its read replica (nameserver/worker.py): the handler
    # only reads the state (and the node's own settings). Every other code goes to the node's core.
    replica: bool = False
    # Answered by a sharded worker process itself (several Raft groups): the handler's write is one the
    # worker's service splits over the groups as its gRPC twin is split (nameserver/groups/writes.py).
    routed: bool = False


# The request codes this port serves: the one list (docs/remoting.md's table is checked against it, the
# fuzzers draw from it, the listener counts and inlines from it).
REQUESTS: dict[int, Served] = {
    codes.PUT_KV_CONFIG: Served(lambda h: h.put_kv),
    codes.GET_KV_CONFIG: Served(lambda h: h.get_kv, replica=True),
    codes.DELETE_KV_CONFIG: Served(lambda h: h.delete_kv),
    codes.GET_KVLIST_BY_NAMESPACE: Served(lambda h: h.list_kv, replica=True),
    codes.REGISTER_BROKER: Served(lambda h: h.register_broker),
    codes.UNREGISTER_BROKER: Served(lambda h: h.unregister_broker),
    codes.BROKER_HEARTBEAT: Served(lambda h: h.broker_heartbeat),
    codes.QUERY_DATA_VERSION: Served(lambda h: h.query_data_version),
    codes.GET_BROKER_MEMBER_GROUP: Served(lambda h: h.broker_member_group, replica=True),
    codes.GET_ROUTEINFO_BY_TOPIC: Served(lambda h: h.route, inline=True, replica=True),
    codes.GET_BROKER_CLUSTER_INFO: Served(lambda h: h.cluster_info, replica=True),
    codes.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: Served(lambda h: h._topic_list(api_pb2.TOPIC_LIST_ALL), replica=True),
    codes.GET_TOPICS_BY_CLUSTER: Served(lambda h: h._topic_list(api_pb2.TOPIC_LIST_BY_CLUSTER), replica=True),
    codes.GET_SYSTEM_TOPIC_LIST_FROM_NS: Served(lambda h: h._topic_list(api_pb2.TOPIC_LIST_SYSTEM), replica=True),
    codes.GET_UNIT_TOPIC_LIST: Served(lambda h: h._topic_list(api_pb2.TOPIC_LIST_UNIT), replica=True),
    codes.GET_HAS_UNIT_SUB_TOPIC_LIST: Served(lambda h: h._topic_list(api_pb2.TOPIC_LIST_HAS_UNIT_SUB), replica=True),
    codes.GET_HAS_UNIT_SUB_UNUNIT_TOPIC_LIST: Served(
        lambda h: h._topic_list(api_pb2.TOPIC_LIST_HAS_UNIT_SUB_NOT_UNIT), replica=True),
    codes.WIPE_WRITE_PERM_OF_BROKER: Served(lambda h: h._perm("WipeWritePerm", "wipeTopicCount")),
    codes.ADD_WRITE_PERM_OF_BROKER: Served(lambda h: h._perm("AddWritePerm", "addTopicCount")),
    codes.DELETE_TOPIC_IN_NAMESRV: Served(lambda h: h.delete_topic),
    codes.REGISTER_TOPIC_IN_NAMESRV: Served(lambda h: h.register_topic, routed=True),
    codes.UPDATE_NAMESRV_CONFIG: Served(lambda h: h.update_config),
    codes.GET_NAMESRV_CONFIG: Served(lambda h: h.get_config, replica=True),
}
INLINE_CODES = frozenset(code for code, served in REQUESTS.items() if served.inline)
REPLICA_CODES = frozenset(code for code, served in REQUESTS.items() if served.replica)
ROUTED_CODES = frozenset(code for code, served in REQUESTS.items() if served.routed)
