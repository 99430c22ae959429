"""RocketMQ remoting inputs: commands, bodies and frames, valid and mutated (shared by the property
tests, the live test and tests/fuzz/make_corpus.py)."""

from __future__ import annotations

import functools
import json
import struct
import zlib
from typing import Any

from hypothesis import strategies as st

from nameserver.remoting import codes, frame
from nameserver.remoting.command import Command
from nameserver.remoting.handlers import REQUESTS
from nameserver.remoting.registerbody import crc32
from tests.fuzz.protostrategies import ADDRS, NAMES, TOPICS, text_values

SUPPORTED = sorted(REQUESTS)  # the listener's handler table: the codes it serves
EXT_HINTS: dict[str, list[str]] = {
    "topic": TOPICS, "namespace": ["ns", "ORDER_TOPIC_CONFIG"], "key": ["k", "TopicA"], "value": ["v", ""],
    "brokerName": NAMES, "clusterName": NAMES, "cluster": NAMES, "brokerAddr": ADDRS, "haServerAddr": ADDRS,
    "brokerId": ["0", "1", "-1", "9223372036854775808", "x"], "bodyCrc32": ["0", "1", "-5"],
    "compressed": ["true", "false"], "heartbeatTimeoutMillis": ["0", "1000", "-1", "1e3"],
    "enableActingMaster": ["true", "false"], "__ZONE_NAME": ["z1"], "__ZONE_MODE": ["true"],
    "acceptStandardJsonOnly": ["true"],
}
INT32 = st.integers(-(1 << 31), (1 << 31) - 1)
INT16 = st.integers(-(1 << 15), (1 << 15) - 1)
TEXT = text_values(20, (300, 4097, 70000))  # huge, but not the MiB the gRPC fuzzing sends
JSON_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(1 << 70), 1 << 70), st.floats(), TEXT)


# Raw JSON values that have broken JSON readers: lone surrogate escapes (Python decodes them to strings
# no UTF-8 encoder accepts), nesting deeper than the parser's recursion limit, numbers beyond any type.
DEEP = 3000
NASTY_JSON = ['"\\ud800"', '"a\\udfffb"', '"\\ud83d\\ude00"', "1e999", "-0", "1" * 30, "NaN", "-Infinity",
              "[" * DEEP + "]" * DEEP, '{"a":' * DEEP + "1" + "}" * DEEP, "[" * 900 + "]" * 900, '"\\u0000"']


@functools.cache  # strategies are immutable and slow to build
def json_values(max_leaves: int = 12) -> st.SearchStrategy[Any]:
    return st.recursive(JSON_SCALARS, lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)), max_leaves=max_leaves)


@functools.cache
def ext_fields() -> st.SearchStrategy[dict[str, str]]:
    value_of = {k: st.one_of(st.sampled_from(v), TEXT) for k, v in EXT_HINTS.items()}
    known = st.fixed_dictionaries({}, optional=value_of)
    return st.builds(lambda a, b: a | b, known, st.dictionaries(st.text(max_size=12), TEXT, max_size=2))


def _chunk(data: bytes) -> bytes:
    return struct.pack(">i", len(data)) + data


@functools.cache
def data_versions() -> st.SearchStrategy[Any]:
    dv = st.fixed_dictionaries({}, optional={"counter": st.one_of(st.integers(0, 5), JSON_SCALARS),
                                             "timestamp": st.integers(0, 1 << 64), "stateVersion": st.integers(-1, 3)})
    return st.one_of(dv, json_values(4))


@functools.cache
def topic_configs() -> st.SearchStrategy[dict[str, Any]]:
    nums = st.one_of(st.integers(0, 16), st.integers(-(1 << 40), 1 << 40), st.sampled_from(["4", "x", None]))
    return st.dictionaries(st.one_of(st.sampled_from(TOPICS), TEXT), st.one_of(
        st.fixed_dictionaries({"topicName": st.sampled_from(TOPICS)}, optional={
            "readQueueNums": nums, "writeQueueNums": nums, "perm": nums, "topicSysFlag": nums}),
        json_values(3)), max_size=4)


@functools.cache
def register_bodies() -> st.SearchStrategy[tuple[bytes, bool]]:
    """(body, compressed): plain RegisterBrokerBody JSON, the pre-3.0.11 wrapper, or the zlib form."""
    plain = st.builds(lambda dv, table, fs: json.dumps({"topicConfigSerializeWrapper": {
        "dataVersion": dv, "topicConfigTable": table}, "filterServerList": fs}).encode(),
        data_versions(), topic_configs(), st.one_of(st.lists(st.sampled_from(ADDRS), max_size=2), json_values(2)))
    old = st.builds(lambda dv, table: json.dumps({"dataVersion": dv, "topicConfigTable": table}).encode(),
                    data_versions(), topic_configs())
    line = st.one_of(
        st.builds(lambda t, r, w, p, rest: f"{t} {r} {w} {p} {rest}".encode(), st.sampled_from(TOPICS),
                  st.integers(-2, 70000), st.integers(0, 8), st.integers(0, 7),
                  st.sampled_from(["SINGLE_TAG {}", "MULTI_TAG", "SINGLE_TAG {\"+k\":\"v w\"}", ""])),
        st.binary(max_size=20))
    count_bias = st.one_of(st.just(0), st.integers(-3, 3), st.just(1 << 30))
    compressed = st.builds(
        lambda dv, lines, bias, fs, tail, level: zlib.compress(
            _chunk(json.dumps(dv).encode()) + struct.pack(">i", len(lines) + bias)
            + b"".join(_chunk(x) for x in lines) + _chunk(json.dumps(fs).encode()) + tail, level),
        data_versions(), st.lists(line, max_size=4), count_bias, st.lists(st.sampled_from(ADDRS), max_size=2),
        st.sampled_from([b"", struct.pack(">i", 0), struct.pack(">i", 1) + _chunk(b"{}"), b"\x00\x00"]),
        st.integers(0, 9))
    return st.one_of(plain.map(lambda b: (b, False)), old.map(lambda b: (b, False)),
                     compressed.map(lambda b: (b, True)), st.tuples(st.binary(max_size=200), st.booleans()))


