"""Node-side log archiver: writes the log as Parquet segments (nameserver/logformat/segments.py) as entries commit.

On with `[archive] dir = "..."`. The apply thread only sets an event (O(1), never blocks); a writer
thread reads the applied entries from the node's history ring (bounded by entries and bytes) and cuts
them into segments of `rows_per_segment` records, or every `max_age_s` seconds when entries are waiting.
The ring is the bounded queue: a writer that falls more than the ring behind loses nothing silently: it
logs the gap and goes on after it (fill the gap with `nsctl log export` from a node that still has it).

On start the archiver resumes after the last segment in its directory: no segment is written twice.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from nameserver.logformat.segments import SegmentWriter, covered_ranges
from raftlog.history import AppliedEntry, Compacted

log = logging.getLogger("nameserver.ops.archive")

READ_LIMIT = 2000


class LogArchiver:
    def __init__(self, log: Any, directory: str, rows_per_segment: int = 100_000,
                 max_age_s: float = 60.0) -> None:
        self.log = log  # raftlog's ReplicatedLog facade: subscribe(), history
        self.directory = directory
        self.rows_per_segment = rows_per_segment
        self.max_age_s = max_age_s
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="log-archiver", daemon=True)
        self.writer: SegmentWriter | None = None
        self.gaps: list[tuple[int, int]] = []
        self.error: str | None = None
        self._cursor = 0           # last offset handed to the writer (or skipped over as a gap)
        self._pending_since = 0.0  # monotonic time the oldest unwritten entry arrived
        self._subscription: Any = None

    def start(self) -> None:
        covered = covered_ranges(self.directory)
        last = covered[-1][1] if covered else 0
        self.writer = SegmentWriter(self.directory, last + 1, self.rows_per_segment)
        self._cursor = last
        self._subscription = self.log.subscribe(self._on_entry)
        self._thread.start()
        log.info("archiving the log to %s from offset %d", self.directory, last + 1)

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=30)
        if self._subscription is not None:
            self._subscription.close()

    def _on_entry(self, entry: AppliedEntry) -> None:  # apply thread: O(1), never blocks
        self._wake.set()

    # ---- writer thread -------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(timeout=min(1.0, self.max_age_s))
            self._wake.clear()
            self._step()
        self._step()
        self._flush()

    def _step(self) -> None:
        try:
            self._drain()
            # Record-less entries (barriers, idle no-ops) alone never cut a segment: no dribble of empty files.
            if self.writer is not None and len(self.writer.rows) and \
                    time.monotonic() - self._pending_since >= self.max_age_s:
                self._flush()
        except Exception as exc:  # keep the node up; say so loudly
            self.error = str(exc)
            log.exception("log archiver failed; retrying")

    def _drain(self) -> None:
        assert self.writer is not None
        while True:
            try:
                entries = self.log.history.after(self._cursor, limit=READ_LIMIT)
            except Compacted as exc:
                self._skip_gap(exc.first_kept)
                continue
            if not entries:
                return
            for e in entries:
                if not len(self.writer.rows):
                    self._pending_since = time.monotonic()
                self.writer.add(e.offset, e.term, e.data)
                self._cursor = e.offset
            if len(entries) < READ_LIMIT:
                return

    def _skip_gap(self, first_kept: int) -> None:
        """The ring lost entries we had not written (a snapshot install or a long stall)."""
        assert self.writer is not None
        self._flush()
        gap = (self._cursor + 1, first_kept - 1)
        self.gaps.append(gap)
        log.error("log archive gap: offsets %d..%d are no longer on this node; fill them with "
                  "`nsctl log export --from %d --to %d --out %s`", gap[0], gap[1], gap[0], gap[1], self.directory)
        self._cursor = first_kept - 1
        self.writer.next_first = first_kept

    def _flush(self) -> None:
        if self.writer is not None and self.writer.rows.entries:
            path = self.writer.flush(self._cursor)
            log.info("archived segment %s", path)
