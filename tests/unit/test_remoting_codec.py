"""The remoting wire format: frames, JSON and ROCKETMQ binary headers, fastjson bodies, and the
RegisterBrokerBody (plain, compressed, CRC). Golden bytes are written out by hand from the documented
shapes (../shared/notes/rocketmq-nameserver.md), never produced by the code under test."""

from __future__ import annotations

import json
import struct
import zlib

import pytest
from fakebroker import register_body

from nameserver.remoting import bodies, codes, frame, header, jsonfmt, registerbody, request
from nameserver.remoting.bodies import BodyError
from nameserver.remoting.command import Command, FrameError, FrameRefused
from nameserver.remoting.request import RequestError

# The Java client's GET_ROUTEINFO_BY_TOPIC for TopicTest with a ROCKETMQ binary header (5.3.x, opaque 1).
JAVA_BINARY_ROUTE_REQUEST = bytes.fromhex(
    "0000002d"            # total length 45
    "01000029"            # serialization type 1 (ROCKETMQ), header length 41
    "0069" "00" "01df"    # code 105, language JAVA, version 479
    "00000001" "00000000"  # opaque 1, flag 0
    "00000000"            # remark length 0
    "00000014"            # extFields length 20
    "0005" + b"topic".hex() + "00000009" + b"TopicTest".hex())

# The same request with the JSON header, exactly as Java writes it.
JAVA_JSON_ROUTE_HEADER = (b'{"code":105,"extFields":{"topic":"TopicTest"},"flag":0,"language":"JAVA","opaque":1,'
                          b'"serializeTypeCurrentRPC":"JSON","version":479}')


BINARY_FIXED = struct.pack(">hbhii", 105, 0, 479, 1, 0)  # code, language, version, opaque, flag


def json_frame(head: bytes, body: bytes = b"") -> bytes:
    return struct.pack(">ii", 4 + len(head) + len(body), len(head)) + head + body


def test_java_binary_header_example_decodes() -> None:
    assert len(JAVA_BINARY_ROUTE_REQUEST) == 4 + 0x2D
    assert JAVA_BINARY_ROUTE_REQUEST[:13] == bytes.fromhex("0000002d010000290069" "0001df")
    cmd = frame.decode(JAVA_BINARY_ROUTE_REQUEST[4:])
    assert (cmd.code, cmd.language, cmd.version, cmd.opaque, cmd.flag) == (105, "JAVA", 479, 1, 0)
    assert cmd.remark is None and cmd.ext_fields == {"topic": "TopicTest"} and cmd.body == b""
    assert cmd.serialize_type == codes.SERIALIZE_ROCKETMQ


def test_binary_header_round_trip_matches_the_java_bytes() -> None:
    cmd = Command(code=105, language="JAVA", version=479, opaque=1, ext_fields={"topic": "TopicTest"})
    assert frame.encode(cmd, codes.SERIALIZE_ROCKETMQ) == JAVA_BINARY_ROUTE_REQUEST


def binary_frame(head: bytes, body: bytes = b"") -> bytes:
    return struct.pack(">ii", 4 + len(head) + len(body), (codes.SERIALIZE_ROCKETMQ << 24) | len(head)) + head + body


def test_a_binary_request_is_answered_with_a_binary_header() -> None:
    # Stock RocketMQ answers in the request's serialize type (the response's serializeTypeCurrentRPC).
    req = frame.decode(JAVA_BINARY_ROUTE_REQUEST[4:])
    data = frame.encode(req.response(codes.TOPIC_NOT_EXIST, "no route", {"b": "2", "a": "1"}, b"BODY"))
    assert data == bytes.fromhex(
        "00000035" "0100002d"         # total 53; type 1 (ROCKETMQ), header length 45
        "0011" "00" "01df"            # code 17, language JAVA, version 479
        "00000001" "00000001"         # opaque 1 (the request's), flag 1 (response)
        "00000008" + b"no route".hex() + "00000010"
        "0001" + b"b".hex() + "00000001" + b"2".hex() + "0001" + b"a".hex() + "00000001" + b"1".hex()) + b"BODY"
    empty = frame.encode(req.response())  # no remark, no extFields: both lengths 0
    assert empty[4:] == bytes.fromhex("01000015" "0000" "00" "01df" "00000001" "00000001" "00000000" "00000000")


