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

On the leader's node neither asks: the core keeps its lease and commit index on a page its workers map
(raftlog/leaseboard.py, LEASE_NAME), and while the lease holds the read's index is the commit index read from
it after the read arrived (the core's own leased index, without the round trip through the channel's two
threads). Without a lease there (a follower's node, a lease run out or given up, [raft] read_lease off) the
read asks as below.

The reads of one frame from the front end (taken inside writechannel.sends_held) share one ask, sent as
the frame ends (at_hold_end), after every one of them arrived.

read_index_later is the same read with no thread waiting (a LINEARIZABLE read behind the Go front end:
frontchannel.IndexFirst): its callback runs where the answer comes. Such a read has no wait of its own to time
out, so while any waits one thread checks them every LATER_CHECK_S (hands back those past their time, gives up
asks past theirs) and ends once none is left.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

import grpc

from nameserver.api.writechannel import READ_INDEX, Answer, Cancel, Metadata, WriteChannel, at_hold_end, sends_held
from nameserver.pb import api_pb2

log = logging.getLogger("nameserver.api.coreindex")

LEASE_NAME = os.path.join("channel", "lease")  # the core's LeaseBoard, in its data directory
MAX_ASKS = 4  # asks out at once (the core's batcher also keeps 4 rounds in flight)
_GRACE_S = 1.0  # past an ask's own time, for the core's answer to come back (as WriteChannel.call's)


class _Read:
    __slots__ = ("done", "error", "event", "index", "until")

    def __init__(self, done: Later | None = None, until: float = 0.0) -> None:
        self.event = threading.Event() if done is None else _UNWATCHED
        self.index = 0
        self.error: Exception | None = None
        self.done = done  # read_index_later's callback (None: a thread waits on the event); None once called
        self.until = until  # read_index_later's: handed back with no index past this (monotonic)


Later = Callable[[int | None], None]  # read_index_later's callback: the index, or None (ask read_index)
_UNWATCHED = threading.Event()  # a later read's event: no thread waits on it
LATER_CHECK_S = 0.25  # how often reads asked for later are checked for their time (while any waits)


class CoreReadIndex:
    """read_index(timeout) for ReplicaNode: the core's read index, or TimeoutError when it has none in time."""

    def __init__(self, writes: WriteChannel, metadata: Metadata, ask_timeout_s: float, max_asks: int = MAX_ASKS,
                 leased: Callable[[], int | None] | None = None) -> None:
        """`metadata`: what each ask carries (the worker's own: corelink.own_metadata); `ask_timeout_s`:
        an ask's time at the core (its read index may wait for a leader that long); `leased()`: the leader
        core's commit index under its lease now, or None (raftlog.leaseboard.LeaseView.index)."""
        self.writes = writes
        self.leased = leased
        self.metadata = metadata
        self.ask_timeout_s = max(0.1, ask_timeout_s)
        self.max_asks = max_asks
        self._lock = threading.Lock()
        self._waiting: list[_Read] = []
        self._out: dict[int, tuple[float, Cancel]] = {}  # the asks out: their give-up time and cancel
        self._ids = 0
        self._stopped = False
        self._later: list[_Read] = []  # read_index_later's reads not answered yet (the check's)
        self._checking = False  # the check's thread runs (while reads asked for later wait)
        self.asks = 0
        self.reads = 0

    def read_index(self, timeout: float) -> int:
        if self.leased is not None and (index := self.leased()) is not None and not self._stopped:
            return index
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

    def read_index_later(self, timeout: float, done: Later) -> None:
        """read_index with no thread waiting: `done(index)` when the ask that serves this read is answered
        (on the write channel's reader thread; the same rule: an ask sent after this call); `done(None)` when
        that gives no index: the ask failed, the worker stops, or `timeout` passed first (noticed within
        LATER_CHECK_S; the caller then asks read_index, which waits and says why). Called once; on this
        thread, before this returns, when the core's lease gives the index."""
        if self.leased is not None and (index := self.leased()) is not None and not self._stopped:
            done(index)
            return
        read = _Read(done, time.monotonic() + timeout)
        with self._lock:
            stopped = self._stopped
            if not stopped:
                self._waiting.append(read)
                self._later.append(read)
                self.reads += 1
                start, self._checking = not self._checking, True
        if stopped:
            done(None)
            return
        if start:  # a thread of its own only while such reads wait: it ends when none is left
            threading.Thread(target=self._check_later, name="read-index-later", daemon=True).start()
        if not at_hold_end(self._ask_if_free):  # the reads of one frame from the front end: one ask, at its end
            self._ask_if_free()

    def stop(self) -> None:
        """Refuse reads from now on (no thread to end: an ask out is answered or failed by the channel; the
        check of reads asked for later hands them back and ends)."""
        with self._lock:
            self._stopped = True

    def _ask_if_free(self) -> None:
        """Send an ask for every read waiting, when fewer than max_asks are out."""
        with self._lock:
            if not self._waiting or (len(self._out) >= self.max_asks and not self._stopped):
                return
            reads, self._waiting = self._waiting, []
            stopped = self._stopped
            if stopped:  # no ask after the worker's stop (it would open the channel again)
                for read in reads:
                    read.error = TimeoutError("no read index: the worker is stopping")
                    read.event.set()
            else:
                self._ids += 1
                ask = self._ids
                self._out[ask] = (time.monotonic() + self.ask_timeout_s + _GRACE_S, _no_cancel)
                self.asks += 1
        if stopped:
            for read in reads:
                if read.done is not None and (done := self._claim(read)) is not None:
                    _call(done, None)
            return
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
            with sends_held():  # the replies of the reads run here go out together (to the front end)
                for read in reads:
                    read.index, read.error = index, error
                    if read.done is None:
                        read.event.set()
                    elif (later := self._claim(read)) is not None:
                        _call(later, index if error is None else None)
            with self._lock:
                del self._out[ask]
            self._ask_if_free()  # the reads that came while every ask was out
        return done

    def _claim(self, read: _Read) -> Later | None:
        """A later read's callback, once: None when it was called already (its time passed)."""
        with self._lock:
            later, read.done = read.done, None
            if later is not None:
                self._later.remove(read)
        return later

    def _check_later(self) -> None:
        """Hand back the reads asked for later whose time passed (and give up an ask out past its own time,
        as read_index does); ends once none waits."""
        while True:
            time.sleep(LATER_CHECK_S)
            now = time.monotonic()
            with self._lock:
                late = [r for r in self._later if r.until <= now or self._stopped]
                stale = [cancel for give_up, cancel in self._out.values() if give_up <= now]
                if not self._later:
                    self._checking = False
                    return
            for cancel in stale:
                cancel((grpc.StatusCode.DEADLINE_EXCEEDED, "the node's core did not answer a read index in time"))
            for read in late:
                if (later := self._claim(read)) is not None:
                    _call(later, None)


def _call(later: Later, index: int | None) -> None:
    """A later read's callback; its failure must not take the channel's reader (or the check) down."""
    try:
        later(index)
    except Exception:
        log.exception("a read index's callback failed")


def _no_cancel(why: tuple[grpc.StatusCode, str] | None = None, tell: bool = True) -> None:
    """An ask's place before its cancel is known (it is being sent)."""


def lease_path(data_dir: str) -> str:
    return os.path.join(data_dir, LEASE_NAME)


__all__ = ["LEASE_NAME", "MAX_ASKS", "CoreReadIndex", "Later", "lease_path"]
