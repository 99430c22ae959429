"""A Raft journal that is on disk before the node acknowledges anything, and never rewritten.

pysyncobj's own FileJournal writes through mmap and never fsyncs, and rewrites itself in place
on compaction, so a power loss can drop acknowledged entries or leave a half-rewritten file.
This journal implements the same interface (pysyncobj.journal.Journal) over append-only segment
files, `<path>.00000001`, `<path>.00000002`, ... (format: raftlog/segment.py), as etcd's WAL:

- Appends go to the newest segment. Once it holds `segment_bytes`, the next append goes to a spare
  that the segment thread created, synced and linked into the directory beforehand, so rolling over
  costs pysyncobj's tick thread no file creation and no fsync.
- Compaction after a snapshot drops entries from memory and hands whole segments that hold only
  compacted entries to the segment thread, which deletes them. Nothing is copied or synced on the
  tick thread (a rewrite with a file and a directory fsync there cost elections under a slow disk:
  docs/faults.md, finding 8).
- A follower's truncation of a conflicting suffix (rare) cuts one segment and deletes the later
  ones, then syncs the directory before it returns, so no dropped entry can come back.

Writes are buffered in the page cache and made durable in one of two ways, each one fdatasync of
every segment appended to since the last one (group commit):

- `sync()`, on the calling thread: a follower calls it before it acknowledges entries or a vote
  (raftlog/binding.py).
- The syncer thread (`start_syncer`), asked by `request_sync()`: the leader never waits for its own
  disk on pysyncobj's tick thread, which also sends the heartbeats (a stalled fsync there cost an
  election per stall, docs/faults.md). `durable_index` says how far the journal is on disk; the
  binding counts the leader towards a commit only up to it, and the syncer wakes the tick when it
  moves. A second thread stores the commit index (two fsyncs) so that it never delays the entries'.

Recovery on open, segment by segment, oldest first:
- Segments that hold only entries before `compacted_to` (the first entry the node's snapshot keeps)
  are leftovers of a compaction whose deletion a crash cut short: they are deleted. Entries before
  it in the first kept segment are skipped. pysyncobj replaces a journal whose first two entries are
  not its snapshot's last two, so this also keeps a crash between a snapshot and its compaction from
  costing the node its whole journal.
- A record cut short or failing its checksum at the end of a segment is a torn write that was never
  synced (so never acknowledged): it is dropped with a warning, with every later segment (a crash
  before the syncer reached this one: their entries were not acknowledged either), and the leader
  sends the entries again. A bad record followed by good ones is corruption of data that was
  acknowledged: opening fails with JournalCorrupt naming the file and offset.

currentTerm and votedFor are written to `<path>.meta` (write, fsync, rename, fsync the
directory) before pysyncobj sends the vote they reflect; the commit index is stored lazily,
as Raft allows (by the meta writer thread, when the syncer runs).

An I/O error while appending (a full disk) stops the process (exit code 74, EX_IOERR), like
etcd's WAL: pysyncobj would retry the tick with the in-memory log already changed, and a node
that cannot persist must not acknowledge.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from pysyncobj.journal import Journal

from raftlog.fdreserve import RESERVE
from raftlog.segment import (
    MAGIC,
    Entry,
    JournalCorrupt,
    ReadSegment,
    Segment,
    encode,
    list_segments,
    read_segment,
    segment_path,
)

log = logging.getLogger("raftlog.journal")

PYSYNCOBJ_MAGIC = b"PYSYNCOBJ"
EXIT_IO_ERROR = 74
SEGMENT_BYTES = 4 << 20  # small next to what a snapshot interval appends: a restart reads little stale data


def fsync_dir(path: str) -> None:
    """Make the directory entry of `path` durable (a created, renamed or deleted name)."""
    fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _io_failed(what: str, path: str, exc: OSError) -> None:
    log.critical("journal %s failed on %s: %s; stopping this node (it cannot persist, so it must not "
                 "acknowledge). Free space or fix the disk, then restart it.", what, path, exc)
    logging.shutdown()
    os._exit(EXIT_IO_ERROR)


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


class DurableJournal(Journal):
    """pysyncobj's Journal interface over fsynced, checksummed, append-only segment files."""

    def __init__(self, path: str, fsync: bool = True, compacted_to: int = 0,
                 segment_bytes: int = SEGMENT_BYTES) -> None:
        self.path = path
        self.fsync = fsync
        self.segment_bytes = segment_bytes
        self.meta_path = path + ".meta"
        self._entries: list[Entry] = []
        self._where: list[tuple[Segment, int]] = []  # the segment and byte offset of each entry's record
        self._segments: list[Segment] = []          # oldest first; appends go to the last
        self._unsynced: list[Segment] = []          # rolled over from since the last sync: sync them too
        self._spare: Segment | None = None          # created ahead by the segment thread
        self._doomed: list[Segment] = []            # compacted away: the segment thread deletes them
        self._next_seq = 1
        self._dirty = False
        self.syncs = 0
        self.meta = self._read_meta()
        self._meta_saved = True
        self._meta_lock = threading.Lock()  # one writer of the .meta file at a time (tick or syncer)
        # The syncer reads the descriptors and the last index under this lock; whoever truncates
        # holds it and bumps the generation, so a sync that overlapped never claims entries that
        # are gone. The segment lists change under it too.
        self._lock = threading.Lock()
        # One condition per thread that waits, all on that lock: the tick's request wakes the
        # syncer alone (one condition for all three woke the other two on every entry, for nothing).
        self._segment_cv = threading.Condition(self._lock)
        self._sync_cv = threading.Condition(self._lock)
        self._meta_cv = threading.Condition(self._lock)
        self._generation = 0
        self._sync_wanted = False
        self._meta_wanted = False
        self._spare_wanted = False
        self._closing = False
        self._threads: list[threading.Thread] = []
        self._on_durable: Callable[[], None] | None = None
        self._convert_single_file()
        self._recover(compacted_to)
        self.durable_index = self._last_index()

    # ---- opening -------------------------------------------------------------------------------

    def _convert_single_file(self) -> None:
        """Journals before segments were one file at `path`: pysyncobj's FileJournal, or ours."""
        _unlink(self.path + ".convert")
        if not os.path.isfile(self.path):
            return
        if list_segments(self.path) or os.path.getsize(self.path) == 0:
            os.unlink(self.path)  # a conversion that finished but for this (or a file never written)
            return
        with open(self.path, "rb") as f:
            head = f.read(len(PYSYNCOBJ_MAGIC))
        if head.startswith(MAGIC):
            os.rename(self.path, segment_path(self.path, 1))  # the same format: it is the first segment
        elif head.startswith(PYSYNCOBJ_MAGIC):
            self._convert_pysyncobj_journal()
        else:
            raise JournalCorrupt(f"{self.path}: not a journal (bad header); move it away and let the node "
                                 "catch up from its peers")
        if self.fsync:
            fsync_dir(self.path)

    def _convert_pysyncobj_journal(self) -> None:
        from pysyncobj.journal import FileJournal

        old = FileJournal(self.path)
        entries = [old[i] for i in range(len(old))]
        self.meta = {"currentTerm": old.getCurrentTerm(), "votedForNodeId": old.getVotedForNodeId(),
                     "raftCommitIndex": old.getRaftCommitIndex()}
        old._destroy()
        tmp = self.path + ".convert"
        with open(tmp, "wb") as f:
            f.write(MAGIC + b"".join(encode(bytes(c), i, t) for c, i, t in entries))
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, segment_path(self.path, 1))
        fsync_dir(self.path)
        self._store_meta()
        os.unlink(self.path)
        log.info("converted %s from pysyncobj's journal format (%d entries)", self.path, len(entries))

    def _recover(self, compacted_to: int) -> None:
        found = [read_segment(seq, p) for seq, p in list_segments(self.path)]
        if found:
            self._next_seq = found[-1].seq + 1
        start = self._first_live(found, compacted_to)
        for stale in found[:start]:
            log.info("journal: deleting %s (entries %d..%d, compacted before the snapshot)", stale.path,
                     stale.first, stale.last)
            _unlink(stale.path)
        kept: list[ReadSegment] = []
        dropped: list[ReadSegment] = []
        last, ended = 0, False
        for got in found[start:]:
            if got.empty_file:
                dropped.append(got)
                continue
            if ended or (got.entries and last and got.first != last + 1):
                if not ended and got.first <= last:
                    raise JournalCorrupt(f"{got.path}: starts at entry {got.first}, but the segment before it "
                                         f"ends at {last}: move the data directory away and let the node "
                                         "rejoin from its peers")
                if got.entries:
                    log.warning("journal %s: dropping entries %d..%d after the end of the log at %d (written "
                                "after a segment that a crash left unsynced: never acknowledged, the leader "
                                "sends them again)", got.path, got.first, got.last, last)
                dropped.append(got)
                ended = True
                continue
            kept.append(got)
            last = got.last or last
            if got.torn:
                log.warning("journal %s: dropping a torn tail of %d bytes at offset %d (an unsynced write "
                            "cut short by a crash; the leader sends those entries again)",
                            got.path, got.size - got.end, got.end)
                os.truncate(got.path, got.end)
                ended = True
        for got in dropped:
            _unlink(got.path)
        # An empty segment is a spare, or a cleared log's first: only the newest one is kept.
        while len(kept) > 1 and not kept[-2].entries:
            _unlink(kept.pop(-2).path)
        if kept and len(kept) > 1 and not kept[-1].entries:
            spare = kept.pop()
            self._spare = Segment(spare.seq, spare.path, os.open(spare.path, os.O_RDWR), spare.end)
        for got in kept:
            seg = Segment(got.seq, got.path, os.open(got.path, os.O_RDWR), got.end)
            if self.fsync and (got.entries or got.torn):
                os.fsync(seg.fd)  # what a crashed process left in the page cache is on disk from here
            self._segments.append(seg)
            self._entries.extend(got.entries)
            self._where.extend((seg, offset) for offset in got.offsets)
        if not self._segments:
            self._segments.append(self._create_segment())
        if (found[:start] or dropped) and self.fsync:
            fsync_dir(self.path)
        skip = sum(1 for entry in self._entries if entry[1] < compacted_to)
        skip = min(skip, len(self._entries) - 1)  # never empty (pysyncobj replaces it then)
        if skip > 0:
            del self._entries[:skip]
            del self._where[:skip]

    @staticmethod
    def _first_live(found: list[ReadSegment], compacted_to: int) -> int:
        """Index in `found` of the first segment holding an entry at or after `compacted_to`."""
        with_entries = [k for k, got in enumerate(found) if got.entries]
        if not with_entries:
            return 0
        for k in with_entries:
            if found[k].last >= compacted_to:
                return k
        return with_entries[-1]  # all older than the snapshot: pysyncobj replaces them; keep the newest

    def _create_segment(self) -> Segment:
        with self._lock:
            seq = self._next_seq
            self._next_seq += 1
        path = segment_path(self.path, seq)

        def create() -> int:
            return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)

        try:
            # Descriptors held in reserve: a flood of connections must not stop the node here.
            fd = RESERVE.opening(create)
            os.pwrite(fd, MAGIC, 0)
            if self.fsync:
                os.fsync(fd)
                RESERVE.opening(lambda: fsync_dir(path))
        except OSError as exc:
            _io_failed("segment creation", path, exc)
        return Segment(seq, path, fd, len(MAGIC))

    # ---- pysyncobj's Journal interface ---------------------------------------------------------

    def add(self, command: bytes, idx: int, term: int) -> None:
        command = bytes(command)
        record = encode(command, idx, term)
        active = self._segments[-1]
        if active.end >= self.segment_bytes:
            active = self._roll(active)
        try:
            os.pwrite(active.fd, record, active.end)
        except OSError as exc:
            _io_failed("append", active.path, exc)
        self._entries.append((command, idx, term))
        self._where.append((active, active.end))
        active.end += len(record)
        self._dirty = True

    def _roll(self, full: Segment) -> Segment:
        """Move appends to the spare segment (created ahead); without one yet, stay on `full`."""
        if self._spare is None and not self._threads:
            self._spare = self._create_segment()  # no segment thread (tests, tools): create it here
        with self._segment_cv:
            spare, self._spare = self._spare, None
            if spare is None:
                self._spare_wanted = True
                self._segment_cv.notify_all()
                return full
            self._segments.append(spare)
            self._unsynced.append(full)
            self._spare_wanted = True
            self._segment_cv.notify_all()
        return spare

    def clear(self) -> None:
        self._truncate(0)

    def __getitem__(self, item: Any) -> Any:
        return self._entries[item]

    def __len__(self) -> int:
        return len(self._entries)

    def deleteEntriesFrom(self, entryFrom: int) -> None:  # noqa: N802 (pysyncobj's name)
        self._truncate(entryFrom)

    def deleteEntriesTo(self, entryTo: int) -> None:  # noqa: N802
        # Compaction after a snapshot: forget entries, delete segments that hold nothing else.
        # Never empty: pysyncobj finishes compacting for an (asynchronous) snapshot of index N even
        # when, meanwhile, a snapshot installed from the leader replaced the log with a shorter one,
        # and an empty log breaks every later tick (seen in a 10-minute load run).
        first = min(entryTo, max(0, len(self._entries) - 1))
        if first <= 0:
            return
        keep_from = self._where[first][0]
        with self._segment_cv:
            cut = self._segments.index(keep_from)
            doomed = self._segments[:cut]
            del self._segments[:cut]
            self._unsynced = [s for s in self._unsynced if s not in doomed]
            del self._entries[:first]
            del self._where[:first]
            self._doomed.extend(doomed)
            self._segment_cv.notify_all()
        if not self._threads:
            self._delete_doomed()

    def _truncate(self, keep: int) -> None:
        if keep >= len(self._entries):
            return
        seg, end = self._where[keep]
        if keep == 0:  # a cleared log starts the first file afresh, without compacted leftovers
            seg, end = self._segments[0], len(MAGIC)
        with self._lock:
            self._generation += 1
            cut = self._segments.index(seg) + 1
            later = self._segments[cut:]
            del self._segments[cut:]
            self._unsynced = [s for s in self._unsynced if s is not seg and s not in later]
            try:
                os.ftruncate(seg.fd, end)
            except OSError as exc:
                _io_failed("truncate", seg.path, exc)
            seg.end = end
            del self._entries[keep:]
            del self._where[keep:]
            self.durable_index = min(self.durable_index, self._last_index())
        for s in later:
            os.close(s.fd)
            _unlink(s.path)
        if (later or keep == 0) and self.fsync:
            # A dropped suffix must not come back; a clear (a snapshot installed from the leader)
            # also makes the new raft.dump's name durable with the log it goes with.
            try:
                RESERVE.opening(lambda: fsync_dir(self.path))
            except OSError as exc:
                _io_failed("truncate", self.path, exc)
        self._dirty = True

    def _last_index(self) -> int:
        return int(self._entries[-1][1]) if self._entries else 0

    def _to_sync(self) -> tuple[list[Segment], list[int]]:
        """Under the lock: the rolled-over segments to sync, and descriptors of them and the active one."""
        sealed = list(self._unsynced)
        if not self.fsync:
            return sealed, []
        return sealed, [os.dup(s.fd) for s in [*sealed, self._segments[-1]]]

    def _fdatasync_all(self, fds: list[int]) -> None:
        try:
            for fd in fds:
                try:
                    os.fdatasync(fd)
                except OSError as exc:
                    _io_failed("fdatasync", self.path, exc)
        finally:
            for fd in fds:
                os.close(fd)
        if fds:
            self.syncs += 1

    def _synced(self, sealed: list[Segment]) -> None:
        """Under the lock: the rolled-over segments `sealed` are on disk (nothing is appended to them)."""
        self._unsynced = [s for s in self._unsynced if s not in sealed]

    def sync(self) -> None:
        """Make every appended entry durable now, on this thread (one fdatasync per segment written)."""
        if not self._dirty:
            return
        self._dirty = False
        target = self._last_index()
        with self._lock:
            sealed, fds = self._to_sync()
        self._fdatasync_all(fds)
        with self._lock:
            self._synced(sealed)
            self.durable_index = max(self.durable_index, target)

    def flush(self) -> None:
        self.sync()

    # ---- the syncer, the meta writer and the segment thread --------------------------------------

    def start_syncer(self, on_durable: Callable[[], None]) -> None:
        """Start the thread that syncs on request (`on_durable()` runs after each sync that moved
        `durable_index`: the binding wakes the tick loop with it), the meta writer, and the thread
        that creates spare segments and deletes compacted ones."""
        self._on_durable = on_durable
        self._threads = [threading.Thread(target=self._sync_loop, name="journal-syncer", daemon=True),
                         threading.Thread(target=self._meta_loop, name="journal-meta", daemon=True),
                         threading.Thread(target=self._segment_loop, name="journal-segments", daemon=True)]
        with self._segment_cv:
            self._spare_wanted = self._spare is None
        for thread in self._threads:
            thread.start()

    @property
    def syncs_in_background(self) -> bool:
        """Whether a syncer thread runs: it calls `on_durable` after every sync that moved `durable_index`."""
        return bool(self._threads)

    def request_sync(self) -> None:
        """Have the syncer make every entry appended so far durable (returns at once; synchronous
        without a syncer)."""
        if not self._threads:
            self.sync()
            return
        if self._last_index() <= self.durable_index:
            return
        with self._sync_cv:
            self._sync_wanted = True
            self._sync_cv.notify()

    def _wait_for(self, cv: threading.Condition, flag: str) -> bool:
        """Wait (holding the lock on return) until `flag` is set or the journal closes; clear it.
        False: closing."""
        while not (self._closing or getattr(self, flag)):
            cv.wait()
        setattr(self, flag, False)
        return not self._closing

    def _sync_loop(self) -> None:
        while True:
            with self._sync_cv:
                if not self._wait_for(self._sync_cv, "_sync_wanted"):
                    return
                generation, target = self._generation, self._last_index()
                sealed, fds = self._to_sync()
            self._fdatasync_all(fds)
            with self._lock:
                self._synced(sealed)
                moved = self._generation == generation and target > self.durable_index
                if moved:
                    self.durable_index = target
            if moved and self._on_durable is not None:
                self._on_durable()

    def _meta_loop(self) -> None:
        # Its own thread: storing the commit index costs two fsyncs, which must not delay the entries'.
        while True:
            with self._meta_cv:
                if not self._wait_for(self._meta_cv, "_meta_wanted"):
                    return
            self._store_meta()

    def _segment_loop(self) -> None:
        while True:
            with self._segment_cv:
                while not (self._closing or self._spare_wanted or self._doomed):
                    self._segment_cv.wait()
                if self._closing:
                    return
                wanted = self._spare_wanted and self._spare is None
                self._spare_wanted = False
            self._delete_doomed()
            if wanted:
                made = self._create_segment()
                with self._lock:
                    taken = self._spare is None and not self._closing
                    if taken:
                        self._spare = made
                if not taken:
                    os.close(made.fd)
                    _unlink(made.path)

    def _delete_doomed(self) -> None:
        # No directory sync: a deletion that a crash undoes leaves a segment of compacted entries,
        # which the next open deletes again (it knows the snapshot's first entry).
        with self._lock:
            doomed, self._doomed = self._doomed, []
        for seg in doomed:
            os.close(seg.fd)
            _unlink(seg.path)

    def _stop_threads(self) -> None:
        with self._segment_cv:
            self._closing = True
            for cv in (self._segment_cv, self._sync_cv, self._meta_cv):
                cv.notify_all()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join()
        self._threads = []

    def _destroy(self) -> None:
        self._stop_threads()
        self._dirty = True  # whatever the syncer had not reached yet
        self.sync()
        if not self._meta_saved:
            self._store_meta()
        self._delete_doomed()
        for seg in [*self._segments, *([self._spare] if self._spare else [])]:
            os.close(seg.fd)
        self._segments, self._spare = [], None

    def close(self) -> None:
        """Sync what was appended, store the term, vote and commit index, and close the files."""
        self._destroy()

    def segment_paths(self) -> list[str]:
        """The segment files that hold the log, oldest first (for tools and tests)."""
        with self._lock:
            return [s.path for s in self._segments]

    def setRaftCommitIndex(self, raftCommitIndex: int) -> None:  # noqa: N802,N803
        self.meta["raftCommitIndex"] = raftCommitIndex
        self._meta_saved = False

    def getRaftCommitIndex(self) -> int:  # noqa: N802
        return int(self.meta.get("raftCommitIndex", 1))

    def setCurrentTerm(self, term: int, votedForNodeId: Any) -> None:  # noqa: N802,N803
        # Raft: the term and vote are durable before any message reflecting them is sent.
        self.meta["currentTerm"] = term
        self.meta["votedForNodeId"] = votedForNodeId
        self._store_meta()

    def getCurrentTerm(self) -> int:  # noqa: N802
        return int(self.meta.get("currentTerm", 0))

    def getVotedForNodeId(self) -> Any:  # noqa: N802
        return self.meta.get("votedForNodeId")

    def onOneSecondTimer(self) -> None:  # noqa: N802
        if self._meta_saved:
            return
        if not self._threads:
            self._store_meta()
            return
        with self._meta_cv:  # the commit index may wait for the meta writer; the tick must not wait for a disk
            self._meta_wanted = True
            self._meta_cv.notify()

    # ---- metadata ------------------------------------------------------------------------------

    def _read_meta(self) -> dict[str, Any]:
        try:
            with open(self.meta_path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return {}
        try:
            return json.loads(raw)
        except ValueError:
            # pysyncobj's own meta file (a pickle), from a data dir older than this journal
            from pysyncobj.journal import MetaStorer

            return MetaStorer(self.meta_path).getMeta()

    def _store_meta(self) -> None:
        tmp = self.meta_path + ".tmp"
        with self._meta_lock:
            self._meta_saved = True  # before the copy: a change made while writing is stored next time
            body = json.dumps(dict(self.meta)).encode()

            def write() -> None:
                with open(tmp, "wb") as f:
                    f.write(body)
                    f.flush()
                    if self.fsync:
                        os.fsync(f.fileno())

            try:
                # Descriptors held in reserve: a flood of connections must not stop the node here.
                RESERVE.opening(write)
                os.replace(tmp, self.meta_path)
                if self.fsync:
                    RESERVE.opening(lambda: fsync_dir(self.meta_path))
            except OSError as exc:
                _io_failed("term/vote store", self.meta_path, exc)


__all__ = ["DurableJournal", "EXIT_IO_ERROR", "JournalCorrupt", "SEGMENT_BYTES", "fsync_dir"]