def test_zero_length_binary_strings_are_null() -> None:
    # RocketMQSerializable.readStr: length 0 is null. A null extFields value is no field (a handler's
    # "the custom field <topic> is null"), a null key names none; a later null replaces an earlier value.
    ext = (struct.pack(">h", 5) + b"topic" + struct.pack(">i", 0)
           + struct.pack(">h", 0) + struct.pack(">i", 1) + b"x"
           + struct.pack(">h", 1) + b"k" + struct.pack(">i", 1) + b"v"
           + struct.pack(">h", 1) + b"k" + struct.pack(">i", 0)
           + struct.pack(">h", 1) + b"n" + struct.pack(">i", 1) + b"1")
    cmd = frame.decode(binary_frame(BINARY_FIXED + struct.pack(">ii", 0, len(ext)) + ext)[4:])
    assert cmd.remark is None and cmd.ext_fields == {"n": "1"}
    with pytest.raises(RequestError, match="the custom field <topic> is null"):
        request.need(cmd, "topic")


def test_bytes_after_the_binary_header_fields_are_read_as_stock_reads_them() -> None:
    fields = BINARY_FIXED + struct.pack(">ii", 0, 0)
    # no body: what follows the fields is ignored
    cmd = frame.decode(binary_frame(fields + b"??")[4:])
    assert (cmd.code, cmd.opaque, cmd.ext_fields, cmd.body) == (105, 1, {}, b"")
    # with a body: stock reads the body from where the fields ended, for the length the header word gives
    cmd = frame.decode(binary_frame(fields + b"??", b"BODY")[4:])
    assert cmd.body == b"??BO"
    # a last pair may run past the extFields length, inside the header
    pair = struct.pack(">h", 1) + b"k" + struct.pack(">i", 1) + b"v"
    cmd = frame.decode(binary_frame(BINARY_FIXED + struct.pack(">ii", 0, 1) + pair)[4:])
    assert cmd.ext_fields == {"k": "v"}


def test_a_refused_binary_frame_is_answered_in_binary() -> None:
    word = struct.pack(">i", (codes.SERIALIZE_ROCKETMQ << 24) | 70_000)
    with pytest.raises(FrameRefused) as refused:
        frame.decode(word + b"\0" * 70_000, max_header=65_536)
    assert refused.value.serialize_type == codes.SERIALIZE_ROCKETMQ
    with pytest.raises(FrameRefused) as refused:
        frame.decode(struct.pack(">i", (9 << 24) | 70_000) + b"\0" * 70_000, max_header=65_536)
    assert refused.value.serialize_type == codes.SERIALIZE_JSON  # a type we do not write


def test_java_json_header_decodes() -> None:
    cmd = frame.decode(json_frame(JAVA_JSON_ROUTE_HEADER)[4:])
    assert (cmd.code, cmd.language, cmd.version, cmd.opaque, cmd.flag) == (105, "JAVA", 479, 1, 0)
    assert cmd.ext_fields == {"topic": "TopicTest"} and cmd.serialize_type == codes.SERIALIZE_JSON


def test_cpp_client_header_with_newline_acl_fields_and_numeric_values() -> None:
    # What the bundled C++ client really sends (jsoncpp FastWriter: trailing newline, typed values).
    head = (b'{"code":10,"extFields":{"AccessKey":"","OnsChannel":"ALIYUN","Signature":"x=","queueId":0,'
            b'"sysFlag":0,"defaultTopicQueueNums":4,"batch":"0","unitMode":false,"nothing":null},'
            b'"flag":0,"language":"CPP","opaque":0,"remark":"","version":63}\n')
    cmd = frame.decode(json_frame(head, b"hello")[4:])
    assert (cmd.code, cmd.language, cmd.version, cmd.remark, cmd.body) == (10, "CPP", 63, "", b"hello")
    assert cmd.ext_fields == {"AccessKey": "", "OnsChannel": "ALIYUN", "Signature": "x=", "queueId": "0",
                              "sysFlag": "0", "defaultTopicQueueNums": "4", "batch": "0", "unitMode": "false"}


