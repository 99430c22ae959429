"""A small fake RocketMQ broker for tests with real clients (no JVM here).

Client side, it answers what the C++ producer sends (found by experiment): SEND_MESSAGE (10) or
SEND_MESSAGE_V2 (310) with a SendMessageResponseHeader, HEARTBEAT (34) and UNREGISTER_CLIENT (35)
with SUCCESS; anything else gets REQUEST_CODE_NOT_SUPPORTED (3), and every request is recorded.
Nameserver side, it plays a broker: REGISTER_BROKER (103, plain or compressed body with CRC),
BROKER_HEARTBEAT (904, oneway), QUERY_DATA_VERSION (322), UNREGISTER_BROKER (104). What a nameserver
pushes to its address (905 NOTIFY_MIN_BROKER_ID_CHANGE) is recorded like any request.
"""

from __future__ import annotations

import itertools
import json
import socket
import socketserver
import struct
import threading
import time
import zlib
from dataclasses import dataclass

from nameserver.remoting import frame
from nameserver.remoting.command import Command

SEND_MESSAGE = 10
SEND_MESSAGE_V2 = 310
HEART_BEAT = 34
UNREGISTER_CLIENT = 35
# SEND_MESSAGE_V2 abbreviates SendMessageRequestHeader's field names.
_V2_NAMES = {"a": "producerGroup", "b": "topic", "c": "defaultTopic", "d": "defaultTopicQueueNums",
             "e": "queueId", "f": "sysFlag", "g": "bornTimestamp", "h": "flag", "i": "properties",
             "j": "reconsumeTimes", "k": "unitMode", "l": "maxReconsumeTimes", "m": "batch"}


@dataclass
class SentMessage:
    topic: str
    queue_id: int
    body: bytes
    properties: dict[str, str]
    default_topic: str
    offset: int


def read_frame(sock: socket.socket) -> bytes | None:
    """One frame's payload (after the length), or None at end of stream."""
    prefix = _recv_exactly(sock, 4)
    if prefix is None:
        return None
    (total,) = struct.unpack(">i", prefix)
    return _recv_exactly(sock, total)


