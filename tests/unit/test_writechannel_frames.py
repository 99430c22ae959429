"""The write channel's sender (nameserver/api/writechannel.py): what is queued while a frame is being
written leaves as ONE next frame, so writes arriving together cost the core one read and one wake-up,
not one each. Deterministic: the socket's first write is held open while more calls are queued."""

from __future__ import annotations

import threading
import time

from nameserver import framing
from nameserver.api import writechannel


class HeldSocket:
    """sendall() of the first frame waits for `release`; every frame is kept."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.writing_first = threading.Event()
        self.frames: list[bytes] = []

    def sendall(self, data: bytes) -> None:
        if not self.frames and not self.writing_first.is_set():
            self.writing_first.set()
            assert self.release.wait(10)
        self.frames.append(data)


def _records(frame: bytes) -> list[list[bytes]]:
    return framing.unpack(frame[4:])


def test_calls_queued_while_a_frame_is_written_leave_in_one_frame() -> None:
    sock = HeldSocket()
    errors: list[BaseException] = []
    sender = writechannel._Sender(sock, "test-sender", errors.append)  # type: ignore[arg-type]
    try:
        sender.put([b"1", b"first"])
        assert sock.writing_first.wait(10)  # the sender is inside the first frame's write
        for i in range(2, 6):
            sender.put([str(i).encode(), b"queued"])
        sock.release.set()
        deadline = time.monotonic() + 10
        while len(sock.frames) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [[r[0] for r in _records(f)] for f in sock.frames] == [[b"1"], [b"2", b"3", b"4", b"5"]]
        assert errors == []
    finally:
        sock.release.set()
        sender.close()


def test_frames_waiting_on_a_link_past_descriptor_1023_are_all_read() -> None:
    """The core reads every frame already waiting on a worker's link: with a descriptor past 1,023 (a core
    holding many connections), select.select refused it and the link was dropped as ended."""
    import os
    import resource
    import socket
    import struct

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(4096, hard), hard))
    ours, theirs = socket.socketpair()
    high = socket.socket(fileno=os.dup2(ours.fileno(), 1100))
    ours.close()
    server = writechannel.WriteChannelServer("/nonexistent/write.sock", None, 1, 1024)  # type: ignore[arg-type]
    try:
        for body in (b"one", b"two", b"three"):
            theirs.sendall(struct.pack(">I", len(body)) + body)
        assert server._waiting_frames(high, writechannel.readable(high)) == [b"one", b"two", b"three"]
    finally:
        server.pool.shutdown()
        high.close()
        theirs.close()
