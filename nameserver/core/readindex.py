"""Linearizable reads: one read index per round of concurrent reads.

The index comes from `ReplicatedLog.read_index`: the leader's commit index, confirmed by a
heartbeat round to a majority (raftlog/leadership.py), or a barrier through the log when that
cannot answer yet. Below, "barrier" means that confirmation.

Reads that arrive while a barrier is in flight wait for the next round: a barrier proposed before a
read arrived could order before a write acknowledged before that read, so sharing it would be
stale. Up to `max_rounds` rounds are in flight at once, one per round thread (the group committer
puts concurrent barriers into one entry), so a read waits for at most the barrier it needs, not for
the previous round to finish first. The barrier commits only with a majority in the leader's current term,
so a paused or partitioned old leader can never hand out an index (its barrier never applies; the
read times out).
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

# A read index taken for the call running in this context before its handler ran (a worker's linearizable read
# behind the Go front end asks for it as the call arrives: nameserver/api/frontchannel.py, Later), from an ask
# sent after the call arrived: the node's linearizable_index answers it instead of asking again.
GIVEN_INDEX: contextvars.ContextVar[int | None] = contextvars.ContextVar("rip18_given_read_index", default=None)


@dataclass
class _Ticket:
    event: threading.Event = field(default_factory=threading.Event)
    index: int = 0
    error: Exception | None = None


class ReadIndexBatcher:
    def __init__(self, barrier: Callable[[float], int], barrier_timeout_s: float = 5.0,
                 max_rounds: int = 4, name: str = "read-index") -> None:
        self._barrier = barrier
        self._counts = threading.Lock()
        self._timeout = barrier_timeout_s
        self._cv = threading.Condition()
        self._waiting: list[_Ticket] = []
        self._stop = False
        self.rounds = 0
        self.reads = 0
        self.last_round_reads = 0
        # one thread per round that may be in flight: a free one takes every read waiting at once
        for i in range(max_rounds):
            threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True).start()

    def read_index(self, timeout: float) -> int:
        ticket = _Ticket()
        with self._cv:
            self._waiting.append(ticket)
            self._cv.notify()
        if not ticket.event.wait(timeout):
            raise TimeoutError("no read index within the deadline (is there a leader with a quorum?)")
        if ticket.error is not None:
            raise ticket.error
        return ticket.index

    def stop(self) -> None:
        """End the round threads (a round in flight ends with its barrier)."""
        with self._cv:
            self._stop = True
            self._cv.notify_all()

    @property
    def reads_per_barrier(self) -> float:
        return self.reads / self.rounds if self.rounds else 0.0

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._waiting and not self._stop:
                    self._cv.wait()
                if self._stop:
                    return
                batch, self._waiting = self._waiting, []
            self._round(batch)

    def _round(self, batch: list[_Ticket]) -> None:
        try:
            index = self._barrier(self._timeout)
            for t in batch:
                t.index = index
        except Exception as exc:
            for t in batch:
                t.error = exc
        with self._counts:
            self.rounds += 1
            self.reads += len(batch)
            self.last_round_reads = len(batch)
        for t in batch:
            t.event.set()