def test_response_header_is_json_sorted_with_the_response_bit() -> None:
    req = frame.decode(json_frame(JAVA_JSON_ROUTE_HEADER)[4:])
    data = frame.encode(req.response(codes.TOPIC_NOT_EXIST, "no route", {"b": "2", "a": "1"}, b"BODY"))
    total, word = struct.unpack(">ii", data[:8])
    assert total == len(data) - 4 and word >> 24 == 0
    head = data[8:8 + word]
    assert head == (b'{"code":17,"extFields":{"a":"1","b":"2"},"flag":1,"language":"JAVA","opaque":1,'
                    b'"remark":"no route","serializeTypeCurrentRPC":"JSON","version":479}')
    assert data[8 + word:] == b"BODY"


def test_response_without_remark_or_ext_fields_omits_them() -> None:
    data = frame.encode(Command(code=105, opaque=9).response())
    assert json.loads(data[8:]) == {"code": 0, "flag": 1, "language": "JAVA", "opaque": 9,
                                    "serializeTypeCurrentRPC": "JSON", "version": 479}


@pytest.mark.parametrize("cmd", [
    Command(code=0, flag=1, opaque=0, version=479),
    Command(code=17, flag=1, opaque=2_147_483_647, version=479),
    Command(code=0, flag=3, opaque=-5, version=0, language="CPP"),
    Command(code=0, flag=1, opaque=7, version=479, language='ja"va\\ é'),
])
def test_the_plain_reply_header_is_what_the_general_encoder_writes(cmd: Command) -> None:
    """A reply without remark or extFields skips building a dict; its bytes must not change."""
    general = json.dumps({"code": cmd.code, "flag": cmd.flag, "language": cmd.language, "opaque": cmd.opaque,
                          "serializeTypeCurrentRPC": "JSON", "version": cmd.version},
                         sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    assert header.encode_json(cmd) == general


@pytest.mark.parametrize("payload, message", [
    (b"\x00\x00", "shorter than its header-length word"),
    (struct.pack(">i", 50) + b"{}", "exceeds the frame"),
    (struct.pack(">i", (7 << 24) | 2) + b"{}", "serialization type 7"),
    (struct.pack(">i", 5) + b"{code", "not JSON"),
    (struct.pack(">i", 2) + b"[]", "not a JSON object"),
    (struct.pack(">i", 12) + b'{"flag":0}\n\n', "'code' is missing"),
    (struct.pack(">i", 15) + b'{"code":"abc"}\n', "not an integer"),
    (struct.pack(">i", 24) + b'{"code":1,"extFields":3}', "not an object"),
    (struct.pack(">i", 4) + b"\xff\xfe\xfd\xfc", "not JSON"),
    (struct.pack(">i", (1 << 24) | 5) + b"\x00\x69\x00\x01\xdf", "truncated"),
    (struct.pack(">i", (1 << 24) | 21) + BINARY_FIXED + struct.pack(">ii", 0, 0x7FFFFFFF), "truncated"),
    (struct.pack(">i", (1 << 24) | 27) + BINARY_FIXED + struct.pack(">ii", 0, 6) + b"\x00\x09ab\x00\x00",
     "key length 9 exceeds its limit of 6"),
    (struct.pack(">i", (1 << 24) | 21) + BINARY_FIXED + struct.pack(">ii", -1, 0), "truncated reading remark"),
    (struct.pack(">i", (1 << 24) | 26) + BINARY_FIXED + struct.pack(">iih", 0, 2, 3) + b"abc",
     "key length 3 exceeds its limit of 2"),
])
def test_malformed_frames_raise_frame_error(payload: bytes, message: str) -> None:
    with pytest.raises(FrameError, match=message):
        frame.decode(payload)


def test_fastjson_and_standard_dumps() -> None:
    route = {"brokerDatas": [{"brokerAddrs": {1: "b:1", 0: "a:1"}, "brokerName": "broker-ü"}], "filterServerTable": {}}
    assert jsonfmt.dumps(route, fastjson=True) == (
        '{"brokerDatas":[{"brokerAddrs":{0:"a:1",1:"b:1"},"brokerName":"broker-ü"}],"filterServerTable":{}}'
    ).encode()
    assert jsonfmt.dumps(route) == (  # non-ASCII raw in both forms, as RocketMQ 5's fastjson2 writes it
        '{"brokerDatas":[{"brokerAddrs":{"0":"a:1","1":"b:1"},"brokerName":"broker-ü"}],"filterServerTable":{}}'
    ).encode()


def test_loads_reads_fastjson_bare_keys_but_not_inside_strings() -> None:
    text = '{"brokerAddrs":{0:"a:1", 12 : "x,{3:4}"},"list":[1, 2],"s":"{5:6}"}'
    assert jsonfmt.loads(text) == {"brokerAddrs": {"0": "a:1", "12": "x,{3:4}"}, "list": [1, 2], "s": "{5:6}"}
    with pytest.raises(ValueError):
        jsonfmt.loads('{"a":1,,}')


def test_body_shapes_match_the_documented_examples() -> None:
    from nameserver.pb import api_pb2, state_pb2

    route = api_pb2.TopicRoute(
        broker_datas=[state_pb2.BrokerData(cluster="DefaultCluster", broker_name="broker-a",
                                           addrs=[state_pb2.BrokerAddr(broker_id=0, addr="a:10911")])],
        queue_datas=[state_pb2.QueueData(broker_name="broker-a", perm=6, read_queue_nums=4, write_queue_nums=4)])
    assert bodies.encode(bodies.topic_route(route)) == (
        b'{"brokerDatas":[{"brokerAddrs":{"0":"a:10911"},"brokerName":"broker-a","cluster":"DefaultCluster",'
        b'"enableActingMaster":false}],"filterServerTable":{},"queueDatas":[{"brokerName":"broker-a","perm":6,'
        b'"readQueueNums":4,"topicSysFlag":0,"writeQueueNums":4}]}')
    dv = state_pb2.DataVersion(counter=3, timestamp=1700000000000)
    assert bodies.encode(bodies.data_version(dv)) == b'{"counter":3,"stateVersion":0,"timestamp":1700000000000}'
    assert bodies.encode(bodies.kv_table({"k": "v"})) == b'{"table":{"k":"v"}}'
    assert bodies.encode(bodies.topic_list(["A", "B"])) == b'{"topicList":["A","B"]}'


# ---- RegisterBrokerBody -----------------------------------------------------------------------------

def test_plain_register_body_decodes() -> None:
    body = register_body(["T1", "T2"], counter=7, compressed=False, queues=8)
    decoded = registerbody.decode(body, compressed=False)
    assert (decoded.data_version.counter, decoded.data_version.timestamp) == (7, 1700000000000)
    assert [(t.topic_name, t.read_queue_nums, t.write_queue_nums, t.perm) for t in decoded.topics] == [
        ("T1", 8, 8, 6), ("T2", 8, 8, 6)]
    assert decoded.filter_servers == []


def test_compressed_register_body_decodes_with_attributes_containing_spaces() -> None:
    def chunk(data: bytes) -> bytes:
        return struct.pack(">i", len(data)) + data

    raw = (chunk(b'{"counter":2,"stateVersion":1,"timestamp":5}') + struct.pack(">i", 2)
           + chunk(b"T1 4 4 6 SINGLE_TAG") + chunk(b'T2 2 1 4 MULTI_TAG {"+k":"a b"}')
           + chunk(b'["10.0.0.1:30000"]'))  # a 4.x body: no static-topic mapping count
    decoded = registerbody.decode(zlib.compress(raw), compressed=True)
    assert (decoded.data_version.counter, decoded.data_version.state_version) == (2, 1)
    assert [(t.topic_name, t.read_queue_nums, t.write_queue_nums, t.perm) for t in decoded.topics] == [
        ("T1", 4, 4, 6), ("T2", 2, 1, 4)]
    assert decoded.filter_servers == ["10.0.0.1:30000"]


def test_a_zlib_body_marked_uncompressed_decodes_as_compressed() -> None:
    """RocketMQ 5.5.0 with compressedRegister=true sets compressed=false in the header."""
    body = register_body(["T1"], counter=3, compressed=True)
    decoded = registerbody.decode(body, compressed=False)
    assert [t.topic_name for t in decoded.topics] == ["T1"] and decoded.data_version.counter == 3


def test_old_broker_topic_config_wrapper_body_decodes() -> None:
    body = b'{"dataVersion":{"counter":1,"timestamp":2},"topicConfigTable":{"T":{"perm":6,"readQueueNums":1,' \
           b'"writeQueueNums":1,"topicSysFlag":1}}}'
    decoded = registerbody.decode(body, compressed=False)
    assert [(t.topic_name, t.topic_sys_flag) for t in decoded.topics] == [("T", 1)]


def test_empty_register_body_is_version_zero_without_topics() -> None:
    decoded = registerbody.decode(b"", compressed=True)
    assert decoded.data_version.counter == 0 and not decoded.topics


def test_crc32_is_java_utilall_crc32() -> None:
    assert registerbody.crc32(b"123456789") == 0xCBF43926 & 0x7FFFFFFF
    assert registerbody.crc32(b"") == 0


@pytest.mark.parametrize("body, compressed, message", [
    (b"not zlib", True, "does not inflate"),
    (zlib.compress(struct.pack(">i", 100) + b"{}"), True, "truncated"),
    (zlib.compress(struct.pack(">i", -1)), True, "negative"),
    (zlib.compress(struct.pack(">i", 2) + b"{}" + struct.pack(">i", 1) + struct.pack(">i", 3) + b"T 4"), True,
     "fewer than 5 fields"),
    (zlib.compress(struct.pack(">i", 2) + b"{}" + struct.pack(">i", 1) + struct.pack(">i", 12) + b"T x 4 6 SINGLE"),
     True, "must be integers"),
    (b"{garbage", False, "not JSON"),
    (b'{"topicConfigSerializeWrapper":{"topicConfigTable":{"T":{"perm":"rw"}}}}', False, "not an integer"),
    (b'{"filterServerList":[1]}', False, "not a list of strings"),
])
def test_bad_register_bodies_raise_body_error(body: bytes, compressed: bool, message: str) -> None:
    with pytest.raises(BodyError, match=message):
        registerbody.decode(body, compressed)


def test_zip_bomb_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registerbody, "MAX_INFLATED", 1000)
    with pytest.raises(BodyError, match="inflates past"):
        registerbody.decode(zlib.compress(b"\0" * 5000), compressed=True)


