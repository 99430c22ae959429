"""nameserver/framing.py FrameReader as a worker's replica reads its feed with it (nameserver/localfeed.py): the
frames framing.read_frame reads, with one recv for what has come (a frame's length and body together, frames
sent together), and big frames (a snapshot's chunks) whose parts arrive in pieces."""

from __future__ import annotations

import socket
import threading

import pytest

from nameserver import framing
from nameserver.framing import RECV_BYTES as READ_BYTES
from nameserver.framing import FrameReader


class Counted:
    """A socket's recv, counted."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.recvs = sock, 0

    def recv(self, n: int) -> bytes:
        self.recvs += 1
        return self.sock.recv(n)


def test_frames_sent_together_are_read_together_then_the_end_between_frames() -> None:
    left, right = socket.socketpair()
    frames = [framing.pack_one(b"m%d" % i * (i % 7 * 50)) for i in range(200)] + [framing.pack([[b"14", b"no"]])]
    bodies = [frame[4:] for frame in frames]
    left.sendall(b"".join(frames))
    left.close()
    counted = Counted(right)
    reader = FrameReader(counted, 1 << 20)  # type: ignore[arg-type]  # the recv it uses
    assert [reader.read_frame() for _ in bodies] == bodies
    assert counted.recvs <= len(b"".join(frames)) // READ_BYTES + 2  # up to READ_BYTES a read (read_frame: 2 a frame)
    assert reader.read_frame() is None and reader.read_frame() is None
    right.close()


@pytest.mark.parametrize("step", [1, 7, 4099])
def test_frames_whose_parts_arrive_in_pieces_are_read_whole(step: int) -> None:
    left, right = socket.socketpair()
    fields = [b"first" * 1000, b"", bytes(range(256)) * (3 * READ_BYTES // 256 + 1), b"last"]
    frames = b"".join(framing.pack_one(f) for f in fields)

    def dribble() -> None:  # every part of each frame in several reads (a big one past one read's size)
        for i in range(0, len(frames), step):
            left.sendall(frames[i:i + step])
        left.close()

    writer = threading.Thread(target=dribble)
    writer.start()
    try:
        reader = FrameReader(right, 1 << 20)
        assert [framing.one_field(reader.read_frame() or b"") for _ in fields] == fields
        assert reader.read_frame() is None
    finally:
        writer.join()
        right.close()


@pytest.mark.parametrize("cut", [2, 9])  # inside the length, inside the body
def test_a_socket_that_ends_inside_a_frame_is_an_error_not_a_frame(cut: int) -> None:
    left, right = socket.socketpair()
    left.sendall(framing.pack_one(b"whole") + framing.pack_one(b"cut short")[:cut])
    left.close()
    reader = FrameReader(right, 1 << 20)
    assert framing.one_field(reader.read_frame() or b"") == b"whole"
    with pytest.raises(EOFError):
        reader.read_frame()
    right.close()


def test_a_frame_past_the_bound_is_refused_before_its_body_is_read() -> None:
    left, right = socket.socketpair()
    left.sendall(framing.pack_one(b"x" * 100))
    with pytest.raises(ValueError, match="past its 50-byte bound"):
        FrameReader(right, 50).read_frame()
    left.close()
    right.close()
