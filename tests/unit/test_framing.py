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
