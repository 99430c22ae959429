"""A Raft journal that is on disk before the node acknowledges anything.

pysyncobj's own FileJournal writes through mmap and never fsyncs, and rewrites itself in place
on compaction, so a power loss can drop acknowledged entries or leave a half-rewritten file.
This journal implements the same interface (pysyncobj.journal.Journal) over an append-only
file:

    header  b"NSJOURN1"
    record  u32 length | u32 crc32 | u64 index | u64 term | command (length bytes)

Writes are buffered in the page cache and made durable in one of two ways, each one fdatasync for
every entry appended since the last one (group commit):

- `sync()`, on the calling thread: a follower calls it before it acknowledges entries or a vote
  (raftlog/binding.py).
- The syncer thread (`start_syncer`), asked by `request_sync()`: the leader never waits for its own
  disk on pysyncobj's tick thread, which also sends the heartbeats (a stalled fsync there cost an
  election per stall, docs/faults.md). `durable_index` says how far the file is on disk; the binding
  counts the leader towards a commit only up to it, and the syncer wakes the tick when it moves.
  A second thread stores the commit index (two fsyncs) so that it never delays the entries'.

Recovery on open: a record cut short or failing its checksum at the end of the file is a torn
write that was never synced (so never acknowledged): it is dropped with a warning, and the
leader sends the entries again. A bad record followed by good ones is corruption of data that
was acknowledged: opening fails with JournalCorrupt naming the file and offset.

currentTerm and votedFor are written to `<path>.meta` (write, fsync, rename, fsync the
directory) before pysyncobj sends the vote they reflect; the commit index is stored lazily,
as Raft allows (by the meta writer thread, when the syncer runs).

An I/O error while appending (a full disk) stops the process (exit code 74, EX_IOERR), like
etcd's WAL: pysyncobj would retry the tick with the in-memory log already changed, and a node
that cannot persist must not acknowledge.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import threading
import zlib
from collections.abc import Callable
from typing import Any

from pysyncobj.journal import Journal

from raftlog.fdreserve import RESERVE

log = logging.getLogger("raftlog.journal")

MAGIC = b"NSJOURN1"
RECORD = struct.Struct("<IIQQ")  # length, crc32 of the rest, index, term
PYSYNCOBJ_MAGIC = b"PYSYNCOBJ"
EXIT_IO_ERROR = 74


class JournalCorrupt(Exception):
    """The journal holds a damaged record before its end: acknowledged data is unreadable."""


def _crc(index: int, term: int, command: bytes) -> int:
    return zlib.crc32(command, zlib.crc32(struct.pack("<QQ", index, term)))


def _fsync_dir(path: str) -> None:
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


class DurableJournal(Journal):
    """pysyncobj's Journal interface over an fsynced, checksummed, append-only file."""

    def __init__(self, path: str, fsync: bool = True) -> None:
        self.path = path
        self.fsync = fsync
        self.meta_path = path + ".meta"
        self._entries: list[tuple[bytes, int, int]] = []
        self._offsets: list[int] = []  # file offset of each entry's record
        self._dirty = False
        self.syncs = 0
        self.meta = self._read_meta()
        self._meta_saved = True
        self._meta_lock = threading.Lock()  # one writer of the .meta file at a time (tick or syncer)
        # The syncer reads the descriptor and the last index under this lock; whoever truncates or
        # replaces the file holds it and bumps the generation, so a sync that overlapped never
        # claims entries that are gone.
        self._lock = threading.Lock()
        self._wanted = threading.Condition(self._lock)
        self._generation = 0
        self._sync_wanted = False
        self._meta_wanted = False
        self._closing = False
        self._syncer: threading.Thread | None = None
        self._meta_writer: threading.Thread | None = None
        self._on_durable: Callable[[], None] | None = None
        if os.path.exists(path) and _starts_with(path, PYSYNCOBJ_MAGIC):
            self._convert_pysyncobj_journal()
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self._end = self._recover()
        if self.fsync and self._entries:
            os.fsync(self._fd)  # what a crashed process left in the page cache is on disk from here
        self.durable_index = self._last_index()

    # ---- opening -------------------------------------------------------------------------------

    def _recover(self) -> int:
        size = os.fstat(self._fd).st_size
        if size == 0:
            os.pwrite(self._fd, MAGIC, 0)
            os.fsync(self._fd)
            _fsync_dir(self.path)
            return len(MAGIC)
        with open(self.path, "rb") as f:
            data = f.read()
        if not data.startswith(MAGIC):
            raise JournalCorrupt(f"{self.path}: not a journal (bad header); move it away and let the node "
                                 "catch up from its peers")
        pos = len(MAGIC)
        while pos < len(data):
            record = self._parse(data, pos)
            if record is None:
                if self._any_good_record_after(data, pos):
                    raise JournalCorrupt(
                        f"{self.path}: damaged record at byte offset {pos} (entry {len(self._entries) + 1} "
                        f"of the file) followed by intact ones: acknowledged entries are unreadable. "
                        f"Move the data directory away and let the node rejoin from its peers")
                log.warning("journal %s: dropping a torn tail of %d bytes at offset %d (an unsynced write "
                            "cut short by a crash; the leader sends those entries again)",
                            self.path, len(data) - pos, pos)
                os.ftruncate(self._fd, pos)
                os.fsync(self._fd)
                return pos
            command, index, term, end = record
            self._entries.append((command, index, term))
            self._offsets.append(pos)
            pos = end
        return pos

    def _parse(self, data: bytes, pos: int) -> tuple[bytes, int, int, int] | None:
        if pos + RECORD.size > len(data):
            return None
        length, crc, index, term = RECORD.unpack_from(data, pos)
        end = pos + RECORD.size + length
        if end > len(data):
            return None
        command = bytes(data[pos + RECORD.size:end])
        if _crc(index, term, command) != crc:
            return None
        if self._entries and index != self._entries[-1][1] + 1:
            return None
        return command, index, term, end

    def _any_good_record_after(self, data: bytes, bad: int) -> bool:
        """Whether an intact record with a later index starts anywhere after `bad`."""
        last = self._entries[-1][1] if self._entries else 0
        for pos in range(bad + 1, len(data) - RECORD.size + 1):
            length, crc, index, term = RECORD.unpack_from(data, pos)
            if index <= last or pos + RECORD.size + length > len(data):
                continue
            if _crc(index, term, data[pos + RECORD.size:pos + RECORD.size + length]) == crc:
                return True
        return False

    def _convert_pysyncobj_journal(self) -> None:
        """Rewrite a journal written by pysyncobj's FileJournal (data dirs from before this one)."""
        from pysyncobj.journal import FileJournal

        old = FileJournal(self.path)
        entries = [old[i] for i in range(len(old))]
        self.meta = {"currentTerm": old.getCurrentTerm(), "votedForNodeId": old.getVotedForNodeId(),
                     "raftCommitIndex": old.getRaftCommitIndex()}
        old._destroy()
        self._write_file(self.path, entries)
        self._store_meta()
        log.info("converted %s from pysyncobj's journal format (%d entries)", self.path, len(entries))

    # ---- pysyncobj's Journal interface ---------------------------------------------------------

    def add(self, command: bytes, idx: int, term: int) -> None:
        command = bytes(command)
        record = RECORD.pack(len(command), _crc(idx, term, command), idx, term) + command
        try:
            os.pwrite(self._fd, record, self._end)
        except OSError as exc:
            _io_failed("append", self.path, exc)
        self._entries.append((command, idx, term))
        self._offsets.append(self._end)
        self._end += len(record)
        self._dirty = True

    def clear(self) -> None:
        self._truncate(0)

    def __getitem__(self, item: Any) -> Any:
        return self._entries[item]

    def __len__(self) -> int:
        return len(self._entries)

    def deleteEntriesFrom(self, entryFrom: int) -> None:  # noqa: N802 (pysyncobj's name)
        self._truncate(entryFrom)

    def deleteEntriesTo(self, entryTo: int) -> None:  # noqa: N802
        # Compaction after a snapshot: write the kept entries to a new file and rename it over,
        # so a crash leaves either the old journal or the new one, never half of each.
        # Never empty: pysyncobj finishes compacting for an (asynchronous) snapshot of index N even
        # when, meanwhile, a snapshot installed from the leader replaced the log with a shorter one,
        # and an empty log breaks every later tick (seen in a 10-minute load run).
        kept = self._entries[min(entryTo, max(0, len(self._entries) - 1)):]
        tmp = self.path + ".compact"
        try:
            offsets = RESERVE.opening(lambda: self._write_file(tmp, kept))
            with self._lock:
                self._generation += 1
                os.close(self._fd)
                os.replace(tmp, self.path)
                self._fd = RESERVE.opening(lambda: os.open(self.path, os.O_RDWR))
                self._entries = kept
                self._offsets = offsets
                self.durable_index = self._last_index()  # _write_file synced every kept entry
            RESERVE.opening(lambda: _fsync_dir(self.path))
        except OSError as exc:
            _io_failed("compaction", self.path, exc)
        self._end = os.fstat(self._fd).st_size
        self._dirty = False

    def _truncate(self, keep: int) -> None:
        end = self._offsets[keep] if keep < len(self._offsets) else self._end
        with self._lock:
            self._generation += 1
            try:
                os.ftruncate(self._fd, end)
            except OSError as exc:
                _io_failed("truncate", self.path, exc)
            del self._entries[keep:]
            del self._offsets[keep:]
            self.durable_index = min(self.durable_index, self._last_index())
        self._end = end
        self._dirty = True

    def _write_file(self, path: str, entries: list[tuple[bytes, int, int]]) -> list[int]:
        offsets, chunks, pos = [], [MAGIC], len(MAGIC)
        for command, idx, term in entries:
            command = bytes(command)
            offsets.append(pos)
            chunks.append(RECORD.pack(len(command), _crc(idx, term, command), idx, term) + command)
            pos += len(chunks[-1])
        with open(path, "wb") as f:
            f.write(b"".join(chunks))
            f.flush()
            os.fsync(f.fileno())
        return offsets

    def _last_index(self) -> int:
        return int(self._entries[-1][1]) if self._entries else 0

    def sync(self) -> None:
        """Make every appended entry durable now, on this thread (one fdatasync for all of them)."""
        if not self._dirty:
            return
        self._dirty = False
        target = self._last_index()
        if self.fsync:
            try:
                os.fdatasync(self._fd)
            except OSError as exc:
                _io_failed("fdatasync", self.path, exc)
            self.syncs += 1
        with self._lock:
            self.durable_index = max(self.durable_index, target)

    def flush(self) -> None:
        self.sync()

    # ---- the syncer --------------------------------------------------------------------------------

    def start_syncer(self, on_durable: Callable[[], None]) -> None:
        """Start the thread that syncs on request; `on_durable()` runs after each sync that moved
        `durable_index` (the binding wakes the tick loop with it)."""
        self._on_durable = on_durable
        self._syncer = threading.Thread(target=self._sync_loop, name="journal-syncer", daemon=True)
        self._meta_writer = threading.Thread(target=self._meta_loop, name="journal-meta", daemon=True)
        self._syncer.start()
        self._meta_writer.start()

    def request_sync(self) -> None:
        """Have the syncer make every entry appended so far durable (returns at once; synchronous
        without a syncer)."""
        if self._syncer is None:
            self.sync()
            return
        if self._last_index() <= self.durable_index:
            return
        with self._wanted:
            self._sync_wanted = True
            self._wanted.notify_all()

    def _wait_for(self, flag: str) -> bool:
        """Wait (holding the lock on return) until `flag` is set or the journal closes; clear it.
        False: closing."""
        while not (self._closing or getattr(self, flag)):
            self._wanted.wait()
        setattr(self, flag, False)
        return not self._closing

    def _sync_loop(self) -> None:
        while True:
            with self._wanted:
                if not self._wait_for("_sync_wanted"):
                    return
                generation, target = self._generation, self._last_index()
                fd = os.dup(self._fd) if self.fsync else -1
            if fd >= 0:
                try:
                    os.fdatasync(fd)
                except OSError as exc:
                    _io_failed("fdatasync", self.path, exc)
                finally:
                    os.close(fd)
                self.syncs += 1
            with self._lock:
                moved = self._generation == generation and target > self.durable_index
                if moved:
                    self.durable_index = target
            if moved and self._on_durable is not None:
                self._on_durable()

    def _meta_loop(self) -> None:
        # Its own thread: storing the commit index costs two fsyncs, which must not delay the entries'.
        while True:
            with self._wanted:
                if not self._wait_for("_meta_wanted"):
                    return
            self._store_meta()

    def _stop_syncer(self) -> None:
        if self._syncer is None:
            return
        with self._wanted:
            self._closing = True
            self._wanted.notify_all()
        for thread in (self._syncer, self._meta_writer):
            if thread is not None and thread is not threading.current_thread():
                thread.join()
        self._syncer = self._meta_writer = None

    def _destroy(self) -> None:
        self._stop_syncer()
        self._dirty = True  # whatever the syncer had not reached yet
        self.sync()
        if not self._meta_saved:
            self._store_meta()
        os.close(self._fd)

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
        if self._syncer is None:
            self._store_meta()
            return
        with self._wanted:  # the commit index may wait for the meta writer; the tick must not wait for a disk
            self._meta_wanted = True
            self._wanted.notify_all()

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
                    RESERVE.opening(lambda: _fsync_dir(self.meta_path))
            except OSError as exc:
                _io_failed("term/vote store", self.meta_path, exc)


def _starts_with(path: str, prefix: bytes) -> bool:
    with open(path, "rb") as f:
        return f.read(len(prefix)) == prefix


__all__ = ["DurableJournal", "EXIT_IO_ERROR", "JournalCorrupt"]
