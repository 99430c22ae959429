"""The write channel's sender (nameserver/api/writechannel.py): a record put on an idle link is written by
the thread that puts it (no other thread woken per call and per answer); what is queued while a frame is
being written leaves as ONE next frame, so writes arriving together cost the core one read and one
wake-up, not one each. Deterministic: the socket's writes are held open while more calls are queued."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from nameserver import framing
from nameserver.api import writechannel


class HeldSocket:
    """send() (the putting thread's write, which must never wait) takes at most `takes` bytes; sendall()
    (the sender's own thread) of its first write waits for `release`. Every byte is kept, and who wrote."""

    def __init__(self, takes: int) -> None:
        self.takes = takes
        self.release = threading.Event()
        self.writing_first = threading.Event()
        self.data = bytearray()
        self.writers: list[str] = []

    def send(self, data: bytes, flags: int = 0) -> int:
        assert flags & socket.MSG_DONTWAIT, "a putting thread's write must not wait"
        self.writers.append(threading.current_thread().name)
        self.data += data[:self.takes]
        return min(len(data), self.takes)

    def sendall(self, data: bytes) -> None:
        if not self.writing_first.is_set():
            self.writing_first.set()
            assert self.release.wait(10)
        self.writers.append(threading.current_thread().name)
        self.data += data

    def frames(self) -> list[list[bytes]]:
        """The first field of each record, frame by frame, of what was written whole."""
        out, at = [], 0
        while at + 4 <= len(self.data):
            n = int.from_bytes(self.data[at:at + 4], "big")
            if at + 4 + n > len(self.data):
                break
            out.append([r[0] for r in framing.unpack(bytes(self.data[at + 4:at + 4 + n]))])
            at += 4 + n
        return out


def test_a_record_put_on_an_idle_link_is_written_at_once_by_the_putting_thread() -> None:
    sock = HeldSocket(takes=1 << 20)
    errors: list[BaseException] = []
    sender = writechannel._Sender(sock, "test-sender", errors.append)  # type: ignore[arg-type]
    try:
        sender.put([b"1", b"first"])
        assert sock.frames() == [[b"1"]]  # written when put() returned: no other thread to wait for
        sender.put([b"2", b"second"])
        assert sock.frames() == [[b"1"], [b"2"]]
        assert sock.writers == [threading.current_thread().name] * 2 and errors == []
    finally:
        sender.close()


def test_calls_queued_while_a_frame_is_written_leave_in_one_frame() -> None:
    """The socket takes only part of the first frame at once: its rest goes by the sender's thread, and what
    is put meanwhile waits behind it (in order) and leaves as one frame."""
    sock = HeldSocket(takes=3)
    errors: list[BaseException] = []
    sender = writechannel._Sender(sock, "test-sender", errors.append)  # type: ignore[arg-type]
    try:
        sender.put([b"1", b"first"])
        assert sock.writing_first.wait(10)  # the sender's thread is inside the first frame's rest
        for i in range(2, 6):
            sender.put([str(i).encode(), b"queued"])
        sock.release.set()
        deadline = time.monotonic() + 10
        while len(sock.frames()) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sock.frames() == [[b"1"], [b"2", b"3", b"4", b"5"]]
        assert sock.writers == [threading.current_thread().name, "test-sender", "test-sender"] and errors == []
    finally:
        sock.release.set()
        sender.close()


def test_frames_waiting_on_a_link_past_descriptor_1023_are_all_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """The core reads every frame already waiting on a worker's link: with a descriptor past 1,023 (a core
    holding many connections), select.select refused it and the link was dropped as ended. (The link's reader
    takes one frame a recv here, so that each next one is seen by the poll, not in what the reader holds.)"""
    import os
    import resource
    import socket
    import struct

    monkeypatch.setattr(framing, "RECV_BYTES", 7)  # b"one"'s frame

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
        reader = framing.FrameReader(high, 1024)
        assert server._waiting_frames(reader, writechannel.readable(high)) == [b"one", b"two", b"three"]
    finally:
        server.pool.shutdown()
        high.close()
        theirs.close()


def test_records_put_from_many_threads_arrive_whole_and_in_order_through_a_small_socket() -> None:
    """Direct writes, their unsent rests and the sender thread's frames interleave on a socket whose small
    buffer takes frames in parts: every record arrives once, whole, each thread's in its order."""
    ours, theirs = socket.socketpair()
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    errors: list[BaseException] = []
    sender = writechannel._Sender(ours, "test-sender", errors.append)
    threads, each = 6, 100
    got: dict[bytes, list[int]] = {}

    def read() -> None:
        while sum(map(len, got.values())) < threads * each:
            body = framing.read_frame(theirs, 1 << 24)
            assert body is not None
            for who, number, payload in framing.unpack(body):
                assert payload == who * (int(number) % 20)
                got.setdefault(who, []).append(int(number))

    def put(who: bytes) -> None:
        for number in range(each):
            sender.put([who, str(number).encode(), who * (number % 20)])
            time.sleep(0.001)  # the link goes idle now and then: puts write at once, in parts

    reader = threading.Thread(target=read)
    reader.start()
    putters = [threading.Thread(target=put, args=(f"t{i}-".encode() * 300,)) for i in range(threads)]
    for t in putters:
        t.start()
    for t in putters:
        t.join(30)
    reader.join(30)
    try:
        assert not reader.is_alive() and errors == []
        assert sorted(got) == sorted(f"t{i}-".encode() * 300 for i in range(threads))
        assert all(numbers == list(range(each)) for numbers in got.values())
    finally:
        sender.close()
        ours.close()
        theirs.close()
