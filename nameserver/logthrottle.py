"""Bounded logging of what a remote caller can repeat at will (a refused or malformed request): without
a bound, one caller repeating a bad request fills the node's disk and buries every other line. The line
after a held-back spell carries `suppressed=N`, the lines of its kind left out since the last one.

Two users of one count (`Windows`):
- `ThrottledLog`, at a call site that logs a refusal: one line per kind per interval. A kind is a name
  the code chooses, never a client's value.
- `RepeatFilter`, on the node's log handler (nameserver/ops/logfmt.py), for every logger of the process,
  call sites that forgot included: at most REPEAT_BURST lines per interval of one logger and message
  template. Lines with an `event` field (counted by operators) and CRITICAL lines always pass.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

REPEAT_INTERVAL_S = 10.0  # an operator still sees a new kind of trouble at once, and a flood as 6 lines a minute
REPEAT_BURST = 20         # the filter's lines of one template per interval: a burst of distinct events still shows
MAX_KINDS = 1024          # kinds counted at once; past it, new kinds share one count


@dataclass(slots=True)
class _Window:
    start: float   # when the current interval began
    passed: int    # lines let through in it
    held: int      # lines held back since the last one let through


class Windows:
    """Per kind: how many passed in the current interval, and how many were held back since one passed."""

    def __init__(self, burst: int = 1, interval_s: float = REPEAT_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic, max_kinds: int = MAX_KINDS) -> None:
        self.burst, self.interval_s, self.clock, self.max_kinds = burst, interval_s, clock, max_kinds
        self._lock = threading.Lock()
        self._kinds: dict[Hashable, _Window] = {}

    def admit(self, kind: Hashable) -> int | None:
        """None: hold this one back (it is counted). Else let it pass; the number is how many of its kind
        were held back before it."""
        now = self.clock()
        with self._lock:
            window = self._kinds.get(kind)
            if window is None:
                if len(self._kinds) >= self.max_kinds:
                    self._forget_quiet(now)
                    kind = kind if len(self._kinds) < self.max_kinds else "(too many kinds)"
                window = self._kinds.setdefault(kind, _Window(now, 0, 0))
            if now - window.start >= self.interval_s:
                window.start, window.passed = now, 0
            if window.passed >= self.burst:
                window.held += 1
                return None
            window.passed += 1
            held, window.held = window.held, 0
            return held

    def held(self, kind: Hashable) -> int:
        """How many of `kind` were held back since one passed."""
        with self._lock:
            window = self._kinds.get(kind)
            return window.held if window is not None else 0

    def _forget_quiet(self, now: float) -> None:
        # a kind whose interval is over and that held nothing back has nothing left to report
        for kind in [k for k, w in self._kinds.items() if now - w.start >= self.interval_s and not w.held]:
            del self._kinds[kind]


class ThrottledLog:
    """A logger's lines by kind, one per kind per interval."""

    def __init__(self, logger: logging.Logger, interval_s: float = REPEAT_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.logger = logger
        self.windows = Windows(1, interval_s, clock)

    def log(self, level: int, kind: str, msg: str, *args: Any, **kwargs: Any) -> bool:
        """Log `msg % args` unless a line of this kind was written less than interval_s ago (then only
        count it). True when written."""
        if not self.logger.isEnabledFor(level):
            return False
        held = self.windows.admit(kind)
        if held is None:
            return False
        if held:
            kwargs["extra"] = {**kwargs.get("extra", {}), "suppressed": held}
        kwargs.setdefault("stacklevel", 2)  # the caller's line, not this helper's
        self.logger.log(level, msg, *args, **kwargs)
        return True

    def warning(self, kind: str, msg: str, *args: Any, **kwargs: Any) -> bool:
        return self.log(logging.WARNING, kind, msg, *args, stacklevel=3, **kwargs)

    def info(self, kind: str, msg: str, *args: Any, **kwargs: Any) -> bool:
        return self.log(logging.INFO, kind, msg, *args, stacklevel=3, **kwargs)


class RepeatFilter(logging.Filter):
    """A handler's backstop: at most `burst` lines per interval of one (logger, message template)."""

    def __init__(self, burst: int = REPEAT_BURST, interval_s: float = REPEAT_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.windows = Windows(burst, interval_s, clock)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.CRITICAL or "event" in record.__dict__:
            return True
        held = self.windows.admit((record.name, str(record.msg)))
        if held is None:
            return False
        if held and "suppressed" not in record.__dict__:
            record.suppressed = held
        return True
