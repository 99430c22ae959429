"""A small fake RocketMQ broker for tests with real clients (no JVM here).

Client side, it answers what the C++ producer sends (found by experiment): SEND_MESSAGE (10) or
SEND_MESSAGE_V2 (310) with a SendMessageResponseHeader, HEARTBEAT (34) and UNREGISTER_CLIENT (35)
with SUCCESS; anything else gets REQUEST_CODE_NOT_SUPPORTED (3), and every request is recorded.
Nameserver side, it plays a broker (bench/brokerconn.py's BrokerConnections): REGISTER_BROKER (103, plain
or compressed body with CRC), BROKER_HEARTBEAT (904, oneway), QUERY_DATA_VERSION (322), UNREGISTER_BROKER
(104). What a nameserver pushes to its address (905 NOTIFY_MIN_BROKER_ID_CHANGE) is recorded like any request.
"""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from dataclasses import dataclass

from bench.brokerconn import BrokerConnections, crc32, data_version_json, read_frame, register_body
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


def _properties(text: str) -> dict[str, str]:
    # MessageDecoder: name \x01 value \x02 ...
    out = {}
    for item in text.split("\x02"):
        if "\x01" in item:
            k, v = item.split("\x01", 1)
            out[k] = v
    return out


class FakeBroker(BrokerConnections):
    def __init__(self, name: str = "broker-a", cluster: str = "DefaultCluster", host: str = "127.0.0.1",
                 port: int = 0) -> None:
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
        super().__init__(name, cluster, f"{host}:{self._server.server_address[1]}")
        self._thread = threading.Thread(target=self._server.serve_forever, name="fakebroker", daemon=True)

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


__all__ = ["FakeBroker", "SentMessage", "crc32", "data_version_json", "read_frame", "register_body"]
