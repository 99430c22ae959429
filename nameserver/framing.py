"""Length-prefixed frames on a node's private Unix sockets: the workers' write channel
(nameserver/api/writechannel.py) and their replicas' feed (nameserver/localfeed.py).

A frame is a 4-byte big-endian length and a list of records, each a list of length-prefixed fields (4-byte
big-endian lengths too). What the records mean is each channel's own; the sockets are the core's, 0600 in
a 0700 directory under the data dir, made fresh at each start (listen_private).
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import threading
from collections.abc import Sequence

import grpc

_LEN = struct.Struct(">I")
_ONE = struct.Struct(">IIII")  # a frame of one record of one field: the lengths before the field
_ONE_BODY = struct.Struct(">III")  # the same in its body (read_frame's): records, fields, the field's length
FRAME_SLACK = 64 << 10  # a frame's bound past its largest payload: the frame's, records' and fields' headers
_STATUS_CODES = {c.value[0]: c for c in grpc.StatusCode}


def status_code(number: int) -> grpc.StatusCode:
    """A gRPC status sent as its number on a channel (UNKNOWN for one this grpcio does not know)."""
    return _STATUS_CODES.get(number, grpc.StatusCode.UNKNOWN)


def pack(records: Sequence[Sequence[bytes]]) -> bytes:
    """One frame of `records`, its length first."""
    out = [_LEN.pack(len(records))]
    for fields in records:
        out.append(_LEN.pack(len(fields)))
        for f in fields:
            out += (_LEN.pack(len(f)), f)
    body = b"".join(out)
    return _LEN.pack(len(body)) + body


def pack_one(field: bytes) -> bytes:
    """pack([[field]]), a frame of one record of one field, with one header made at once (a worker's feed
    sends one per message)."""
    return _ONE.pack(len(field) + 12, 1, 1, len(field)) + field


def one_field(body: bytes) -> bytes | None:
    """The field of a frame's body of one record of one field (pack_one's), else None (unpack reads it)."""
    if len(body) >= 12 and _ONE_BODY.unpack_from(body) == (1, 1, len(body) - 12):
        return body[12:]
    return None


def unpack(body: bytes) -> list[list[bytes]]:
    """The records of a frame's body (what read_frame returns); ValueError when it is not one."""
    # every call on the channels passes here, a few times per call: plain slices of `body` and one
    # bounds check per length read (struct.error past the end) keep it cheap
    size, read = len(body), _LEN.unpack_from
    try:
        (count,), at = read(body, 0), 4
        records = []
        for _ in range(count):
            (nfields,), at = read(body, at), at + 4
            fields = []
            for _ in range(nfields):
                (n,), at = read(body, at), at + 4
                end = at + n
                if end > size:
                    raise ValueError("a field runs past its frame")
                fields.append(body[at:end])
                at = end
            records.append(fields)
    except struct.error:
        raise ValueError("a frame ends inside a field") from None
    if at != size:
        raise ValueError(f"{size - at} bytes past a frame's last record")
    return records


def read_frame(sock: socket.socket, max_bytes: int) -> bytes | None:
    """The next frame's body; None at the end of the socket between frames. ValueError for a frame longer
    than `max_bytes`, EOFError for a socket that ends inside one."""
    head = _read_exactly(sock, 4)
    if head is None:
        return None
    (n,) = _LEN.unpack(head)
    if n > max_bytes:
        raise ValueError(f"a {n}-byte frame is past its {max_bytes}-byte bound")
    body = _read_exactly(sock, n)
    if body is None:
        raise EOFError("closed inside a frame")
    return body


RECV_BYTES = 64 << 10  # what a FrameReader asks the socket for at once (more for a longer frame)


