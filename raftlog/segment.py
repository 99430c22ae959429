"""One file of the Raft journal (raftlog/journal.py): its format, its name, and reading it back.

    header  b"NSJOURN1"
    record  u32 length | u32 crc32 of the rest | u64 index | u64 term | command (length bytes)

The journal is a sequence of such files, `<journal path>.<seq>` with an 8-digit sequence number,
like etcd's WAL segments: appends go to the newest, compaction deletes whole old ones, so nothing
is ever rewritten. Within a file, indexes follow each other by one.
"""

from __future__ import annotations

import os
import re
import struct
import zlib
from dataclasses import dataclass, field

MAGIC = b"NSJOURN1"
RECORD = struct.Struct("<IIQQ")  # length, crc32 of the rest, index, term
_NAME = re.compile(r"\.(\d{8})$")

Entry = tuple[bytes, int, int]  # (command, index, term): pysyncobj's log entry


class JournalCorrupt(Exception):
    """The journal holds a damaged record before its end: acknowledged data is unreadable."""


def crc(index: int, term: int, command: bytes) -> int:
    return zlib.crc32(command, zlib.crc32(struct.pack("<QQ", index, term)))


def encode(command: bytes, index: int, term: int) -> bytes:
    return RECORD.pack(len(command), crc(index, term, command), index, term) + command


def segment_path(base: str, seq: int) -> str:
    return f"{base}.{seq:08d}"


def list_segments(base: str) -> list[tuple[int, str]]:
    """(seq, path) of every segment file of the journal at `base`, oldest first."""
    directory, prefix = os.path.split(os.path.abspath(base))
    found = []
    for name in os.listdir(directory):
        if name.startswith(prefix + "."):
            m = _NAME.search(name)
            if m and name == f"{prefix}.{m.group(1)}":
                found.append((int(m.group(1)), os.path.join(directory, name)))
    return sorted(found)


@dataclass(eq=False)
class Segment:
    """An open segment file: `end` is where the next record goes."""

    seq: int
    path: str
    fd: int
    end: int


@dataclass
class ReadSegment:
    """What a segment file holds: its intact records and, when its last record was cut short, where."""

    seq: int
    path: str
    entries: list[Entry] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)  # byte offset of each entry's record
    end: int = len(MAGIC)                              # end of the last intact record
    size: int = 0                                      # bytes in the file
    empty_file: bool = False                           # created but its header never written

    @property
    def torn(self) -> bool:
        return self.end < self.size

    @property
    def first(self) -> int:
        return self.entries[0][1] if self.entries else 0

    @property
    def last(self) -> int:
        return self.entries[-1][1] if self.entries else 0


def read_segment(seq: int, path: str) -> ReadSegment:
    """Parse one segment. A damaged record followed by intact ones raises JournalCorrupt naming the
    file and byte offset; a damaged last record is a torn tail (`torn`, `end` where it starts)."""
    with open(path, "rb") as f:
        data = f.read()
    got = ReadSegment(seq, path, size=len(data))
    if len(data) < len(MAGIC) and MAGIC.startswith(data):
        got.empty_file, got.end = True, len(data)  # a spare whose header a crash cut short
        return got
    if not data.startswith(MAGIC):
        raise JournalCorrupt(f"{path}: not a journal segment (bad header); move the data directory away and "
                             "let the node catch up from its peers")
    pos = len(MAGIC)
    while pos < len(data):
        record = _parse(data, pos, got.last)
        if record is None:
            if _any_good_record_after(data, pos, got.last):
                raise JournalCorrupt(
                    f"{path}: damaged record at byte offset {pos} (entry {len(got.entries) + 1} of the file) "
                    "followed by intact ones: acknowledged entries are unreadable. Move the data directory "
                    "away and let the node rejoin from its peers")
            break
        command, index, term, end = record
        got.entries.append((command, index, term))
        got.offsets.append(pos)
        pos = end
    got.end = pos
    return got


def _parse(data: bytes, pos: int, previous: int) -> tuple[bytes, int, int, int] | None:
    if pos + RECORD.size > len(data):
        return None
    length, checksum, index, term = RECORD.unpack_from(data, pos)
    end = pos + RECORD.size + length
    if end > len(data):
        return None
    command = bytes(data[pos + RECORD.size:end])
    if crc(index, term, command) != checksum:
        return None
    if previous and index != previous + 1:
        return None
    return command, index, term, end


def _any_good_record_after(data: bytes, bad: int, last: int) -> bool:
    """Whether an intact record with a later index starts anywhere after `bad`."""
    for pos in range(bad + 1, len(data) - RECORD.size + 1):
        length, checksum, index, term = RECORD.unpack_from(data, pos)
        if index <= last or pos + RECORD.size + length > len(data):
            continue
        if crc(index, term, data[pos + RECORD.size:pos + RECORD.size + length]) == checksum:
            return True
    return False


__all__ = ["MAGIC", "RECORD", "Entry", "JournalCorrupt", "ReadSegment", "Segment", "crc", "encode",
           "list_segments", "read_segment", "segment_path"]