def _recv_exactly(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _properties(text: str) -> dict[str, str]:
    # MessageDecoder: name \x01 value \x02 ...
    out = {}
    for item in text.split("\x02"):
        if "\x01" in item:
            k, v = item.split("\x01", 1)
            out[k] = v
    return out


class FakeBroker:
    def __init__(self, name: str = "broker-a", cluster: str = "DefaultCluster", host: str = "127.0.0.1",
                 port: int = 0) -> None:
        self.name = name
        self.cluster = cluster
        self.requests: list[Command] = []
        self.messages: list[SentMessage] = []
        self._lock = threading.Lock()
        self._offsets: dict[tuple[str, int], int] = {}
        broker = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                broker._serve(self.request)

        socketserver.ThreadingTCPServer.allow_reuse_address = True
        self._server = socketserver.ThreadingTCPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.addr = f"{host}:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="fakebroker", daemon=True)
        self._opaque = itertools.count(1)
        # One connection per nameserver, kept open as a real broker keeps its channel (RocketMQ and we
        # unregister a broker when its channel closes).
        self._channels: dict[str, socket.socket] = {}
        self._channel_lock = threading.Lock()

    def start(self) -> FakeBroker:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.close_channels()
        if self._thread.is_alive():  # shutdown() waits for serve_forever, which never ran otherwise
            self._server.shutdown()
        self._server.server_close()

    # ---- the client-facing side ------------------------------------------------------------------

    def codes(self) -> list[int]:
        with self._lock:
            return [r.code for r in self.requests]

    def wait_requests(self, code: int, n: int, timeout: float = 10.0) -> list[Command]:
        """The first `n` requests of `code` this broker's port received, once it has (else AssertionError)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                got = [r for r in self.requests if r.code == code]
            if len(got) >= n:
                return got
            time.sleep(0.05)
        raise AssertionError(f"fake broker got {len(got)} requests of code {code}, wanted {n}; codes {self.codes()}")

    def wait_messages(self, n: int, timeout: float = 10.0) -> list[SentMessage]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if len(self.messages) >= n:
                    return list(self.messages)
            time.sleep(0.05)
        raise AssertionError(f"fake broker got {len(self.messages)} messages, wanted {n}; codes {self.codes()}")

    def _serve(self, sock: socket.socket) -> None:
        while True:
            payload = read_frame(sock)
            if payload is None:
                return
            req = frame.decode(payload)
            with self._lock:
                self.requests.append(req)
            resp = self._answer(req)
            if not req.is_oneway:
                sock.sendall(frame.encode(resp))

    def _answer(self, req: Command) -> Command:
        if req.code in (SEND_MESSAGE, SEND_MESSAGE_V2):
            return self._send(req)
        if req.code in (HEART_BEAT, UNREGISTER_CLIENT):
            return req.response()
        return req.response(3, f" request type {req.code} not supported")

    def _send(self, req: Command) -> Command:
        ext = req.ext_fields
        if req.code == SEND_MESSAGE_V2:
            ext = {_V2_NAMES.get(k, k): v for k, v in ext.items()}
        topic, queue_id = ext["topic"], int(ext.get("queueId", "0"))
        with self._lock:
            offset = self._offsets.get((topic, queue_id), 0)
            self._offsets[(topic, queue_id)] = offset + 1
            self.messages.append(SentMessage(topic, queue_id, req.body, _properties(ext.get("properties", "")),
                                             ext.get("defaultTopic", ""), offset))
        host, port = self.addr.rsplit(":", 1)
        # A broker's message id: its IPv4 address, port and the message's commit log offset, in hex.
        msg_id = socket.inet_aton(host).hex().upper() + f"{int(port):08X}{offset:016X}"
        return req.response(ext_fields={"msgId": msg_id, "queueId": str(queue_id), "queueOffset": str(offset)})

    # ---- the nameserver-facing side (what a broker sends every nameserver) ---------------------------

    def close_channels(self) -> None:
        """Close every connection to a nameserver (as a broker process that exits)."""
        with self._channel_lock:
            for sock in self._channels.values():
                sock.close()
            self._channels.clear()

    def call(self, ns_addr: str, code: int, ext: dict[str, str], body: bytes = b"", oneway: bool = False,
             timeout: float = 30.0) -> Command | None:
        """One request to a nameserver over this broker's connection to it; the response (None when
        oneway). Calls are serialized per broker, one at a time, so replies need no matching."""
        req = Command(code=code, language="JAVA", version=479, opaque=next(self._opaque), flag=2 if oneway else 0,
                      ext_fields=ext, body=body)
        host, port = ns_addr.rsplit(":", 1)
        with self._channel_lock:
            sock = self._channels.get(ns_addr)
            if sock is None:
                sock = self._channels[ns_addr] = socket.create_connection((host, int(port)), timeout=timeout)
            sock.settimeout(timeout)
            try:
                sock.sendall(frame.encode(req))
                payload = None if oneway else read_frame(sock)
            except OSError:
                sock.close()
                del self._channels[ns_addr]
                raise
            if oneway:
                return None
            if payload is None:
                sock.close()
                del self._channels[ns_addr]
        assert payload is not None, f"{ns_addr} closed the connection instead of answering code {code}"
        resp = frame.decode(payload)
        assert resp.opaque == req.opaque and resp.is_response
        return resp

    def header(self, broker_id: int = 0) -> dict[str, str]:
        return {"brokerName": self.name, "brokerAddr": self.addr, "clusterName": self.cluster,
                "brokerId": str(broker_id)}

    def register(self, ns_addr: str, topics: list[str], counter: int = 1, compressed: bool = True,
                 queues: int = 4, timeout: float = 60.0, extra: dict[str, str] | None = None, broker_id: int = 0,
                 acting_master: bool | None = None) -> Command:
        """REGISTER_BROKER; `extra`: more header fields (heartbeatTimeoutMillis, __ZONE_NAME, ...);
        `acting_master`: the enableActingMaster field a 5.x broker sends (None: absent, as before 5)."""
        body = register_body(topics, counter, compressed, queues)
        ext = self.header(broker_id) | {"haServerAddr": self.addr.rsplit(":", 1)[0] + ":10912",
                                        "compressed": "true" if compressed else "false", "bodyCrc32": str(crc32(body))}
        if acting_master is not None:
            ext["enableActingMaster"] = "true" if acting_master else "false"
        ext |= extra or {}
        resp = self.call(ns_addr, 103, ext, body, timeout=timeout)
        assert resp is not None
        return resp

    def heartbeat(self, ns_addr: str) -> None:
        self.call(ns_addr, 904, {"brokerName": self.name, "brokerAddr": self.addr, "clusterName": self.cluster},
                  oneway=True)


def crc32(body: bytes) -> int:
    return zlib.crc32(body) & 0x7FFFFFFF


def data_version_json(counter: int, timestamp: int = 1700000000000) -> bytes:
    return json.dumps({"counter": counter, "stateVersion": 0, "timestamp": timestamp},
                      separators=(",", ":"), sort_keys=True).encode()


def register_body(topics: list[str], counter: int = 1, compressed: bool = True, queues: int = 4) -> bytes:
    """A RegisterBrokerBody as a RocketMQ 5 broker writes it (RegisterBrokerBody.encode)."""
    if not compressed:
        table = {t: {"attributes": {}, "order": False, "perm": 6, "readQueueNums": queues,
                     "topicFilterType": "SINGLE_TAG", "topicName": t, "topicSysFlag": 0, "writeQueueNums": queues}
                 for t in topics}
        return json.dumps({"filterServerList": [], "topicConfigSerializeWrapper": {
            "dataVersion": json.loads(data_version_json(counter)), "topicConfigTable": table}},
            separators=(",", ":")).encode()

    def chunk(data: bytes) -> bytes:
        return struct.pack(">i", len(data)) + data

    parts = [chunk(data_version_json(counter)), struct.pack(">i", len(topics))]
    parts += [chunk(f"{t} {queues} {queues} 6 SINGLE_TAG {{}}".encode()) for t in topics]
    parts += [chunk(b"[]"), struct.pack(">i", 0)]  # filter servers, then no static-topic mappings
    return zlib.compress(b"".join(parts), 9)
