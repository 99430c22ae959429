"""The leader's read lease and commit index on a shared page, for the node's worker processes (issue 27).

Under its lease (raftlog/leadership.py) the leader answers a read index from its commit index at once; its
workers asked for it over the write channel, a round trip through two more threads per read. Here the core's
Raft tick thread, the one writer, keeps on a small file that its workers map read-only:

- `commit`: the commit index, written by the commit index's setter (raftlog/binding.py) the moment it moves,
  before any entry up to it is applied (so before any write up to it is acknowledged, by this node or any:
  a follower applies, and so acknowledges, only what the leader said it committed);
- `until`: time.monotonic() up to which the node may read under its lease: the lease's end while the node
  leads in the lease's term and has not given the lease up, 0 otherwise; written when the lease moves, when
  the leader gives it up (before it sends TimeoutNow, as leadership.give_up_lease) and each tick pass (a node
  that stepped down or moved to another term: 0).

A worker's LINEARIZABLE read, after it arrived, reads `until`, then `commit`: with time.monotonic() (one clock
for every process of the machine: CLOCK_MONOTONIC) below `until`, `commit` is a read index for it, as the
core's own leased index would be. Why that holds: no other leader can exist before `until` (the promises the
lease rests on; a transfer's vote only after the leader gave the lease up, which writes 0 first), so every
write acknowledged before the read was committed by this leader, with its index at most the commit index at
its acknowledgement; and that commit was written to the page before the acknowledgement went out (the setter
runs before the apply), and the acknowledgement reached its client and the read reached the worker through
sockets after that: the page's newer value is what the worker reads. A step down inside a tick pass leaves
`until` as it was to the end of that pass: still no other leader before it.

The page: a sequence number (odd while a write is under way), `until` (a double), `commit` (a 64-bit int),
each 8 bytes at an 8-byte offset in native byte order, so each is one aligned store and load on x86-64; the
reader takes a value only with the same even sequence number before and after (a seqlock). Only x86-64 reads
it (its stores and loads are seen in program order): elsewhere `LeaseView` says nothing, and every read asks
the core as before.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import platform
import struct
import time
from collections.abc import Callable

_SEQ = struct.Struct("Q")       # native: one 8-byte store, aligned (mmap pages are)
_FIELDS = struct.Struct("dq")   # until at 8, commit at 16
SIZE = 32
ORDERED_STORES = platform.machine().lower() in ("x86_64", "amd64")


class LeaseBoard:
    """The writer: the core's Raft tick thread alone calls publish and commit (one writer: the seqlock)."""

    def __init__(self, path: str) -> None:
        """A fresh page at `path` (0600): no lease (a stale one of an earlier core is replaced, never reused:
        written to a new file and renamed over it)."""
        folder = os.path.dirname(path)
        os.makedirs(folder, mode=0o700, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, bytes(SIZE))
            self._page = mmap.mmap(fd, SIZE)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        self.path = path
        self._seq = 0
        self._until = 0.0
        self._commit = 0

    def publish(self, until: float) -> None:
        """The lease's end (0: none), when it changed."""
        if until != self._until:
            self._write(until, self._commit)

    def commit(self, index: int) -> None:
        """The commit index, when it changed."""
        if index != self._commit:
            self._write(self._until, index)

    def _write(self, until: float, commit: int) -> None:
        page, seq = self._page, self._seq
        _SEQ.pack_into(page, 0, seq + 1)
        _FIELDS.pack_into(page, 8, until, commit)
        _SEQ.pack_into(page, 0, seq + 2)
        self._seq, self._until, self._commit = seq + 2, until, commit

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._page.close()


class LeaseView:
    """A worker's reader of its core's LeaseBoard (any thread)."""

    REOPEN_S = 1.0  # a page not there yet is looked for again this often

    def __init__(self, path: str, clock: Callable[[], float] = time.monotonic) -> None:
        """Maps `path` read-only (when it is not there yet: at a later index(), REOPEN_S apart); not on
        a machine other than x86-64: `index()` is then always None."""
        self.path = path
        self.clock = clock
        self._page: mmap.mmap | None = None
        self._reopen_at = 0.0 if ORDERED_STORES else float("inf")
        self.reads = 0  # indexes it gave

    def _open(self) -> mmap.mmap | None:
        self._reopen_at = self.clock() + self.REOPEN_S
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:
            return None
        try:
            self._page = mmap.mmap(fd, SIZE, prot=mmap.PROT_READ)
        except (OSError, ValueError):
            return None
        finally:
            os.close(fd)
        return self._page

    def index(self) -> int | None:
        """The leader core's commit index while it holds its lease now, read after this call began; None
        without one (not the leader, no lease, a write under way: ask the core)."""
        page = self._page
        if page is None and (self.clock() < self._reopen_at or (page := self._open()) is None):
            return None
        before = _SEQ.unpack_from(page, 0)[0]
        if before & 1:
            return None
        until, commit = _FIELDS.unpack_from(page, 8)
        if _SEQ.unpack_from(page, 0)[0] != before or self.clock() >= until:
            return None
        self.reads += 1
        return int(commit)

    def close(self) -> None:
        if self._page is not None:
            with contextlib.suppress(OSError, ValueError):
                self._page.close()


__all__ = ["ORDERED_STORES", "LeaseBoard", "LeaseView"]
