"""A Raft journal that is on disk before the node acknowledges anything.

pysyncobj's own FileJournal writes through mmap and never fsyncs, and rewrites itself in place
on compaction, so a power loss can drop acknowledged entries or leave a half-rewritten file.
This journal implements the same interface (pysyncobj.journal.Journal) over an append-only
file:

    header  b"NSJOURN1"
    record  u32 length | u32 crc32 | u64 index | u64 term | command (length bytes)

Writes are buffered in the page cache and made durable by `sync()`, which the binding calls
before any Raft message leaves the node and at the end of every tick (raftlog/binding.py). So
one fdatasync covers every entry appended since the last one: group commit.

Recovery on open: a record cut short or failing its checksum at the end of the file is a torn
write that was never synced (so never acknowledged): it is dropped with a warning, and the
leader sends the entries again. A bad record followed by good ones is corruption of data that
was acknowledged: opening fails with JournalCorrupt naming the file and offset.

currentTerm and votedFor are written to `<path>.meta` (write, fsync, rename, fsync the
directory) before pysyncobj sends the vote they reflect; the commit index is stored lazily,
as Raft allows.

An I/O error while appending (a full disk) stops the process (exit code 74, EX_IOERR), like
etcd's WAL: pysyncobj would retry the tick with the in-memory log already changed, and a node
that cannot persist must not acknowledge.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import zlib
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
        if os.path.exists(path) and _starts_with(path, PYSYNCOBJ_MAGIC):
            self._convert_pysyncobj_journal()
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self._end = self._recover()

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
            os.close(self._fd)
            os.replace(tmp, self.path)
            RESERVE.opening(lambda: _fsync_dir(self.path))
            self._fd = RESERVE.opening(lambda: os.open(self.path, os.O_RDWR))
        except OSError as exc:
            _io_failed("compaction", self.path, exc)
        self._entries = kept
        self._offsets = offsets
        self._end = os.fstat(self._fd).st_size
        self._dirty = False

    def _truncate(self, keep: int) -> None:
        end = self._offsets[keep] if keep < len(self._offsets) else self._end
        try:
            os.ftruncate(self._fd, end)
        except OSError as exc:
            _io_failed("truncate", self.path, exc)
        del self._entries[keep:]
        del self._offsets[keep:]
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

    def sync(self) -> None:
        """Make every appended entry durable (one fdatasync for all of them)."""
        if not self._dirty:
            return
        self._dirty = False
        if not self.fsync:
            return
        try:
            os.fdatasync(self._fd)
        except OSError as exc:
            _io_failed("fdatasync", self.path, exc)
        self.syncs += 1

    def flush(self) -> None:
        self.sync()

    def _destroy(self) -> None:
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
        if not self._meta_saved:
            self._store_meta()

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

        def write() -> None:
            with open(tmp, "wb") as f:
                f.write(json.dumps(self.meta).encode())
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
        self._meta_saved = True


def _starts_with(path: str, prefix: bytes) -> bool:
    with open(path, "rb") as f:
        return f.read(len(prefix)) == prefix


__all__ = ["DurableJournal", "EXIT_IO_ERROR", "JournalCorrupt"]
