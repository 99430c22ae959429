"""A watchdog on pysyncobj's tick thread: when a tick has not come for `stall_s`, log every thread's stack.

The tick thread sends the heartbeats, reads the peers' messages and counts commits; pysyncobj's own loop
comes back at least every 50 ms. A leader whose tick stops for seconds is deposed, and writes wait for it
meanwhile, without a line in any log saying why (docs/faults.md, finding 10). So a stall is logged once,
WARNING with the stacks of all threads (the tick thread's first) while it lasts, and its length when the
tick comes back.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import traceback

log = logging.getLogger("raftlog.tickwatch")


class TickWatch:
    """`beat()` on every tick (from the tick thread); a daemon thread checks every `stall_s / 4`."""

    def __init__(self, stall_s: float = 1.0) -> None:
        self.stall_s = stall_s
        self.stalls = 0
        self.longest_s = 0.0
        self._last = time.monotonic()
        self._tick_ident: int | None = None
        self._stalled_since: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tick-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def beat(self) -> None:
        now = time.monotonic()
        self._tick_ident = threading.get_ident()
        since = self._stalled_since
        self._last = now
        if since is not None:
            self._stalled_since = None
            took = now - since
            self.longest_s = max(self.longest_s, took)
            log.warning("the Raft tick thread is back after %.1f s without a tick", took,
                        extra={"event": "tick_stall_end", "seconds": round(took, 3)})

    def _run(self) -> None:
        checked = time.monotonic()
        while not self._stop.wait(self.stall_s / 4):
            now, before = time.monotonic(), checked
            checked = now
            last = self._last
            if self._tick_ident is None:  # armed by the first tick (the transport is up from then)
                continue
            if now - before > self.stall_s:
                # This thread was late too: the whole process was stopped (SIGSTOP, a VM pause) or
                # starved, which says nothing about the tick thread. Count from now.
                self._last = max(last, now)
                continue
            if self._stalled_since is None and now - last > self.stall_s:
                self._stalled_since = last
                self.stalls += 1
                log.warning("the Raft tick thread has not ticked for %.1f s; the stacks of every thread:\n%s",
                            now - last, self._stacks(), extra={"event": "tick_stall"})

    def _stacks(self) -> str:
        frames = sys._current_frames()
        names = {t.ident: t.name for t in threading.enumerate()}
        order = sorted(frames, key=lambda ident: ident != self._tick_ident)  # the tick thread first
        parts = []
        for ident in order:
            mark = " (the tick thread)" if ident == self._tick_ident else ""
            stack = "".join(traceback.format_stack(frames[ident]))
            parts.append(f"--- thread {names.get(ident, ident)}{mark}\n{stack}")
        return "\n".join(parts)


__all__ = ["TickWatch"]
