"""Write the atheris seed corpora (tests/fuzz/corpus/<target>/) from valid encodings.

    .venv/bin/python tests/fuzz/make_corpus.py

Deterministic: the same files every run, named by their content's hash. Each directory is rewritten
whole, so seeds that are no longer generated disappear. Keep it small: a few dozen files per target.
"""

from __future__ import annotations

import hashlib
import json
import struct
import sys
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from nameserver.remoting import codes, frame  # noqa: E402
from nameserver.remoting.command import Command  # noqa: E402
from tests.fuzz import remotingstrategies as rs  # noqa: E402
from tests.fuzz import seeds  # noqa: E402

CORPUS = Path(__file__).resolve().parent / "corpus"
EXT = {"topic": "TopicA", "namespace": "ns", "key": "k", "value": "v", "clusterName": "c1",
       "brokerName": "broker-a", "brokerAddr": "10.0.0.1:10911", "brokerId": "0", "cluster": "c1",
       "haServerAddr": "10.0.0.1:10912", "heartbeatTimeoutMillis": "30000"}


def register_body(compressed: bool) -> bytes:
    dv = {"counter": 3, "stateVersion": 0, "timestamp": 1700000000000}
    topics = ["TopicA", "%RETRY%g1"]
    if not compressed:
        table = {t: {"perm": 6, "readQueueNums": 4, "topicName": t, "topicSysFlag": 0, "writeQueueNums": 4}
                 for t in topics}
        return json.dumps({"filterServerList": [], "topicConfigSerializeWrapper": {
            "dataVersion": dv, "topicConfigTable": table}}).encode()
    return zlib.compress(inflated_register_body(dv, topics))


def inflated_register_body(dv: dict, topics: list[str]) -> bytes:
    def chunk(data: bytes) -> bytes:
        return struct.pack(">i", len(data)) + data

    lines = [chunk(f"{t} 4 4 6 SINGLE_TAG {{}}".encode()) for t in topics]
    return (chunk(json.dumps(dv).encode()) + struct.pack(">i", len(topics)) + b"".join(lines)
            + chunk(b"[]") + struct.pack(">i", 0))


def frame_seeds() -> list[bytes]:
    out = []
    bodies = {103: register_body(True), 217: json.dumps({"queueDatas": [
        {"brokerName": "broker-a", "perm": 6, "readQueueNums": 4, "writeQueueNums": 4}]}).encode(),
        322: b'{"counter":3,"stateVersion":0,"timestamp":1700000000000}'}
    for code in rs.SUPPORTED:
        ext = dict(EXT, compressed="true") if code == 103 else EXT
        cmd = Command(code=code, language="JAVA", version=479, opaque=code, ext_fields=ext, body=bodies.get(code, b""))
        out.append(frame.encode(cmd)[4:])
        if code in (103, 105, 322):  # the binary header form too
            out.append(frame.encode(cmd, codes.SERIALIZE_ROCKETMQ)[4:])
    for nasty in [*rs.NASTY_JSON[:4], "[" * 900 + "]" * 900]:
        head = ('{"code":105,"opaque":1,"extFields":{"topic":' + nasty + "}}").encode()
        out.append(struct.pack(">i", len(head)) + head)
    return out


def body_seeds() -> list[bytes]:
    dv = {"counter": 1, "stateVersion": 2, "timestamp": 3}
    variants = []
    for n in (0, 1, 3):
        topics = [f"Topic{i}" for i in range(n)]
        variants += [b"\x02" + inflated_register_body(dv, topics), b"\x03" + inflated_register_body(dv, topics)]
        table = {t: {"perm": 6, "readQueueNums": n, "writeQueueNums": n, "topicSysFlag": n % 3} for t in topics}
        wrapper = {"dataVersion": dv, "topicConfigTable": table}
        variants += [b"\x00" + json.dumps({"topicConfigSerializeWrapper": wrapper,
                                            "filterServerList": ["10.0.0.9:1"] * n}).encode()]
    attrs = struct.pack(">i", 1) + struct.pack(">i", 30) + b'TopicX 4 4 6 SINGLE_TAG {"+a":"b c"}'
    variants.append(b"\x03" + struct.pack(">i", 2) + b"{}" + attrs + struct.pack(">i", 2) + b"[]")
    return variants + [b"\x00" + register_body(False), b"\x01" + register_body(True),
            b"\x03" + inflated_register_body(dv, ["TopicA", "TopicB"]),
            b"\x03" + inflated_register_body(dv, []) + struct.pack(">i", 1) + b"\x00\x00\x00\x02{}",
            b"\x00" + json.dumps({"dataVersion": dv, "topicConfigTable": {"T": {"perm": 6}}}).encode(),
            b"\x00" + json.dumps({"queueDatas": [{"brokerName": "b", "perm": 6}]}).encode(),
            b"\x00" + json.dumps(dv).encode(), b"\x00{0:1}",
            # near the edges: a Java int's maximum, nesting a few levels short of the parser's limit
            b"\x00" + json.dumps({"topicConfigTable": {"T": {"readQueueNums": 2147483647}}}).encode(),
            b"\x00" + json.dumps({"counter": 9223372036854775807}).encode(),
            b"\x00" + b"[" * 900 + b"]" * 900]


def grpc_seeds() -> list[bytes]:
    out = []
    for name, requests in seeds.seed_requests().items():
        index = bytes([seeds.METHOD_NAMES.index(name)])
        for req in requests:
            if isinstance(req, list):
                out.append(index + seeds.STREAM_SEPARATOR.join(c.SerializeToString() for c in req))
            else:
                out.append(index + req.SerializeToString())
    return out


def write(target: str, items: list[bytes]) -> None:
    directory = CORPUS / target
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.iterdir():
        old.unlink()
    for data in items:
        (directory / f"seed-{hashlib.sha1(data).hexdigest()[:16]}").write_bytes(data)
    print(f"{target}: {len(items)} seeds, {sum(len(d) for d in items)} bytes")


def main() -> None:
    write("remoting_frame", frame_seeds())
    write("register_body", body_seeds())
    write("grpc_requests", grpc_seeds())


if __name__ == "__main__":
    main()
