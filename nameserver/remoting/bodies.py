"""RocketMQ body shapes (TopicRouteData, ClusterInfo, TopicList, KVTable, DataVersion, ...) to and from
our protobuf messages. Builders return plain dicts with integer keys where Java has Map<Long, String>,
so jsonfmt.dumps can write them in either fastjson's or standard form."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from nameserver.pb import api_pb2, state_pb2
from nameserver.remoting import jsonfmt


class BodyError(ValueError):
    """A request body that does not have the documented shape."""


def parse_json(body: bytes, what: str) -> Any:
    try:
        return jsonfmt.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise BodyError(f"{what} body is not JSON: {exc}") from None


INT32 = (-(1 << 31), (1 << 31) - 1)
INT64 = (-(1 << 63), (1 << 63) - 1)


def int_value(obj: Mapping[str, Any], name: str, what: str, default: int = 0, bounds: tuple[int, int] = INT32) -> int:
    """An integer field (a JSON number or numeric string) within the Java type's range: Java's
    parseInt/parseLong refuse more, and our protobuf fields could not hold it."""
    value = obj.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise BodyError(f"{what}.{name} is not an integer: {value!r}")
    try:
        number = int(value)
    except ValueError:
        raise BodyError(f"{what}.{name} is not an integer: {value!r}") from None
    if not bounds[0] <= number <= bounds[1]:
        raise BodyError(f"{what}.{name} is out of range: {number}")
    return number


def _object(value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise BodyError(f"{what} is not a JSON object")
    return value


# ---- writers ---------------------------------------------------------------------------------------

def broker_data(bd: state_pb2.BrokerData) -> dict[str, Any]:
    out: dict[str, Any] = {"brokerAddrs": {ba.broker_id: ba.addr for ba in bd.addrs},
                           "brokerName": bd.broker_name, "cluster": bd.cluster,
                           "enableActingMaster": bd.enable_acting_master}
    if bd.zone:
        out["zoneName"] = bd.zone
    return out


def queue_data(qd: state_pb2.QueueData) -> dict[str, Any]:
    return {"brokerName": qd.broker_name, "perm": qd.perm, "readQueueNums": qd.read_queue_nums,
            "topicSysFlag": qd.topic_sys_flag, "writeQueueNums": qd.write_queue_nums}


def queue_mapping(topic: str, broker_name: str, m: state_pb2.QueueMapping) -> dict[str, Any]:
    """RocketMQ's TopicQueueMappingInfo (RIP-21 static topics)."""
    out: dict[str, Any] = {"bname": broker_name, "currIdMap": dict(sorted(m.curr_id_map.items())),
                           "dirty": m.dirty, "epoch": m.epoch, "topic": topic, "totalQueues": m.total_queues}
    if m.scope:
        out["scope"] = m.scope
    return out


