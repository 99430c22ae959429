"""Watch: changes pushed to subscribers as they are applied, filtered by key prefix.

The apply thread hands each applied entry to the hub (cheap: a prefix filter and a bounded queue
put per watcher). A watcher that falls behind by more than its queue is cut off with a clear status
rather than growing memory; it resumes from the last offset it saw. Resuming replays the node's
entry history (raftlog.history) and then the live feed, de-duplicated by offset, so a resumed
watcher sees every change exactly once, in order.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable

from nameserver.pb import api_pb2
from raftlog.history import AppliedEntry, EntryHistory
from raftlog.kvstate import ChangeTuple


def to_events(changes: Iterable[ChangeTuple], prefixes: tuple[str, ...]) -> list[api_pb2.WatchEvent]:
    """The changes under `prefixes` as watch events (a change read by position: raftlog/kvstate.py Change)."""
    return [api_pb2.WatchEvent(type=rtype, deleted=new is None, key=key, value=new or b"", version=offset)
            for offset, rtype, key, _old, new in changes if key.startswith(prefixes)]


def resumable(history: EntryHistory, start_offset: int, margin: int = 0) -> bool:
    """Whether a watch from `start_offset` (0: from now) replays from `history` without a Compacted, with
    `margin` entries to spare while the ring drops its oldest (it may move past them before the replay starts)."""
    return start_offset == 0 or start_offset >= history.first_kept - 1 + (margin if history.evicting else 0)


class Watcher:
    def __init__(self, prefixes: tuple[str, ...], max_pending: int) -> None:
        self.prefixes = prefixes
        self.pending: queue.Queue[api_pb2.WatchResponse] = queue.Queue(maxsize=max_pending)
        self.overflowed = False
        self.reset_at: int | None = None  # the node loaded a snapshot at this offset: the feed has a hole

    @property
    def cut_off(self) -> bool:
        """No more entries will come: the stream ends once the queue is drained, telling the client
        where to resume."""
        return self.overflowed or self.reset_at is not None

    def offer(self, entry: AppliedEntry) -> bool:
        """Apply thread: queue this entry's matching changes; False when the watcher overflowed."""
        events = to_events(entry.changes, self.prefixes)
        if not events:
            return True
        try:
            self.pending.put_nowait(api_pb2.WatchResponse(offset=entry.offset, events=events))
            return True
        except queue.Full:
            self.overflowed = True
            return False


class WatchHub:
    def __init__(self, max_watchers: int = 32, max_pending: int = 10_000) -> None:
        self.max_watchers = max_watchers
        self.max_pending = max_pending
        self._lock = threading.Lock()
        self._watchers: list[Watcher] = []
        self.cut_off_total = 0

    def subscribe(self, prefixes: tuple[str, ...]) -> Watcher | None:
        """A new watcher buffering from now on; None when the node has too many."""
        with self._lock:
            if len(self._watchers) >= self.max_watchers:
                return None
            w = Watcher(prefixes, self.max_pending)
            self._watchers = self._watchers + [w]  # copy-on-write: the apply thread iterates lock-free
            return w

    def unsubscribe(self, w: Watcher) -> None:
        with self._lock:
            self._watchers = [x for x in self._watchers if x is not w]

    def __len__(self) -> int:
        return len(self._watchers)

    def on_reset(self, offset: int) -> None:
        """Apply thread: a snapshot replaced the state. Every watcher is cut off: what it was owed up to
        `offset` never passed through here, so it must resume (elsewhere, or re-list)."""
        with self._lock:
            cut, self._watchers = self._watchers, []
        for w in cut:
            w.reset_at = offset
        self.cut_off_total += len(cut)

    def on_entry(self, entry: AppliedEntry) -> None:
        if not entry.changes or not self._watchers:  # most entries of most replicas: nobody watches
            return
        dropped = [w for w in self._watchers if not w.offer(entry)]
        if dropped:
            self.cut_off_total += len(dropped)
            with self._lock:
                self._watchers = [x for x in self._watchers if x not in dropped]
