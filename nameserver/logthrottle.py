"""One log line per interval for a kind of event a remote caller can repeat at will (a refused or
malformed request): without it, one caller repeating a bad request fills the node's disk and buries
every other line. The line after a quiet spell carries `suppressed=N`, the lines of that kind left out
since the last one written.

A kind is a name the code chooses, never a client's value: the table of kinds stays as small as the
number of call sites.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

REPEAT_INTERVAL_S = 10.0  # an operator still sees a new kind of trouble at once, and a flood as 6 lines a minute


class ThrottledLog:
    def __init__(self, logger: logging.Logger, interval_s: float = REPEAT_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.logger = logger
        self.interval_s = interval_s
        self.clock = clock
        self._lock = threading.Lock()
        self._kinds: dict[str, tuple[float, int]] = {}  # kind -> (when last written, left out since)

    def log(self, level: int, kind: str, msg: str, *args: Any, **kwargs: Any) -> bool:
        """Log `msg % args` unless a line of this kind was written less than interval_s ago (then only
        count it). True when written."""
        if not self.logger.isEnabledFor(level):
            return False
        now = self.clock()
        with self._lock:
            last, suppressed = self._kinds.get(kind, (None, 0))
            if last is not None and now - last < self.interval_s:
                self._kinds[kind] = (last, suppressed + 1)
                return False
            self._kinds[kind] = (now, 0)
        if suppressed:
            kwargs["extra"] = {**kwargs.get("extra", {}), "suppressed": suppressed}
        kwargs.setdefault("stacklevel", 2)  # the caller's line, not this helper's
        self.logger.log(level, msg, *args, **kwargs)
        return True

    def warning(self, kind: str, msg: str, *args: Any, **kwargs: Any) -> bool:
        return self.log(logging.WARNING, kind, msg, *args, stacklevel=3, **kwargs)

    def info(self, kind: str, msg: str, *args: Any, **kwargs: Any) -> bool:
        return self.log(logging.INFO, kind, msg, *args, stacklevel=3, **kwargs)
