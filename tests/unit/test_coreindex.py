"""A worker's read indexes (nameserver/api/coreindex.py): asks sent by the reads themselves and by the
answers, no thread of its own; an ask serves only the reads that arrived before it was sent; an ask the
core leaves unanswered does not hold its place for good. Deterministic: the asks are answered by hand."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from typing import Any

import grpc
import pytest

from nameserver.api import writechannel
from nameserver.api.coreindex import CoreReadIndex
from nameserver.api.writechannel import READ_INDEX, Answer
from nameserver.pb import api_pb2


class HandAnswered:
    """A write channel whose READ_INDEX asks wait until answered by hand (answer(i, index))."""

    def __init__(self) -> None:
        self.asks: list[Future[Answer]] = []
        self.cancelled: list[int] = []
        self.sent = threading.Semaphore(0)
        self.senders: list[str] = []

    def start(self, method: str, request: bytes, metadata: Any, time_left: float | None) -> tuple[Future[Answer], Any]:
        assert method == READ_INDEX
        answer: Future[Answer] = Future()
        number = len(self.asks)
        self.asks.append(answer)
        self.senders.append(threading.current_thread().name)

        def cancel(why: tuple[grpc.StatusCode, str] | None = None, tell: bool = True) -> None:
            self.cancelled.append(number)
            if not answer.done():
                answer.set_result((*(why or (grpc.StatusCode.CANCELLED, "cancelled")), b"", ()))

        self.sent.release()
        return answer, cancel

    def answer(self, i: int, index: int) -> None:
        self.asks[i].set_result((grpc.StatusCode.OK, "", api_pb2.ReadIndexReply(read_index=index).SerializeToString(),
                                 ()))


def _reading(reads: CoreReadIndex, got: dict[str, Any], name: str) -> threading.Thread:
    def read() -> None:
        try:
            got[name] = reads.read_index(10)
        except Exception as exc:  # kept for the assertion
            got[name] = exc
    t = threading.Thread(target=read, name=f"reader-{name}")
    t.start()
    return t


def test_reads_arriving_while_every_ask_is_out_share_the_next_ask_sent_as_one_is_answered() -> None:
    channel = HandAnswered()
    reads = CoreReadIndex(channel, (), 5.0, max_asks=1)  # type: ignore[arg-type]
    got: dict[str, Any] = {}
    first = _reading(reads, got, "a")
    assert channel.sent.acquire(timeout=5)
    later = [_reading(reads, got, name) for name in ("b", "c")]
    deadline = time.monotonic() + 5
    while reads.reads < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(channel.asks) == 1  # b and c wait: the one ask allowed is out
    channel.answer(0, 10)  # b and c arrived after ask 0 was sent: it must not serve them
    first.join(5)
    assert got == {"a": 10}
    assert channel.sent.acquire(timeout=5)  # the answer sent the next ask, for b and c together
    channel.answer(1, 11)
    for t in later:
        t.join(5)
    assert got == {"a": 10, "b": 11, "c": 11} and reads.asks == 2
    # no thread of its own: the first ask went from the reading thread, the next from the answering one
    assert channel.senders == ["reader-a", threading.current_thread().name]
    assert not [t for t in threading.enumerate() if "read-index" in t.name]


def test_an_ask_the_core_leaves_unanswered_is_given_up_after_its_time_and_frees_its_place() -> None:
    channel = HandAnswered()
    reads = CoreReadIndex(channel, (), 0.1, max_asks=1)  # type: ignore[arg-type]
    with pytest.raises(TimeoutError):
        reads.read_index(0.2)  # ask 0 is never answered
    assert len(channel.asks) == 1
    time.sleep(1.2)  # past the ask's time and the grace for its answer
    got: dict[str, Any] = {}
    reader = _reading(reads, got, "late")
    assert channel.sent.acquire(timeout=5) and channel.sent.acquire(timeout=5)
    assert channel.cancelled == [0]  # given up by the read that found every place taken
    channel.answer(1, 7)
    reader.join(5)
    assert got == {"late": 7}


def test_a_failed_ask_fails_its_reads_and_a_stopped_one_refuses_reads() -> None:
    channel = HandAnswered()
    reads = CoreReadIndex(channel, (), 5.0)  # type: ignore[arg-type]
    got: dict[str, Any] = {}
    reader = _reading(reads, got, "a")
    assert channel.sent.acquire(timeout=5)
    channel.asks[0].set_result((grpc.StatusCode.UNAVAILABLE, "no leader", b"", ()))
    reader.join(5)
    assert isinstance(got["a"], TimeoutError) and "no leader" in str(got["a"])
    reads.stop()
    with pytest.raises(TimeoutError, match="stopping"):
        reads.read_index(1)


def test_reads_waiting_when_the_worker_stops_are_refused_not_asked() -> None:
    """An ask answered after the stop sends no next ask (it would open the closed channel again): the reads
    that waited for it are refused."""
    channel = HandAnswered()
    reads = CoreReadIndex(channel, (), 5.0, max_asks=1)  # type: ignore[arg-type]
    got: dict[str, Any] = {}
    first = _reading(reads, got, "a")
    assert channel.sent.acquire(timeout=5)
    waiting = _reading(reads, got, "b")
    deadline = time.monotonic() + 5
    while reads.reads < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    reads.stop()
    channel.answer(0, 3)
    first.join(5)
    waiting.join(5)
    assert got["a"] == 3 and isinstance(got["b"], TimeoutError) and "stopping" in str(got["b"])
    assert len(channel.asks) == 1


def test_a_read_asked_for_later_shares_the_asks_and_is_answered_on_the_answering_thread() -> None:
    """read_index_later: no thread waits; the callback gets the index of an ask sent after the call, on the
    thread the answer comes on, alongside reads that wait (the same sharing rule)."""
    channel = HandAnswered()
    reads = CoreReadIndex(channel, (), 5.0, max_asks=1)  # type: ignore[arg-type]
    got: dict[str, Any] = {}
    first = _reading(reads, got, "a")
    assert channel.sent.acquire(timeout=5)
    later: list[tuple[int | None, str]] = []
    reads.read_index_later(5, lambda index: later.append((index, threading.current_thread().name)))
    waiting = _reading(reads, got, "b")
    deadline = time.monotonic() + 5
    while reads.reads < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    channel.answer(0, 10)  # sent before the later read came: not its
    first.join(5)
    assert later == [] and channel.sent.acquire(timeout=5)
    answering = threading.Thread(target=channel.answer, args=(1, 11), name="channel-reader")
    answering.start()
    answering.join(5)
    waiting.join(5)
    assert later == [(11, "channel-reader")] and got == {"a": 10, "b": 11} and reads.asks == 2


def test_a_read_asked_for_later_is_handed_back_without_an_index_when_its_ask_fails_its_time_passes_or_on_stop(
        ) -> None:
    channel = HandAnswered()
    reads = CoreReadIndex(channel, (), 5.0, max_asks=1)  # type: ignore[arg-type]
    later: list[int | None] = []
    reads.read_index_later(5, later.append)
    assert channel.sent.acquire(timeout=5)
    channel.asks[0].set_result((grpc.StatusCode.UNAVAILABLE, "no leader", b"", ()))
    assert later == [None]
    reads.read_index_later(0.05, later.append)  # ask 1 is never answered: its time passes first
    deadline = time.monotonic() + 5
    while len(later) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert later == [None, None]
    channel.answer(1, 12)  # too late for it: not called again
    assert later == [None, None]
    while [t for t in threading.enumerate() if t.name == "read-index-later"] and time.monotonic() < deadline:
        time.sleep(0.01)  # with none waiting, the check's thread ends
    assert not [t for t in threading.enumerate() if t.name == "read-index-later"]
    reads.stop()
    reads.read_index_later(5, later.append)
    assert later == [None, None, None]


def test_under_the_core_s_lease_a_read_takes_the_page_s_index_without_an_ask() -> None:
    """On the leader's node the read's index is the core's commit index on its lease page (read after the
    read arrived), with no ask; without a lease there it asks as ever; a stopped worker refuses either way."""
    channel = HandAnswered()
    page: list[int | None] = [17]
    reads = CoreReadIndex(channel, (), 5.0, leased=lambda: page[0])  # type: ignore[arg-type]
    assert reads.read_index(1) == 17
    later: list[int | None] = []
    reads.read_index_later(1, later.append)
    assert later == [17] and channel.asks == []  # called before read_index_later returned
    page[0] = None  # the lease ran out (or this node follows)
    got: dict[str, Any] = {}
    t = _reading(reads, got, "a")
    assert channel.sent.acquire(timeout=5)
    channel.answer(0, 20)
    t.join(5)
    assert got == {"a": 20}
    page[0] = 21
    reads.stop()
    with pytest.raises(TimeoutError):
        reads.read_index(1)
    reads.read_index_later(1, later.append)
    assert later == [17, None]


def test_the_reads_of_one_frame_share_one_ask_sent_as_the_frame_ends() -> None:
    """Reads asked for later while the front channel takes one frame (inside writechannel.sends_held) share
    one ask, sent at the frame's end: after each of them arrived; outside a hold each read asks at once."""
    channel = HandAnswered()
    reads = CoreReadIndex(channel, (), 5.0)  # type: ignore[arg-type]
    got: list[int | None] = []
    with writechannel.sends_held():
        reads.read_index_later(5, got.append)
        reads.read_index_later(5, got.append)
        assert channel.asks == []
    assert len(channel.asks) == 1
    channel.answer(0, 30)
    assert got == [30, 30]
    reads.read_index_later(5, got.append)
    reads.read_index_later(5, got.append)
    assert len(channel.asks) == 3  # no hold: each its own (up to max_asks out)
    channel.answer(1, 31)
    channel.answer(2, 31)
    assert got == [30, 30, 31, 31]
    deadline = time.monotonic() + 5  # the check of reads asked for later ends once none waits
    while [t for t in threading.enumerate() if t.name == "read-index-later"] and time.monotonic() < deadline:
        time.sleep(0.05)
