"""Group commit: concurrent proposals coalesced into one Raft entry.

Proposers hand a Batch to `propose`; a single thread drains the queue and appends what it found
as one Entry (bounded by count and bytes). When several proposals were already waiting it lingers
briefly for more; a lone proposal goes out at once. Measured on 3 local nodes: a lone writer's
p50 went from 3.9 ms (always lingering 2 ms) to about 1.6 ms. Each proposer then waits for its own
batch's result from the apply thread, matched by request id. A lone writer's proposal, which the thread would
append at once and alone, its proposer appends itself (_append_alone): no wake of the thread for it.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from raftlog.applier import Applied, Applier
from raftlog.binding import FAIL_REASON
from raftlog.codec import encode_entry
from raftlog.pb import entry_pb2

log = logging.getLogger("raftlog.propose")


class ProposalError(Exception):
    """Not appended, or outcome unknown; `retryable` says whether resending is safe."""

    def __init__(self, message: str, *, unknown_outcome: bool = False) -> None:
        super().__init__(message)
        self.unknown_outcome = unknown_outcome


class NotLeader(ProposalError):
    pass


@dataclass(slots=True)
class _Pending:
    batch: entry_pb2.Batch
    size: int
    failed: str | None = None
    appended: bool = True  # False once pysyncobj says the entry never entered the log
    event: threading.Event | _Ending | None = None


class GroupCommitter:
    def __init__(self, applier: Applier, append: Callable[[bytes, Callable], None],
                 is_leader: Callable[[], bool], term: Callable[[], int],
                 linger_s: float = 0.002, max_batches: int = 512, max_bytes: int = 4 << 20,
                 max_in_flight: int = 2) -> None:
        self._applier = applier
        self._append = append
        self._is_leader = is_leader
        self._term = term
        self.linger_s = linger_s
        self.max_batches = max_batches
        self.max_bytes = max_bytes
        # Entries appended but not yet applied. At the limit, new proposals wait and go out
        # together in the next entry: under load each entry (one fsync, one message per follower,
        # one pickle) carries many proposals instead of one.
        self.max_in_flight = max_in_flight
        self._flight_term = -1
        self._groups: dict[int, list[_Pending]] = {}  # in flight: appended, result not yet known
        self._group_ids = itertools.count(1)
        # Request ids only need to be unique among live proposals: a per-process random prefix and
        # a counter (uuid4 per proposal cost ~5% of a loaded leader's CPU in os.urandom).
        self._id_prefix = uuid.uuid4().hex[:12] + "-"
        self._ids = itertools.count(1)
        self._flight = threading.Condition()
        self._inline = 0  # lone proposals appended by their proposer's thread, not in _groups yet (under _flight)
        # proposals handed to the group-commit thread and not appended yet, the ones it holds included (under
        # _flight): a lone proposal goes only when none is, so it never overtakes one queued before it
        self._handed = 0
        self._last_group = 0  # proposals in the entry appended last (under _flight)
        self._queue: queue.SimpleQueue[_Pending | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="group-commit", daemon=True)
        self.entries_appended = 0
        self.batches_appended = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=5)

    def propose(self, batch: entry_pb2.Batch, timeout: float) -> Applied:
        """Append `batch` and wait for it to apply locally. Raises NotLeader / ProposalError."""
        if not self._is_leader():
            raise NotLeader("this node is not the leader")
        if not batch.request_id:
            batch.request_id = f"{self._id_prefix}{next(self._ids)}"
        waiter = self._applier.register(batch.request_id)
        pending = _Pending(batch, batch.ByteSize(), event=waiter.event)
        if not self._append_alone(pending):
            self._hand_over(pending)
        try:
            if not waiter.event.wait(timeout):
                raise ProposalError("timed out waiting for the write to commit", unknown_outcome=True)
            if waiter.applied is None:
                # pysyncobj reported a failure; LEADER_CHANGED/DISCARDED may still have applied.
                raise ProposalError(pending.failed or "proposal failed", unknown_outcome=pending.appended)
            return waiter.applied
        finally:
            self._applier.unregister(batch.request_id)

    def propose_later(self, batch: entry_pb2.Batch,
                      done: Callable[[Applied | None, ProposalError | None], None]) -> Callable[[], None]:
        """`propose` with no thread waiting: `done(applied, None)` once the batch applied here (on the apply
        thread), or `done(None, error)` as `propose` would raise it (on the thread that learns it), once.
        Returns `give_up`, the caller's timeout: it ends the wait (done with "timed out", outcome unknown) when
        nothing ended it before. Raises NotLeader at once."""
        if not self._is_leader():
            raise NotLeader("this node is not the leader")
        if not batch.request_id:
            batch.request_id = f"{self._id_prefix}{next(self._ids)}"
        request_id = batch.request_id
        waiter = self._applier.register(request_id)
        pending = _Pending(batch, batch.ByteSize())
        ended = threading.Lock()

        def end(timed_out: bool = False) -> None:
            if not ended.acquire(blocking=False):
                return  # ended already
            self._applier.unregister(request_id)
            try:  # on the apply or tick thread: a caller's bug must never stop them
                if timed_out:
                    done(None, ProposalError("timed out waiting for the write to commit", unknown_outcome=True))
                elif waiter.applied is None:
                    # pysyncobj reported a failure; LEADER_CHANGED/DISCARDED may still have applied.
                    done(None, ProposalError(pending.failed or "proposal failed", unknown_outcome=pending.appended))
                else:
                    done(waiter.applied, None)
            except Exception:
                log.exception("a proposal's callback failed")

        # What wakes a waiting proposer (the applier's waiter event, a failure's) calls `end` instead.
        waiter.event = pending.event = _Ending(end)  # type: ignore[assignment]
        if not self._append_alone(pending):
            self._hand_over(pending)
        return lambda: end(timed_out=True)

    def _hand_over(self, pending: _Pending) -> None:
        with self._flight:
            self._handed += 1
        self._queue.put(pending)

    def _append_alone(self, pending: _Pending) -> bool:
        """Append `pending` as an entry of its own on this thread when the group-commit thread would do just that
        at once, for a writer that looks alone: no proposal is handed to that thread and not appended yet (queued
        or held by it: this one never overtakes it), no entry is in flight, the entry appended last carried one
        proposal (with several writers a proposal that waits a moment for the thread mostly shares its entry:
        appended here at once it went alone, and each entry costs every node; measured, docs/benchmarks.md,
        "Issue 27: the leader's write call path (session 26)"), and the term is the one of the entries in flight
        before. What this saves is the wake of that thread, and the hand-over of the GIL to it, per proposal of a
        lone writer. False: queue it."""
        if self._handed or self._groups or self._last_group != 1:
            return False
        with self._flight:
            if self._handed or self._groups or self._inline or self._last_group != 1 \
                    or self._term() != self._flight_term:
                return False
            self._inline += 1  # its room is taken: the thread's wait_for counts it
        try:
            self._append_group([pending])
        finally:
            with self._flight:
                self._inline -= 1
                self._flight.notify()
        return True

    def abandon_in_flight(self, reason: str) -> None:
        """Wake every proposer whose entry was appended but not yet committed (outcome unknown).

        If the entry commits after all, the apply still happens; only the proposer stops waiting.
        """
        with self._flight:
            groups, self._groups = list(self._groups.values()), {}
            self._flight.notify()
        for group in groups:
            for p in group:
                p.failed = reason
                if p.event is not None:
                    p.event.set()

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            with self._flight:
                term = self._term()
                if term != self._flight_term:  # a new term: results of the old one may never come
                    self._flight_term = term
                    self._groups.clear()
                # bounded, so a lost result callback cannot stall proposals for long
                self._flight.wait_for(lambda: len(self._groups) + self._inline < self.max_in_flight, timeout=1.0)
            group = [first]
            size = first.size
            self._drain_into(group, size, None)
            if len(group) > 1 and self.linger_s > 0:
                # Others were already waiting: concurrency is evident, so linger briefly for more to
                # share this entry. A lone proposal goes out at once (no latency tax when idle).
                self._drain_into(group, sum(p.size for p in group), time.monotonic() + self.linger_s)
            self._append_group(group, handed=True)

    def _drain_into(self, group: list[_Pending], size: int, deadline: float | None) -> None:
        """Add queued proposals to `group` (up to the limits); wait until `deadline` if given."""
        while len(group) < self.max_batches and size < self.max_bytes:
            try:
                if deadline is None:
                    nxt = self._queue.get_nowait()
                else:
                    left = deadline - time.monotonic()
                    nxt = self._queue.get(timeout=left) if left > 0 else self._queue.get_nowait()
            except queue.Empty:
                return
            if nxt is None:
                self._queue.put(None)  # keep the stop signal for the loop
                return
            group.append(nxt)
            size += nxt.size

    def _append_group(self, group: list[_Pending], handed: bool = False) -> None:
        """`handed`: the group-commit thread's, of proposals handed to it (else a lone proposal's)."""
        entry = entry_pb2.Entry(term=self._term(), leader_time_ms=int(time.time() * 1000))
        entry.batches.extend(p.batch for p in group)
        data = encode_entry(entry)

        gid = next(self._group_ids)

        def on_result(_res: object, err: int) -> None:  # tick thread: O(group), no blocking
            with self._flight:
                self._groups.pop(gid, None)
                self._flight.notify()
            if err == FAIL_REASON.SUCCESS:
                return
            reason = _FAIL_NAMES.get(err, f"failure {err}")
            for p in group:
                p.failed = reason
                if err in _NOT_APPENDED:
                    p.appended = False
                    if p.event is not None:
                        p.event.set()

        with self._flight:  # two threads may append (_append_alone): the counts under the lock
            self.entries_appended += 1
            self.batches_appended += len(group)
            self._last_group = len(group)
            self._groups[gid] = group  # in flight before no longer handed: a lone proposal waits for both
            if handed:
                self._handed -= len(group)
        try:
            self._append(data, on_result)
        except Exception as exc:
            with self._flight:
                self._groups.pop(gid, None)
            log.exception("append failed")
            for p in group:
                p.failed = f"append failed: {exc}"
                p.appended = False
                if p.event is not None:
                    p.event.set()


class _Ending:
    """Stands in for a proposer's event where no thread waits (propose_later): set() ends the wait."""

    __slots__ = ("set",)

    def __init__(self, end: Callable[[], None]) -> None:
        self.set = end


_FAIL_NAMES = {
    FAIL_REASON.QUEUE_FULL: "queue full",
    FAIL_REASON.MISSING_LEADER: "no leader",
    FAIL_REASON.DISCARDED: "discarded by a new leader (outcome unknown)",
    FAIL_REASON.NOT_LEADER: "not the leader",
    FAIL_REASON.LEADER_CHANGED: "leader changed (outcome unknown)",
    FAIL_REASON.REQUEST_DENIED: "request denied",
}
# Failures after which the entry certainly never entered the log: wake the proposer at once.
_NOT_APPENDED = {FAIL_REASON.QUEUE_FULL, FAIL_REASON.MISSING_LEADER, FAIL_REASON.NOT_LEADER,
                 FAIL_REASON.REQUEST_DENIED}
