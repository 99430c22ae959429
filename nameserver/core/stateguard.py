"""The state lock, and optimistic reads that never hold it (a sequence lock over the apply thread).

The node's state changes only on the apply thread (one entry at a time, or a snapshot restore), which
takes the lock through `StateGuard.writer`: the guard's sequence number is odd from the moment it holds
the lock until it lets go. Short readers (a route computed on a miss, status, a heartbeat's versions)
take the lock itself, as before. A long reader, the leader's translation of a write (seconds for a
registration of 70,000 topics), runs `optimistic(fn)` instead: `fn` runs without the lock, and its
result counts only if the sequence number was even at the start and is unchanged at the end, so no
entry was applied while `fn` read. Otherwise `fn` runs again; after OPTIMISTIC_ATTEMPTS tries it runs
under the lock (a write that keeps losing to apply must still get through). An exception `fn` raised
while apply moved under it is a symptom of the torn read (a dict that changed size while iterated),
not an answer, and is dropped the same way.

So apply and readers no longer wait for a translation, unless a translation lost OPTIMISTIC_ATTEMPTS
races in a row. `fn` must only read the state (translations are pure: nameserver/state/translate.py).
CPython's GIL makes the counter's reads and writes sequentially consistent with the state's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import TracebackType
from typing import TypeVar

T = TypeVar("T")

OPTIMISTIC_ATTEMPTS = 3


class _Writer:
    """The apply thread's side: the lock, with the sequence number odd while it is held."""

    def __init__(self, guard: StateGuard) -> None:
        self._guard = guard

    def __enter__(self) -> None:
        self._guard.lock.acquire()
        self._guard._seq += 1

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._guard._seq += 1
        self._guard.lock.release()


class StateGuard:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self._seq = 0  # odd while the apply thread changes the state
        self.writer = _Writer(self)
        self.optimistic_reads = 0   # optimistic reads that held (no apply under them)
        self.optimistic_retries = 0  # attempts dropped because an entry was applied meanwhile
        self.locked_fallbacks = 0    # reads that lost every attempt and ran under the lock

    def optimistic(self, fn: Callable[[], T], attempts: int = OPTIMISTIC_ATTEMPTS) -> T:
        """`fn()` as of one applied offset, without holding the lock unless every attempt lost a race."""
        for _ in range(attempts):
            seq = self._seq
            if seq & 1:  # an entry is being applied: the next attempt starts after it
                self.optimistic_retries += 1
                with self.lock:
                    pass
                continue
            try:
                result = fn()
            except Exception:
                if self._seq == seq:
                    raise  # the state held still: a real answer (a refusal, a bad request)
                self.optimistic_retries += 1
                continue
            if self._seq == seq:
                self.optimistic_reads += 1
                return result
            self.optimistic_retries += 1
        self.locked_fallbacks += 1
        with self.lock:
            return fn()


__all__ = ["OPTIMISTIC_ATTEMPTS", "StateGuard"]
