"""The recent applied entries, in memory: what ReadLog serves and what a resuming watcher replays.

Bounded by entry count and bytes; asking for an offset older than what is kept raises Compacted
(the watch and export layers turn that into a "compacted, re-list" error).
"""

from __future__ import annotations

import bisect
import threading
from collections import deque
from dataclasses import dataclass

from raftlog.kvstate import ChangeTuple


class Compacted(Exception):
    def __init__(self, requested: int, first_kept: int) -> None:
        super().__init__(f"offset {requested} is no longer kept here (oldest kept: {first_kept})")
        self.requested = requested
        self.first_kept = first_kept


@dataclass(frozen=True, slots=True)
class AppliedEntry:
    offset: int
    term: int
    data: bytes                 # the Entry bytes as replicated
    changes: tuple[ChangeTuple, ...]  # what applying it changed, (offset, type, key, old, new) each (kvstate.Change)


# What one Change costs in memory beyond the entry's bytes: ~90 bytes of object (tracemalloc) plus
# the key and value copies it keeps alive once the state has moved on. Counting only the entry
# bytes let a million-record history hold ~100-200 MB beyond its budget.
CHANGE_OVERHEAD_BYTES = 200


def _cost(item: AppliedEntry) -> int:
    return len(item.data) + CHANGE_OVERHEAD_BYTES * len(item.changes)


class EntryHistory:
    def __init__(self, max_entries: int = 100_000, max_bytes: int = 128 << 20) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._entries: deque[AppliedEntry] = deque()
        self._offsets: deque[int] = deque()
        self._bytes = 0
        # Nothing older than this can be served: a restart or a snapshot install starts it afresh.
        self._floor = 0
        self.evicting = False  # the bounds are reached: each append moves the floor

    def append(self, item: AppliedEntry) -> None:
        with self._lock:
            self._entries.append(item)
            self._offsets.append(item.offset)
            self._bytes += _cost(item)
            while self._entries and (len(self._entries) > self.max_entries or self._bytes > self.max_bytes):
                old = self._entries.popleft()
                self._offsets.popleft()
                self._bytes -= _cost(old)
                self._floor = old.offset
                self.evicting = True

    def reset(self, offset: int) -> None:
        """The state jumped to `offset` (snapshot restore): no history before it is known."""
        with self._lock:
            self._entries.clear()
            self._offsets.clear()
            self._bytes = 0
            self._floor = offset
            self.evicting = False

    def after(self, offset: int, limit: int = 1000, upto: int | None = None) -> list[AppliedEntry]:
        """Entries with offset > `offset` (and <= `upto`), oldest first; Compacted if there is a gap."""
        with self._lock:
            if offset < self._floor:
                raise Compacted(offset + 1, self._floor + 1)
            i = bisect.bisect_right(self._offsets, offset)
            out: list[AppliedEntry] = []
            while i < len(self._entries) and len(out) < limit:
                e = self._entries[i]
                if upto is not None and e.offset > upto:
                    break
                out.append(e)
                i += 1
            return out

    @property
    def first_kept(self) -> int:
        with self._lock:
            return self._floor + 1
