"""Deadlines of calls that must not hold a server thread past a bound, on one thread for all of them.

A streamed registration arrives chunk by chunk on a server thread: a slow (or stalled) sender holds that
thread until the stream ends. Each stream used to start a `threading.Timer` (a thread per call) to cancel
it after `limits.max_wait_ms`; now every such bound waits in one heap, watched by one thread that starts
with the first and runs the due cancellations in deadline order (`DeadlineWatch`).

The call guard sets a bound on every gRPC call, all of one length (limits.grpc_progress_timeout_ms):
for those `EqualBounds` keeps them in arrival order, which is then their deadline order. Arming one is
an append and disarming it a flag, with no lock, where the heap took a lock twice per call.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger("nameserver.deadlines")


class Deadline:
    """One pending bound; cancel() once the call finished in time (idempotent)."""

    __slots__ = ("_watch", "_key", "action")

    def __init__(self, watch: DeadlineWatch, key: int, action: Callable[[], object]) -> None:
        self._watch = watch
        self._key = key
        self.action = action

    def cancel(self) -> None:
        self._watch._cancel(self._key)

    def __enter__(self) -> Deadline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cancel()


class DeadlineWatch:
    def __init__(self, name: str = "call-deadlines", clock: Callable[[], float] = time.monotonic) -> None:
        self._name = name
        self._clock = clock
        self._cv = threading.Condition()
        self._heap: list[tuple[float, int]] = []
        self._pending: dict[int, Deadline] = {}
        self._keys = itertools.count()
        self._thread: threading.Thread | None = None
        self.fired = 0
        self.wakeups = 0  # times the watch thread looked at the heap

    def after(self, seconds: float, action: Callable[[], object]) -> Deadline:
        """Run `action` (on the watch thread: it must be quick, like a call's cancel) in `seconds`,
        unless the returned Deadline is cancelled first."""
        with self._cv:
            key = next(self._keys)
            deadline = Deadline(self, key, action)
            self._pending[key] = deadline
            heapq.heappush(self._heap, (self._clock() + seconds, key))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            elif self._heap[0][1] == key:
                # Only a bound earlier than every other changes when the thread must wake. The call guard
                # sets one per gRPC call, all of one length: waking the thread for each cost a GIL hand-off
                # per call (gRPC reads ~25-30 % slower side by side).
                self._cv.notify()
        return deadline

    def pending(self) -> int:
        with self._cv:
            return len(self._pending)

    def _cancel(self, key: int) -> None:
        with self._cv:
            self._pending.pop(key, None)  # its heap slot is skipped when it comes up

    def _due(self) -> list[Deadline]:
        """Under the condition: pop what is due; wait until the next one otherwise."""
        self.wakeups += 1
        now = self._clock()
        due: list[Deadline] = []
        while self._heap and self._heap[0][0] <= now:
            _, key = heapq.heappop(self._heap)
            found = self._pending.pop(key, None)
            if found is not None:
                due.append(found)
        if not due:
            while self._heap and self._heap[0][1] not in self._pending:
                heapq.heappop(self._heap)  # cancelled ones at the top: drop them before sleeping
            self._cv.wait(self._heap[0][0] - now if self._heap else None)
        return due

    def _run(self) -> None:
        while True:
            with self._cv:
                due = self._due()
            for deadline in due:
                self.fired += 1
                try:
                    deadline.action()
                except Exception:  # one failing cancellation must not stop the others
                    log.exception("a deadline's action failed")


class Bound:
    """One armed bound of an EqualBounds; `disarm()` once the wait it bounds is over."""

    __slots__ = ("due", "action", "done")

    def __init__(self, due: float, action: Callable[[], object]) -> None:
        self.due = due
        self.action: Callable[[], object] | None = action
        self.done = False

    def disarm(self) -> None:
        self.done = True
        # Drop the action now, not when the watch thread gets to this bound: the guard's action holds
        # the gRPC call, and grpcio keeps a call's HTTP/2 stream open while its objects live. Held for
        # the watch thread's slack, a busy connection ran out of streams (REFUSED_STREAM).
        self.action = None


class EqualBounds:
    """Bounds all `seconds` long, fired on one thread in arrival order (which is deadline order).

    A bound fires at most `slack` late: the thread looks at least that often, so bounds disarmed at the
    head are dropped even while a long one waits behind them."""

    def __init__(self, seconds: float, name: str = "call-progress", clock: Callable[[], float] = time.monotonic,
                 slack: float = 0.25) -> None:
        self.seconds = seconds
        self._name = name
        self._clock = clock
        self._slack = min(slack, seconds / 4)
        self._armed: collections.deque[Bound] = collections.deque()
        self._start_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.fired = 0

    def arm(self, action: Callable[[], object]) -> Bound:
        """Run `action` (on the watch thread; quick, like a call's cancel) `seconds` from now, unless the
        returned Bound is disarmed first."""
        bound = Bound(self._clock() + self.seconds, action)
        self._armed.append(bound)  # deque.append is atomic: no lock on the call's path
        if self._thread is None:
            with self._start_lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                    self._thread.start()
        # Not woken: it looks every `slack` (a bound is due `seconds` >= 4 slacks away). Woken on each arm
        # that found none armed, it woke once per write on a core whose calls come one at a time.
        return bound

    def armed(self) -> int:
        """Bounds not yet dropped (disarmed ones leave at the watch thread's next look)."""
        return sum(not b.done for b in list(self._armed))

    def _run(self) -> None:
        armed = self._armed
        while True:
            if not armed:
                time.sleep(self._slack)
                continue
            now = self._clock()
            while armed and (armed[0].done or armed[0].due <= now):
                bound = armed.popleft()  # only this thread pops
                if bound.done:
                    continue
                action = bound.action  # None if disarmed since the look above
                bound.done, bound.action = True, None
                if action is None:
                    continue
                self.fired += 1
                try:
                    action()
                except Exception:  # one failing cancellation must not stop the others
                    log.exception("a bound's action failed")
            if armed:
                time.sleep(min(max(armed[0].due - self._clock(), 0.0), self._slack))


__all__ = ["Bound", "Deadline", "DeadlineWatch", "EqualBounds"]
