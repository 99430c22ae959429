"""nameserver/framing.py's frames of one message (a worker's feed sends one per Follow message): the same bytes
as the generic frame, read back by one_field and by unpack alike, and frames whose parts arrive in pieces."""

from __future__ import annotations

import socket
import threading

import pytest

from nameserver import framing


@pytest.mark.parametrize("field", [b"", b"x", bytes(range(256)) * 40])
def test_a_frame_of_one_field_is_the_generic_frame_and_reads_back_both_ways(field: bytes) -> None:
    frame = framing.pack_one(field)
    assert frame == framing.pack(((field,),))
    body = frame[4:]
    assert framing.one_field(body) == field
    assert framing.unpack(body) == [[field]]


@pytest.mark.parametrize("records", [[[b"14", b"not ready"]], [[b"a"], [b"b"]], [], [[]]])
def test_one_field_leaves_every_other_frame_to_unpack(records: list[list[bytes]]) -> None:
    body = framing.pack(records)[4:]
    assert framing.one_field(body) is None
    assert framing.unpack(body) == records
    assert framing.one_field(body[:8]) is None  # torn: too short to be one


def test_frames_whose_parts_arrive_in_pieces_are_read_whole_then_the_end_between_frames() -> None:
    left, right = socket.socketpair()
    frames = framing.pack_one(b"first" * 1000) + framing.pack_one(b"second")

    def dribble() -> None:  # a few bytes at a time: every part of each frame comes in several reads
        for i in range(0, len(frames), 7):
            left.sendall(frames[i:i + 7])
        left.close()

    writer = threading.Thread(target=dribble)
    writer.start()
    try:
        assert framing.one_field(framing.read_frame(right, 1 << 20) or b"") == b"first" * 1000
        assert framing.one_field(framing.read_frame(right, 1 << 20) or b"") == b"second"
        assert framing.read_frame(right, 1 << 20) is None
    finally:
        writer.join()
        right.close()


def test_a_socket_that_ends_inside_a_frame_is_an_error_not_a_frame() -> None:
    left, right = socket.socketpair()
    left.sendall(framing.pack_one(b"cut short")[:-3])
    left.close()
    with pytest.raises(EOFError):
        framing.read_frame(right, 1 << 20)
    right.close()


def _reader_test_frames() -> list[bytes]:
    """Frames of several sizes: empty, short, one past a reader's recv, and one across several of them."""
    return [framing.pack([[b"a", b"bc"]]), framing.pack([]), framing.pack_one(b"x" * (framing.RECV_BYTES + 5)),
            framing.pack_one(b"y" * 10), framing.pack_one(bytes(range(256)) * (3 * framing.RECV_BYTES // 256))]


@pytest.mark.parametrize("step", [1, 7, 4096, 1 << 20])
def test_a_frame_reader_reads_the_frames_read_frame_reads_however_their_bytes_arrive(step: int) -> None:
    frames = _reader_test_frames()
    data = b"".join(frames)
    left, right = socket.socketpair()

    def send() -> None:
        for i in range(0, len(data), step):
            left.sendall(data[i:i + step])
        left.close()

    writer = threading.Thread(target=send)
    writer.start()
    try:
        reader = framing.FrameReader(right, 1 << 22)
        got = []
        while (body := reader.read_frame()) is not None:
            got.append(body)
        assert got == [frame[4:] for frame in frames]
        assert not reader.buffered()
    finally:
        writer.join()
        right.close()


def test_a_frame_reader_reads_frames_that_came_together_at_once_and_says_what_it_holds() -> None:
    left, right = socket.socketpair()
    left.sendall(framing.pack_one(b"one") + framing.pack_one(b"two") + framing.pack_one(b"three")[:5])
    reader = framing.FrameReader(right, 1 << 20)
    assert framing.one_field(reader.read_frame() or b"") == b"one"
    assert reader.buffered()  # the second frame (and part of the third) came with the first
    right.setblocking(False)  # a recv now would raise: the second frame is read from what is held
    assert framing.one_field(reader.read_frame() or b"") == b"two"
    assert reader.buffered()
    right.setblocking(True)
    left.sendall(framing.pack_one(b"three")[5:])
    left.close()
    assert framing.one_field(reader.read_frame() or b"") == b"three"
    assert reader.read_frame() is None
    right.close()


def test_a_frame_reader_refuses_a_frame_past_its_bound_and_one_cut_short() -> None:
    left, right = socket.socketpair()
    left.sendall(framing.pack_one(b"z" * 100))
    with pytest.raises(ValueError, match="past its 50-byte bound"):
        framing.FrameReader(right, 50).read_frame()
    right.close()
    left.close()
    for cut in (2, 9, framing.RECV_BYTES + 100):
        left, right = socket.socketpair()
        frame = framing.pack_one(b"w" * (2 * framing.RECV_BYTES))
        threading.Thread(target=lambda f=frame, c=cut, s=left: (s.sendall(f[:c]), s.close())).start()
        with pytest.raises(EOFError):
            framing.FrameReader(right, 1 << 22).read_frame()
        right.close()


class _CountedRecv:
    """A socket's recv, counted."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.recvs = sock, 0

    def recv(self, n: int) -> bytes:
        self.recvs += 1
        return self.sock.recv(n)


def test_a_frame_reader_takes_one_recv_for_frames_that_came_together() -> None:
    """As a worker's replica reads its feed (nameserver/localfeed.py): read_frame took two recvs a frame."""
    left, right = socket.socketpair()
    frames = [framing.pack_one(b"m%d" % i * (i % 7 * 50)) for i in range(200)] + [framing.pack([[b"14", b"no"]])]
    left.sendall(b"".join(frames))
    left.close()
    counted = _CountedRecv(right)
    reader = framing.FrameReader(counted, 1 << 20)  # type: ignore[arg-type]  # the recv it uses
    assert [reader.read_frame() for _ in frames] == [frame[4:] for frame in frames]
    assert counted.recvs <= len(b"".join(frames)) // framing.RECV_BYTES + 2
    assert reader.read_frame() is None and reader.read_frame() is None
    right.close()