def test_header_module_round_trips_remark_and_unicode() -> None:
    cmd = Command(code=1, language="CPP", version=3, opaque=4, flag=2, remark="ré", ext_fields={"k": "vé"})
    back = header.decode_rocketmq(header.encode_rocketmq(cmd))
    assert (back.code, back.language, back.version, back.opaque, back.flag, back.remark, back.ext_fields) == (
        1, "CPP", 3, 4, 2, "ré", {"k": "vé"})


# ---- RIP-21 static topics: queue mappings in, topicQueueMappingByBroker out --------------------------

MAPPING_INFO = {"bname": "broker-a", "currIdMap": {"0": 0, "1": 1}, "dirty": False, "epoch": 1700000000123,
                "scope": "__global__", "topic": "ST", "totalQueues": 4}


def test_plain_register_body_attaches_static_topic_mappings_to_their_topics() -> None:
    body = json.dumps({"topicConfigSerializeWrapper": {
        "dataVersion": {"counter": 1, "timestamp": 2},
        "topicConfigTable": {"ST": {"perm": 6, "readQueueNums": 2, "writeQueueNums": 2},
                             "Plain": {"perm": 6, "readQueueNums": 1, "writeQueueNums": 1}},
        "topicQueueMappingInfoMap": {"ST": MAPPING_INFO, "Gone": MAPPING_INFO | {"topic": "Gone"}}}}).encode()
    decoded = registerbody.decode(body, compressed=False)
    ignored = decoded.attach_mappings("broker-a")
    assert ignored == ["queue mapping of 'Gone': the broker registered no such topic"]
    st, plain = decoded.topics
    assert st.HasField("mapping") and not plain.HasField("mapping")
    assert (st.mapping.total_queues, st.mapping.epoch, st.mapping.scope, dict(st.mapping.curr_id_map)) == (
        4, 1700000000123, "__global__", {0: 0, 1: 1})
    other = registerbody.decode(body, compressed=False)
    assert "queue mapping of 'ST': bname 'broker-a' is not the broker's name" in other.attach_mappings("broker-b")
    assert not other.topics[0].HasField("mapping")