def topic_route(route: api_pb2.TopicRoute, topic: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {
        "brokerDatas": [broker_data(bd) for bd in route.broker_datas],
        "filterServerTable": {addr: list(fs.addrs) for addr, fs in route.filter_server_table.items()},
        "queueDatas": [queue_data(qd) for qd in route.queue_datas],
    }
    if route.order_topic_conf:
        out["orderTopicConf"] = route.order_topic_conf
    mappings = {qd.broker_name: queue_mapping(topic, qd.broker_name, qd.mapping)
                for qd in route.queue_datas if qd.HasField("mapping")}
    if mappings:  # RocketMQ leaves the field out (null) for a topic without static queues
        out["topicQueueMappingByBroker"] = mappings
    return out


def cluster_info(reply: api_pb2.GetClusterInfoReply) -> dict[str, Any]:
    return {"brokerAddrTable": {name: broker_data(bd) for name, bd in reply.broker_addr_table.items()},
            "clusterAddrTable": {c: list(names.names) for c, names in reply.cluster_addr_table.items()}}


def topic_list(topics: Iterable[str], broker_addr: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {"topicList": list(topics)}
    if broker_addr:
        out["brokerAddr"] = broker_addr
    return out


def kv_table(table: Mapping[str, str]) -> dict[str, Any]:
    return {"table": dict(table)}


def data_version(dv: state_pb2.DataVersion, with_state_version: bool = True) -> dict[str, Any]:
    """DataVersion; RocketMQ before 5 has no stateVersion field."""
    out = {"counter": dv.counter, "timestamp": dv.timestamp}
    if with_state_version:
        out["stateVersion"] = dv.state_version
    return dict(sorted(out.items()))


def member_group(reply: api_pb2.GetBrokerMemberGroupReply) -> dict[str, Any]:
    return {"brokerMemberGroup": {"brokerAddrs": {ba.broker_id: ba.addr for ba in reply.addrs},
                                  "brokerName": reply.broker_name, "cluster": reply.cluster_name}}


def encode(obj: Any, fastjson: bool = False) -> bytes:
    return jsonfmt.dumps(obj, fastjson=fastjson)


# ---- readers ---------------------------------------------------------------------------------------

def parse_data_version(obj: Any, what: str = "dataVersion") -> state_pb2.DataVersion:
    doc = _object(obj, what)
    return state_pb2.DataVersion(counter=int_value(doc, "counter", what, bounds=INT64),
                                 timestamp=int_value(doc, "timestamp", what, bounds=INT64),
                                 state_version=int_value(doc, "stateVersion", what, bounds=INT64))


def parse_queue_datas(body: bytes) -> list[state_pb2.QueueData]:
    """The queueDatas of a TopicRouteData body (REGISTER_TOPIC_IN_NAMESRV)."""
    doc = _object(parse_json(body, "TopicRouteData"), "TopicRouteData")
    items = doc.get("queueDatas") or []
    if not isinstance(items, list):
        raise BodyError("TopicRouteData.queueDatas is not a list")
    out = []
    for i, raw in enumerate(items):
        what = f"queueDatas[{i}]"
        qd = _object(raw, what)
        out.append(state_pb2.QueueData(
            broker_name=str(qd.get("brokerName") or ""), read_queue_nums=int_value(qd, "readQueueNums", what),
            write_queue_nums=int_value(qd, "writeQueueNums", what), perm=int_value(qd, "perm", what),
            topic_sys_flag=int_value(qd, "topicSysFlag", what)))
    return out


def parse_queue_mapping(obj: Any, what: str) -> tuple[str, str, state_pb2.QueueMapping]:
    """A TopicQueueMappingInfo: (topic, bname, mapping). currIdMap keys may be quoted or not."""
    doc = _object(obj, what)
    ids = doc.get("currIdMap") or {}
    if not isinstance(ids, dict):
        raise BodyError(f"{what}.currIdMap is not a JSON object")
    mapping = state_pb2.QueueMapping(scope=str(doc.get("scope") or ""),
                                     total_queues=int_value(doc, "totalQueues", what),
                                     epoch=int_value(doc, "epoch", what, bounds=INT64), dirty=doc.get("dirty") is True)
    for logical in ids:
        key = int_value({"id": logical}, "id", f"{what}.currIdMap key")
        mapping.curr_id_map[key] = int_value(ids, logical, f"{what}.currIdMap")
    return str(doc.get("topic") or ""), str(doc.get("bname") or ""), mapping


def topic_config(doc: Mapping[str, Any], name: str, what: str) -> api_pb2.TopicConfig:
    """A TopicConfig JSON object (the map key is the name when topicName is absent)."""
    return api_pb2.TopicConfig(
        topic_name=str(doc.get("topicName") or name), read_queue_nums=int_value(doc, "readQueueNums", what),
        write_queue_nums=int_value(doc, "writeQueueNums", what), perm=int_value(doc, "perm", what),
        topic_sys_flag=int_value(doc, "topicSysFlag", what))
