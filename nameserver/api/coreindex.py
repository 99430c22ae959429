"""A worker's read indexes, asked of its core on the write channel (READ_INDEX), for its LINEARIZABLE reads
(corelink.core_read_index builds it; the core's side is corelink.ReadIndexes).

Reads waiting at once share one ask, and an ask serves only the reads that arrived before it was sent: each
gets an index that covers every write acknowledged before it (as nameserver/core/readindex.py's rounds). Up
to `max_asks` asks are out at once; a read arriving while all are out waits for the next, sent when one is
answered. Nothing here has a thread of its own: a read that finds an ask free sends one itself, and the
channel's reader thread, as the core's answer comes, wakes the reads it serves and sends the next ask for
those waiting. (A round on a thread of its own cost each read two thread wakes more, on a loaded machine
the most of what a worker added to a read: docs/benchmarks.md, "Issue 27: writes and linearizable reads
through a worker (session 21)".) Each read waits at most its own timeout; an ask the core leaves unanswered
past its own time is given up by the next read that finds every ask out, so it never holds a place for good.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

import grpc

from nameserver.api.writechannel import READ_INDEX, Answer, Cancel, Metadata, WriteChannel
from nameserver.pb import api_pb2

MAX_ASKS = 4  # asks out at once (the core's batcher also keeps 4 rounds in flight)
_GRACE_S = 1.0  # past an ask's own time, for the core's answer to come back (as WriteChannel.call's)


class _Read:
    __slots__ = ("error", "event", "index")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.index = 0
        self.error: Exception | None = None


class CoreReadIndex:
    """read_index(timeout) for ReplicaNode: the core's read index, or TimeoutError when it has none in time."""

    def __init__(self, writes: WriteChannel, metadata: Metadata, ask_timeout_s: float, max_asks: int = MAX_ASKS
                 ) -> None:
        """`metadata`: what each ask carries (the worker's own: corelink.own_metadata); `ask_timeout_s`:
        an ask's time at the core (its read index may wait for a leader that long)."""
        self.writes = writes
        self.metadata = metadata
        self.ask_timeout_s = max(0.1, ask_timeout_s)
        self.max_asks = max_asks
        self._lock = threading.Lock()
        self._waiting: list[_Read] = []
        self._out: dict[int, tuple[float, Cancel]] = {}  # the asks out: their give-up time and cancel
        self._ids = 0
        self._stopped = False
        self.asks = 0
        self.reads = 0

    def read_index(self, timeout: float) -> int:
        read = _Read()
        with self._lock:
            if self._stopped:
                raise TimeoutError("no read index: the worker is stopping")
            self._waiting.append(read)
            self.reads += 1
            stale = [cancel for give_up, cancel in self._out.values() if give_up <= time.monotonic()]
        for cancel in stale:  # answers its ask (DEADLINE_EXCEEDED), which frees its place
            cancel((grpc.StatusCode.DEADLINE_EXCEEDED, "the node's core did not answer a read index in time"))
        self._ask_if_free()
        if not read.event.wait(timeout):
            raise TimeoutError("no read index within the deadline (is there a leader with a quorum?)")
        if read.error is not None:
            raise read.error
        return read.index

    def stop(self) -> None:
        """Refuse reads from now on (no thread to end: an ask out is answered or failed by the channel)."""
        with self._lock:
            self._stopped = True

    def _ask_if_free(self) -> None:
        """Send an ask for every read waiting, when fewer than max_asks are out."""
        with self._lock:
            if not self._waiting or (len(self._out) >= self.max_asks and not self._stopped):
                return
            reads, self._waiting = self._waiting, []
            if self._stopped:  # no ask after the worker's stop (it would open the channel again)
                for read in reads:
                    read.error = TimeoutError("no read index: the worker is stopping")
                    read.event.set()
                return
            self._ids += 1
            ask = self._ids
            self._out[ask] = (time.monotonic() + self.ask_timeout_s + _GRACE_S, _no_cancel)
            self.asks += 1
        answer, cancel = self.writes.start(READ_INDEX, b"", self.metadata, self.ask_timeout_s)
        with self._lock:
            if ask in self._out:  # not answered at once
                self._out[ask] = (self._out[ask][0], cancel)
        answer.add_done_callback(self._answered(ask, reads))

    def _answered(self, ask: int, reads: list[_Read]) -> Callable[[Future[Answer]], None]:
        def done(answer: Future[Answer]) -> None:
            code, details, reply, _ = answer.result()
            index, error = 0, None
            if code == grpc.StatusCode.OK:
                index = api_pb2.ReadIndexReply.FromString(reply).read_index
            else:
                error = TimeoutError(f"no read index from the node's core: {details}")
            for read in reads:
                read.index, read.error = index, error
                read.event.set()
            with self._lock:
                del self._out[ask]
            self._ask_if_free()  # the reads that came while every ask was out
        return done


def _no_cancel(why: tuple[grpc.StatusCode, str] | None = None, tell: bool = True) -> None:
    """An ask's place before its cancel is known (it is being sent)."""


__all__ = ["MAX_ASKS", "CoreReadIndex"]