@functools.cache
def request_bodies() -> st.SearchStrategy[bytes]:
    route = st.builds(lambda qds: json.dumps({"queueDatas": qds}).encode(), st.one_of(
        st.lists(st.fixed_dictionaries({"brokerName": st.sampled_from(NAMES)}, optional={
            "readQueueNums": st.integers(-1, 9), "writeQueueNums": st.integers(0, 9), "perm": st.integers(0, 8)}),
            max_size=3), json_values(3)))
    templates = ['{"topicConfigTable":{"T":{"topicName":%s,"perm":6}}}', '{"queueDatas":[{"brokerName":%s}]}',
                 '{"counter":%s}', '{"topicConfigSerializeWrapper":{"dataVersion":%s}}', "%s",
                 '{"filterServerList":[%s]}']
    nasty = st.builds(lambda t, v: (t % v).encode(), st.sampled_from(templates), st.sampled_from(NASTY_JSON))
    return st.one_of(st.just(b""), register_bodies().map(lambda bc: bc[0]), route, nasty,
                     data_versions().map(lambda d: json.dumps(d).encode()), st.binary(max_size=100),
                     st.just(b"{0:" * 50))


@st.composite
def commands(draw: st.DrawFn, any_code: bool = True) -> Command:
    """A request command: mostly supported codes with plausible extFields and bodies."""
    code = draw(st.one_of(st.sampled_from(SUPPORTED), INT16) if any_code else st.sampled_from(SUPPORTED))
    ext = draw(ext_fields())
    body, compressed = draw(st.one_of(register_bodies(), request_bodies().map(lambda b: (b, False))))
    if code == codes.REGISTER_BROKER:
        ext.setdefault("compressed", "true" if compressed else "false")
        if draw(st.booleans()):
            ext["bodyCrc32"] = str(crc32(body))
    flag = draw(st.sampled_from([0, 0, 0, codes.FLAG_ONEWAY, codes.FLAG_RESPONSE, 3]))
    return Command(code=code, language=draw(st.sampled_from(["JAVA", "CPP", "GO", "OTHER"])),
                   version=draw(st.one_of(st.sampled_from([0, 399, 401, 479]), INT16)), opaque=draw(INT32),
                   flag=flag, remark=draw(st.one_of(st.none(), TEXT)), ext_fields=ext, body=body)


@functools.cache
def raw_json_frames() -> st.SearchStrategy[bytes]:
    """Frames whose JSON header is written by hand, to carry the NASTY_JSON values in extFields."""
    def build(code: int, key: str, value: str, body: bytes) -> bytes:
        fixed = ('"clusterName":"c1","brokerName":"broker-a","brokerAddr":"10.0.0.1:10911","brokerId":"0",'
                 '"namespace":"ns","key":"k","topic":"TopicA"')
        # The nasty value comes last: with a duplicate key, the last one wins.
        head = ('{"code":' + str(code) + ',"opaque":7,"flag":0,"version":479,"extFields":{' + fixed
                + ',"' + key + '":' + value + "}}").encode()
        return struct.pack(">ii", 4 + len(head) + len(body), len(head)) + head + body

    return st.builds(build, st.sampled_from(SUPPORTED), st.sampled_from(sorted(EXT_HINTS) + ["x"]),
                     st.sampled_from(NASTY_JSON), request_bodies())


@functools.cache
def frames(any_code: bool = True) -> st.SearchStrategy[bytes]:
    """Whole encoded frames (length prefix included), JSON or ROCKETMQ headers."""
    def encode(cmd: Command, binary: bool) -> bytes:
        return frame.encode(cmd, codes.SERIALIZE_ROCKETMQ if binary else codes.SERIALIZE_JSON)

    return st.builds(encode, commands(any_code), st.booleans())


@st.composite
def mutated(draw: st.DrawFn, base: st.SearchStrategy[bytes] | None = None) -> bytes:
    """A valid frame, then a few byte-level mutations (flips, cuts, inserts, a forged length word)."""
    data = bytearray(draw(base if base is not None else frames()))
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["flip", "cut", "insert", "length", "header_length"]))
        if kind == "flip" and data:
            i = draw(st.integers(0, len(data) - 1))
            data[i] ^= draw(st.integers(1, 255))
        elif kind == "cut":
            del data[draw(st.integers(0, len(data))):]
        elif kind == "insert":
            i = draw(st.integers(0, len(data)))
            data[i:i] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "length" and len(data) >= 4:
            data[0:4] = struct.pack(">i", draw(st.one_of(INT32, st.integers(0, len(data) + 4))))
        elif kind == "header_length" and len(data) >= 8:
            data[4:8] = struct.pack(">I", draw(st.integers(0, (1 << 32) - 1)))
    return bytes(data)