def test_compressed_register_body_reads_static_topic_mappings() -> None:
    def chunk(data: bytes) -> bytes:
        return struct.pack(">i", len(data)) + data

    info = json.dumps(MAPPING_INFO | {"currIdMap": {"2": 0}}).encode()
    raw = (chunk(b'{"counter":2,"timestamp":5}') + struct.pack(">i", 1) + chunk(b"ST 1 1 6 SINGLE_TAG {}")
           + chunk(b"[]") + struct.pack(">i", 1) + chunk(info))
    decoded = registerbody.decode(zlib.compress(raw), compressed=True)
    assert decoded.attach_mappings("broker-a") == []
    assert dict(decoded.topics[0].mapping.curr_id_map) == {2: 0}


@pytest.mark.parametrize("info, message", [
    (MAPPING_INFO | {"currIdMap": {"x": 1}}, "currIdMap key"),
    (MAPPING_INFO | {"currIdMap": [1]}, "currIdMap is not a JSON object"),
    (MAPPING_INFO | {"totalQueues": "many"}, "totalQueues is not an integer"),
    ("nope", "is not a JSON object"),
])
def test_bad_static_topic_mappings_raise_body_error(info: object, message: str) -> None:
    body = json.dumps({"topicConfigSerializeWrapper": {"topicConfigTable": {},
                                                       "topicQueueMappingInfoMap": {"ST": info}}}).encode()
    with pytest.raises(BodyError, match=message):
        registerbody.decode(body, compressed=False)


