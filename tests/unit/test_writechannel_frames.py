"""The write channel's sender (nameserver/api/writechannel.py): what is queued while a frame is being
written leaves as ONE next frame, so writes arriving together cost the core one read and one wake-up,
not one each. Deterministic: the socket's first write is held open while more calls are queued."""

from __future__ import annotations

import threading
import time

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
    return writechannel._unpack(frame[4:])


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
