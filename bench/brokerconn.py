"""A broker's side of its connections to nameservers, over the RocketMQ remoting protocol: REGISTER_BROKER
(103, plain or compressed body with CRC) and BROKER_HEARTBEAT (904), one connection per nameserver kept
open as a real broker keeps its channel (RocketMQ and we unregister a broker when its channel closes).

The benchmarks seed the routes their reads ask for with it (bench/cores.py); tests/fakebroker.py's
FakeBroker, which also answers clients, builds on it.
"""

from __future__ import annotations

import itertools
import json
import socket
import struct
import threading
import zlib

from nameserver.remoting import frame
from nameserver.remoting.command import Command


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


class BrokerConnections:
    """A broker named `name` in `cluster` at `addr` (its own address, as it tells the nameservers)."""

    def __init__(self, name: str, cluster: str, addr: str) -> None:
        self.name = name
        self.cluster = cluster
        self.addr = addr
        self._opaque = itertools.count(1)
        # One connection per nameserver, kept open as a real broker keeps its channel (RocketMQ and we
        # unregister a broker when its channel closes).
        self._channels: dict[str, socket.socket] = {}
        self._channel_lock = threading.Lock()

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


__all__ = ["BrokerConnections", "crc32", "data_version_json", "read_frame", "register_body"]