class FrameReader:
    """read_frame's frames off one socket, read as much at once as the socket has (up to RECV_BYTES, or the rest
    of a longer frame): the frames that came together cost one recv, where read_frame takes two a frame (its
    length, then its body), each a release and a take of the GIL. `buffered()`: whether bytes of a next frame
    are here already (a poll of the socket cannot see them)."""

    __slots__ = ("sock", "max_bytes", "_buf", "_at")

    def __init__(self, sock: socket.socket, max_bytes: int) -> None:
        self.sock = sock
        self.max_bytes = max_bytes
        self._buf = b""
        self._at = 0  # where the next frame starts in _buf

    def buffered(self) -> bool:
        return self._at < len(self._buf)

    def read_frame(self) -> bytes | None:
        """The next frame's body; None at the end of the socket between frames. ValueError for a frame longer
        than max_bytes, EOFError for a socket that ends inside one (read_frame's)."""
        while True:
            buf, at = self._buf, self._at
            have = len(buf) - at
            need = 4
            if have >= 4:
                (n,) = _LEN.unpack_from(buf, at)
                if n > self.max_bytes:
                    raise ValueError(f"a {n}-byte frame is past its {self.max_bytes}-byte bound")
                need = 4 + n
                if have >= need:
                    self._at = at + need
                    return buf[at + 4:at + need]
                if need - have > RECV_BYTES:  # a long frame: its rest read into one buffer (no copy per recv)
                    rest = _read_exactly(self.sock, need - have)
                    if rest is None:
                        raise EOFError("closed inside a frame")
                    self._buf, self._at = b"", 0
                    return buf[at + 4:] + rest
            chunk = self.sock.recv(RECV_BYTES)
            if not chunk:
                if have:
                    raise EOFError("closed inside a frame")
                return None
            self._buf, self._at = (buf[at:] + chunk if have else chunk), 0


def _read_exactly(sock: socket.socket, n: int) -> bytes | None:
    first = sock.recv(min(n, 1 << 20))
    if len(first) == n:  # the common case: the frame's part was there whole (no buffer to build, no copy)
        return first
    if not first:
        return None
    buf = bytearray(first)
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            if buf:
                raise EOFError("closed inside a frame")
            return None
        buf += chunk
    return bytes(buf)


def listen_private(path: str, backlog: int = 64) -> socket.socket:
    """A listening Unix socket at `path` only this user may open, made fresh (a stale one from a killed
    node is removed), in a directory only this user may enter."""
    folder = os.path.dirname(path)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    os.chmod(folder, 0o700)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    os.chmod(path, 0o600)
    sock.listen(backlog)
    return sock


class LinkServer:
    """A private socket's listener with a thread per accepted link running serve(link); stop() closes the
    socket and every link (a link's thread then ends on its socket's error)."""

    def __init__(self, path: str, name: str) -> None:
        """`name`: the threads' (`name`-accept, and `name`-link for each link)."""
        self.path = path
        self.name = name
        self._sock: socket.socket | None = None
        self._links: set[socket.socket] = set()
        self._links_lock = threading.Lock()

    @property
    def listening(self) -> bool:
        return self._sock is not None

    def start(self) -> None:
        self._sock = listen_private(self.path)
        threading.Thread(target=self._accept, name=f"{self.name}-accept", daemon=True).start()

    def stop(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()
        with self._links_lock:
            links, self._links = list(self._links), set()
        for link in links:
            close(link)

    def holds(self, link: socket.socket) -> bool:
        """`link` is open and not stopped."""
        return self._sock is not None and link in self._links

    def serve(self, link: socket.socket) -> None:
        raise NotImplementedError

    def _accept(self) -> None:
        while (sock := self._sock) is not None:
            try:
                link, _ = sock.accept()
            except OSError:
                return
            with self._links_lock:
                self._links.add(link)
            threading.Thread(target=self._serve, args=(link,), name=f"{self.name}-link", daemon=True).start()

    def _serve(self, link: socket.socket) -> None:
        try:
            self.serve(link)
        finally:
            close(link)
            with self._links_lock:
                self._links.discard(link)


def close(sock: socket.socket) -> None:
    """Shut `sock` both ways (a thread blocked reading it wakes) and close it."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


__all__ = ["FRAME_SLACK", "FrameReader", "LinkServer", "close", "listen_private", "one_field", "pack", "pack_one",
           "read_frame", "status_code", "unpack"]
