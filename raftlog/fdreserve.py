"""Descriptors held back for the journal: when connections have taken every other descriptor, a
journal write that needs a new file (the term/vote store, compaction) still gets one.

`hold(n)` keeps n descriptors open on /dev/null. `opening(fn)` runs fn; if it fails for want of a
descriptor (EMFILE/ENFILE), the reserve is released, fn runs again, and the reserve is taken back as
descriptors free up. Without this, a flood of connections made the term/vote store fail and the
node exit (issue 11, attack 5).
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from collections.abc import Callable
from typing import TypeVar

log = logging.getLogger("raftlog.fdreserve")
T = TypeVar("T")
_OUT_OF_FDS = (errno.EMFILE, errno.ENFILE)


class FdReserve:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fds: list[int] = []
        self._want = 0

    def hold(self, n: int) -> None:
        """Keep up to `n` descriptors in reserve (process-wide; the largest request wins)."""
        with self._lock:
            self._want = max(self._want, n)
            self._refill()

    @property
    def held(self) -> int:
        return len(self._fds)

    def _refill(self) -> None:
        while len(self._fds) < self._want:
            try:
                self._fds.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
            except OSError:
                return  # descriptors are short right now: refilled on the next call

    def opening(self, fn: Callable[[], T]) -> T:
        """fn(), run again with the reserve released if it ran out of descriptors."""
        try:
            result = fn()
        except OSError as exc:
            if exc.errno not in _OUT_OF_FDS:
                raise
            with self._lock:
                released = len(self._fds)
                for fd in self._fds:
                    os.close(fd)
                self._fds.clear()
            log.warning("out of file descriptors (%s); released %d reserved descriptors for the journal",
                        exc.strerror, released)
            result = fn()
        with self._lock:
            self._refill()
        return result


RESERVE = FdReserve()

__all__ = ["RESERVE", "FdReserve"]
