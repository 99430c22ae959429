"""The leader's budget of registration topics being translated and proposed at once.

A 100,000-topic registration costs the leader a second or more of one interpreter (translation 0.5 s,
its apply 0.7 s; encoding the 5 MiB entry only 10 ms) and every follower the same apply. Four at once
fought the tick thread for the GIL long enough to stall other writes for seconds and to cost an
election. So a registration holds its topic count of a node-wide budget from translation to commit:
the next big one waits its turn (bounded by its call's deadline, then TooLargeError naming
limits.registration_topics_in_flight), while small writes, which take no budget, go on. One
registration bigger than the whole budget still runs, alone.

A registration admitted too late to finish before its caller's deadline would end "outcome unknown"
(and, proposed in parts, half written). So the budget learns what a topic costs (seconds held per
topic, a moving average of the registrations it saw) and stops a waiter's wait while the time left
still covers its expected cost: it is refused, by name, with its outcome known.

And a big registration is proposed in parts (`leading_parts`): no single entry's apply holds the state
for long, and other writes' entries commit between the parts.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

from nameserver.errors import TooLargeError
from nameserver.state import keys
from raftlog.pb import entry_pb2

SETTING = "limits.registration_topics_in_flight"
PART_RECORDS = 10_000  # topic records per entry of a registration proposed in parts (an apply of ~70 ms)


COST_WEIGHT = 0.3  # of the newest registration in the moving average of seconds per topic
COST_MARGIN = 1.5  # a waiter is admitted only while its time left covers this many times its expected cost


class TopicBudget:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.held = 0
        self.seconds_per_topic = 0.0  # learned from the registrations held so far (0: none yet)
        self._cond = threading.Condition()

    def expected_s(self, topics: int) -> float:
        return topics * self.seconds_per_topic

    @contextlib.contextmanager
    def hold(self, topics: int, timeout: float, call_left: float | None = None) -> Iterator[None]:
        """Hold `topics` of the budget (at most all of it) for the block; waits up to `timeout` for room,
        and, given the call's time left (`call_left`), only while that still covers the expected cost."""
        want = min(topics, self.capacity)
        if want <= 0:
            yield
            return
        start = time.monotonic()
        deadline = start + timeout
        if call_left is not None:
            deadline = min(deadline, start + call_left - COST_MARGIN * self.expected_s(topics))
        with self._cond:
            while self.held + want > self.capacity:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TooLargeError(SETTING, f"{self.held} topics of registrations are being written (limit "
                                        f"{self.capacity}); this one of {topics} (expected to take "
                                        f"{self.expected_s(topics):.1f} s) waited {time.monotonic() - start:.1f} s "
                                        "and could no longer finish in its call's time; retry")
                self._cond.wait(left)
            self.held += want
        granted = time.monotonic()
        ok = False
        try:
            yield
            ok = True
        finally:
            self._release(want, topics, granted, ok)

    def _release(self, want: int, topics: int, granted: float, ok: bool) -> None:
        with self._cond:
            self.held -= want
            if ok:  # a failed write's time says nothing of what a topic costs
                cost = (time.monotonic() - granted) / topics
                self.seconds_per_topic = cost if self.seconds_per_topic == 0 else \
                    (1 - COST_WEIGHT) * self.seconds_per_topic + COST_WEIGHT * cost
            self._cond.notify_all()

    def take_now(self, topics: int) -> Callable[[bool], None] | None:
        """`hold` without waiting and without a block, for a write that waits for its commit with no thread
        (NameServerNode.write_later): `topics` of the budget now, or None when there is no room now (then
        `hold`, which waits). Returns `release(ok)`, to call once at the write's end (`ok`: it committed,
        and its time teaches the cost per topic, as `hold`'s block does)."""
        want = min(topics, self.capacity)
        if want <= 0:
            return lambda ok: None
        with self._cond:
            if self.held + want > self.capacity:
                return None
            self.held += want
        granted = time.monotonic()
        return lambda ok: self._release(want, topics, granted, ok)


def leading_parts(batch: entry_pb2.Batch, per_part: int = PART_RECORDS
                  ) -> tuple[list[entry_pb2.Batch], entry_pb2.Batch]:
    """A registration's batch as parts to propose first, in order, and the last part.

    The leading parts hold only topic records, each under all the batch's preconditions; the last holds
    the rest of the topics and every other record (the broker, its liveness, the session). Until that
    last part applies, the keys the translation read (the broker's, its liveness, the session) keep
    their versions, so each part is applied exactly when the whole batch would have been. A part that
    is refused (someone changed one of them) leaves the topics before it written: the caller then
    translates again, and a translation is a diff, so what is already there is not written twice."""
    if len(batch.records) <= per_part:
        return [], batch
    topics = [r for r in batch.records if r.key.startswith(keys.TOPIC_PREFIX)]
    others = [r for r in batch.records if not r.key.startswith(keys.TOPIC_PREFIX)]
    cut = (len(topics) - 1) // per_part * per_part if topics else 0  # the last part keeps 1..per_part topics
    lead = []
    for i in range(0, cut, per_part):
        part = entry_pb2.Batch(records=topics[i:i + per_part])
        part.preconditions.extend(batch.preconditions)
        lead.append(part)
    last = entry_pb2.Batch(request_id=batch.request_id, records=topics[cut:] + others)
    last.preconditions.extend(batch.preconditions)
    return lead, last
