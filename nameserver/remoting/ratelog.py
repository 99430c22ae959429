"""Log lines an outsider can cause, bounded: each argument cut short, and a few lines per interval.

A bad frame is one client's doing, and a client can send them as fast as it can reconnect: written
whole and every time, they would fill the node's disk (a frame may be 16 MiB). The lines past the burst
are counted, and the next line written says how many were left out.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from nameserver.logthrottle import Windows

MAX_ARG_CHARS = 200


def cut(value: object, limit: int = MAX_ARG_CHARS) -> object:
    """Strings longer than `limit` shortened (with their length said); other values as they are."""
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]}... ({len(value)} characters)"
    return value


class RateLimitedLog:
    """At most `burst` lines per `every_s` seconds through `logger` (the counting is logthrottle's)."""

    def __init__(self, logger: logging.Logger, every_s: float = 10.0, burst: int = 5,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.logger = logger
        self._windows = Windows(burst, every_s, clock)

    @property
    def suppressed(self) -> int:
        """Lines left out since the last one written."""
        return self._windows.held(None)

    def log(self, level: int, msg: str, *args: object) -> bool:
        """Write the line unless this interval's burst is spent; True when written."""
        if not self.logger.isEnabledFor(level):
            return False
        left_out = self._windows.admit(None)
        if left_out is None:
            return False
        if left_out:
            msg += f" ({left_out} more such lines left out since the last one)"
        self.logger.log(level, msg, *(cut(a) for a in args))
        return True

    def warning(self, msg: str, *args: object) -> bool:
        return self.log(logging.WARNING, msg, *args)

    def info(self, msg: str, *args: object) -> bool:
        return self.log(logging.INFO, msg, *args)
