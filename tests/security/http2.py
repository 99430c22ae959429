"""HTTP/2 spoken by hand, for attacks a gRPC client will not make: streams opened (HEADERS only) and
never finished, as many as the attacker likes on one connection, whatever the server's SETTINGS say.

Only what such an attacker needs: the preface, HEADERS with literal (never indexed, never Huffman)
HPACK fields, and a reader that acknowledges the server's SETTINGS and PINGs and notes which streams
the server ended (trailers with END_STREAM, or RST_STREAM) and whether it sent GOAWAY.

TLS is done in memory (ssl.SSLObject over the plain socket), one record operation at a time: the reader
and the writers take turns on it. An ssl.SSLSocket read by one thread while another writes it uses one
OpenSSL connection from two threads at once, which OpenSSL does not allow: under load, a record went out
corrupt and the server closed the connection ("tls: bad record MAC"), mid-flood.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import struct
import threading
from collections.abc import Sequence

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY = 0x0, 0x1, 0x3, 0x4, 0x6, 0x7
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + struct.pack(">BBI", kind, flags, stream) + payload


def _string(s: str | bytes) -> bytes:
    data = s.encode() if isinstance(s, str) else s  # bytes: sent as they are (a value no client would send)
    assert len(data) < 127, "one-byte HPACK lengths only"
    return bytes([len(data)]) + data


def header_block(fields: Sequence[tuple[str, str | bytes]]) -> bytes:
    """HPACK "literal header field without indexing, new name" for each field (RFC 7541 6.2.2)."""
    return b"".join(b"\x00" + _string(name) + _string(value) for name, value in fields)


class RawConnection:
    def __init__(self, addr: str, ca_file: str | None = None, timeout: float = 10.0) -> None:
        host, port = addr.rsplit(":", 1)
        sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.sock = sock
        self._tls: ssl.SSLObject | None = None
        self._incoming, self._outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        if ca_file is not None:
            ctx = ssl.create_default_context(cafile=ca_file)
            ctx.set_alpn_protocols(["h2"])
            self._tls = ctx.wrap_bio(self._incoming, self._outgoing, server_hostname=host)
            self._handshake()
        sock.settimeout(None)
        self.scheme = "https" if ca_file is not None else "http"
        self.authority = addr
        self._tls_lock = threading.Lock()  # a record written, or records read: one at a time
        self._send_lock = threading.Lock()  # the socket's writes, in the order their records were made
        self._next_id = 1
        self.ended: set[int] = set()   # streams the server finished (trailers) or reset
        self.reset: set[int] = set()   # of those, reset (RST_STREAM)
        self.answered: set[int] = set()  # of those, given a status (trailers; grpc-go then resets it too)
        self.goaway = False
        self.closed = threading.Event()
        self._send(PREFACE + frame(SETTINGS, 0, 0))
        self._reader = threading.Thread(target=self._read, daemon=True, name="raw-h2")
        self._reader.start()

    def _handshake(self) -> None:
        assert self._tls is not None
        while True:
            try:
                self._tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                self.sock.sendall(self._outgoing.read())
                data = self.sock.recv(1 << 16)
                if not data:
                    raise ConnectionError("the server closed the connection in the TLS handshake") from None
                self._incoming.write(data)
        self.sock.sendall(self._outgoing.read())

    def _send(self, data: bytes) -> None:
        if self._tls is None:
            with self._send_lock:
                self.sock.sendall(data)
            return
        with self._tls_lock:
            self._tls.write(data)
            data = self._outgoing.read()
            self._send_lock.acquire()  # before the next record is made (a reader's decrypting goes on)
        try:
            self.sock.sendall(data)
        finally:
            self._send_lock.release()

    def _received(self, data: bytes) -> tuple[bytes, bool]:
        """What the server's bytes say, decrypted (b"" when they end no record), and whether they end the
        connection (its TLS close_notify)."""
        if self._tls is None:
            return data, False
        out, ended = bytearray(), False
        with self._tls_lock:
            self._incoming.write(data)
            while True:
                try:
                    plain = self._tls.read(1 << 16)
                except ssl.SSLWantReadError:
                    break
                except ssl.SSLZeroReturnError:
                    plain = b""
                if not plain:  # the server's close_notify
                    ended = True
                    break
                out += plain
            reply = self._outgoing.read()  # what TLS itself answers (e.g. a key update's)
            if reply:
                self._send_lock.acquire()
        if reply:
            try:
                self.sock.sendall(reply)
            finally:
                self._send_lock.release()
        return bytes(out), ended

    def open_stream(self, path: str, metadata: tuple[tuple[str, str], ...] = ()) -> int:
        """A gRPC call's HEADERS, and nothing after them: no message, no END_STREAM."""
        (stream,) = self.open_streams(path, 1, metadata)
        return stream

    def open_streams(self, path: str, count: int, metadata: tuple[tuple[str, str], ...] = ()) -> list[int]:
        """`count` such calls, their HEADERS in one write (they arrive together, as a flood's do)."""
        streams = list(range(self._next_id, self._next_id + 2 * count, 2))
        self._next_id += 2 * count
        fields = [(":method", "POST"), (":scheme", self.scheme), (":path", path),
                  (":authority", self.authority), ("content-type", "application/grpc"), ("te", "trailers"),
                  *metadata]
        block = header_block(fields)
        self._send(b"".join(frame(HEADERS, END_HEADERS, stream, block) for stream in streams))
        return streams

    def _read(self) -> None:
        buf, pos = bytearray(), 0
        try:
            while True:
                data = self.sock.recv(1 << 16)
                if not data:
                    return
                plain, ended = self._received(data)
                buf += plain
                while len(buf) - pos >= 9:
                    length = int.from_bytes(buf[pos:pos + 3], "big")
                    if len(buf) - pos < 9 + length:
                        break
                    kind, flags = buf[pos + 3], buf[pos + 4]
                    stream = int.from_bytes(buf[pos + 5:pos + 9], "big") & 0x7FFFFFFF
                    self._on_frame(kind, flags, stream, bytes(buf[pos + 9:pos + 9 + length]))
                    pos += 9 + length
                del buf[:pos]
                pos = 0
                if ended:
                    return
        except OSError:  # ssl.SSLError among them
            return
        finally:
            self.closed.set()

    def _on_frame(self, kind: int, flags: int, stream: int, payload: bytes) -> None:
        if kind == SETTINGS and not flags & ACK:
            self._send(frame(SETTINGS, ACK, 0))
        elif kind == PING and not flags & ACK:
            self._send(frame(PING, ACK, 0, payload))
        elif kind == RST_STREAM:
            self.reset.add(stream)
            self.ended.add(stream)
        elif kind in (HEADERS, DATA) and flags & END_STREAM:
            self.ended.add(stream)
            self.answered.add(stream)
        elif kind == GOAWAY:
            self.goaway = True

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the reader (a close alone leaves its recv waiting)
        with contextlib.suppress(OSError):
            self.sock.close()
        self._reader.join(timeout=5)