def test_route_body_carries_topic_queue_mapping_by_broker_only_for_static_topics() -> None:
    from nameserver.pb import api_pb2, state_pb2

    mapping = state_pb2.QueueMapping(scope="__global__", total_queues=4, epoch=7, curr_id_map={1: 0, 0: 1})
    route = api_pb2.TopicRoute(queue_datas=[
        state_pb2.QueueData(broker_name="broker-a", perm=6, read_queue_nums=2, write_queue_nums=2, mapping=mapping),
        state_pb2.QueueData(broker_name="broker-b", perm=6, read_queue_nums=2, write_queue_nums=2)])
    doc = json.loads(bodies.encode(bodies.topic_route(route, "ST")))
    assert doc["topicQueueMappingByBroker"] == {"broker-a": {
        "bname": "broker-a", "currIdMap": {"0": 1, "1": 0}, "dirty": False, "epoch": 7, "scope": "__global__",
        "topic": "ST", "totalQueues": 4}}
    assert all("mapping" not in qd for qd in doc["queueDatas"])  # RocketMQ's QueueData has no such field
    assert b'"currIdMap":{0:1,1:0}' in bodies.encode(bodies.topic_route(route, "ST"), fastjson=True)
    del route.queue_datas[0]
    assert "topicQueueMappingByBroker" not in json.loads(bodies.encode(bodies.topic_route(route, "ST")))
