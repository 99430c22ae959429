"""writechannel.sends_held: records put on a thread inside it leave, per sender, as one frame at its end (one
write, one wake of the reader at the other end, for the replies of a frame's calls or of one read index's
reads), by that thread; another thread's records are not held; nested holds write at the outermost's end."""

from __future__ import annotations

import threading

from nameserver.api import writechannel
from tests.unit.test_writechannel_frames import HeldSocket


def test_records_put_inside_a_hold_leave_together_at_its_end() -> None:
    first, second = HeldSocket(takes=1 << 20), HeldSocket(takes=1 << 20)
    errors: list[BaseException] = []
    a = writechannel._Sender(first, "sender-a", errors.append)  # type: ignore[arg-type]
    b = writechannel._Sender(second, "sender-b", errors.append)  # type: ignore[arg-type]
    try:
        with writechannel.sends_held():
            a.put([b"1", b"x"])
            b.put([b"2", b"y"])
            with writechannel.sends_held():  # nested: held on to the outer one's end
                a.put([b"3", b"z"])
            assert first.frames() == [] and second.frames() == []
            other = threading.Thread(target=lambda: a.put([b"4", b"w"]), name="not-holding")
            other.start()
            other.join(5)
            assert first.frames() == [[b"1", b"3", b"4"]]  # it found the link idle: it wrote the held ones too
        assert first.frames() == [[b"1", b"3", b"4"]]
        assert second.frames() == [[b"2"]]
        assert first.writers == ["not-holding"]
        a.put([b"5", b"v"])  # after the hold: at once, by the putting thread
        assert first.frames()[-1] == [b"5"]
        assert second.writers == [threading.current_thread().name] and errors == []
    finally:
        a.close()
        b.close()


def test_a_step_asked_for_at_the_hold_s_end_runs_once_there_and_what_it_puts_is_held_too() -> None:
    sock = HeldSocket(takes=1 << 20)
    errors: list[BaseException] = []
    sender = writechannel._Sender(sock, "sender", errors.append)  # type: ignore[arg-type]
    ran: list[int] = []

    def step() -> None:
        ran.append(1)
        sender.put([b"ask", b""])

    try:
        assert not writechannel.at_hold_end(step)  # no hold: the caller runs it
        with writechannel.sends_held():
            sender.put([b"reply", b""])
            assert writechannel.at_hold_end(step) and writechannel.at_hold_end(step)
            assert ran == []
        assert ran == [1] and sock.frames() == [[b"reply", b"ask"]] and errors == []
    finally:
        sender.close()


def test_a_step_that_fails_at_the_hold_s_end_leaves_the_other_steps_and_the_held_records_going() -> None:
    sock = HeldSocket(takes=1 << 20)
    errors: list[BaseException] = []
    sender = writechannel._Sender(sock, "sender", errors.append)  # type: ignore[arg-type]
    ran: list[str] = []

    def fails() -> None:
        ran.append("fails")
        raise RuntimeError("a step's bug")

    def after() -> None:
        ran.append("after")
        sender.put([b"ask", b""])

    try:
        with writechannel.sends_held():
            sender.put([b"reply", b""])
            writechannel.at_hold_end(fails)
            writechannel.at_hold_end(after)
        assert ran == ["fails", "after"] and sock.frames() == [[b"reply", b"ask"]] and errors == []
        assert not writechannel.at_hold_end(after)  # the hold ended: no hold is left on this thread
    finally:
        sender.close()
