"""The leader's budget of registration topics being translated and proposed at once.

A 100,000-topic registration costs the leader a second or more of one interpreter (translation, the
entry's encoding, its apply) and every follower the same apply. Four at once fought the tick thread
for the GIL long enough to stall other writes for seconds and to cost an election. So a registration
holds its topic count of a node-wide budget from translation to commit: the next big one waits its
turn (bounded by its call's deadline, then TooLargeError naming limits.registration_topics_in_flight),
while small writes, which take no budget, go on. One registration bigger than the whole budget still
runs, alone.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

from nameserver.errors import TooLargeError

SETTING = "limits.registration_topics_in_flight"


class TopicBudget:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.held = 0
        self._cond = threading.Condition()

    @contextlib.contextmanager
    def hold(self, topics: int, timeout: float) -> Iterator[None]:
        """Hold `topics` of the budget (at most all of it) for the block; waits up to `timeout` for room."""
        want = min(topics, self.capacity)
        if want <= 0:
            yield
            return
        deadline = time.monotonic() + timeout
        with self._cond:
            while self.held + want > self.capacity:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TooLargeError(SETTING, f"{self.held} topics of registrations are being written (limit "
                                        f"{self.capacity}); this one of {topics} waited {timeout:.1f} s; retry")
                self._cond.wait(left)
            self.held += want
        try:
            yield
        finally:
            with self._cond:
                self.held -= want
                self._cond.notify_all()
