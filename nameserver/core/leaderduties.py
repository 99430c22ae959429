"""A node's periodic duties, on one thread, in one place.

The leader expires silent brokers and idle exactly-once sessions, appends the idle no-op, and elects a
new master for a broker set whose master went silent; every node forgets stale controller heartbeats.
Each was its own thread polling `is_leader()` on its own clock. Here each is a named duty with an
interval, run in turn by one thread (KRaft's controller runs its periodic tasks on its one event queue
the same way): a duty never runs concurrently with another or with itself, and the list of what a
leader does on its own initiative is the list of `add` calls.

A duty must not block for long: each is a few reads and at most a few writes with their own timeouts.
A failing duty is logged and runs again at its next turn; it never ends the loop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("nameserver.duties")


@dataclass
class _Duty:
    name: str
    interval_s: float
    run: Callable[[], object]
    leader_only: bool
    due: float
    runs: int = 0


class LeaderDuties:
    def __init__(self, leading: Callable[[], bool]) -> None:
        self._leading = leading  # this node leads and has applied its log: leader-only duties may run
        self._duties: dict[str, _Duty] = {}
        self._cv = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="leader-duties", daemon=True)

    def add(self, name: str, interval_s: float, run: Callable[[], object], leader_only: bool = True) -> None:
        """Run `run()` every `interval_s` (only while leading, unless `leader_only` is False)."""
        if interval_s <= 0:
            raise ValueError(f"duty {name}: interval_s must be > 0")
        with self._cv:
            if name in self._duties:
                raise ValueError(f"duty {name} is already registered")
            self._duties[name] = _Duty(name, interval_s, run, leader_only, time.monotonic() + interval_s)
            self._cv.notify()

    def wake(self, name: str, after_s: float = 0.0) -> None:
        """Run duty `name` within `after_s` instead of at its next turn (something it watches happened)."""
        with self._cv:
            duty = self._duties[name]
            duty.due = min(duty.due, time.monotonic() + after_s)
            self._cv.notify()

    def runs(self, name: str) -> int:
        with self._cv:
            return self._duties[name].runs

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._cv:
            self._stopped = True
            self._cv.notify()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _next(self) -> list[_Duty] | None:
        """Wait for the duties that are due (in the order they were added); None once stopped."""
        with self._cv:
            while not self._stopped:
                now = time.monotonic()
                due = [d for d in self._duties.values() if d.due <= now]
                if due:
                    for d in due:
                        d.due = now + d.interval_s
                    return due
                self._cv.wait(min((d.due for d in self._duties.values()), default=now + 1.0) - now)
            return None

    def _loop(self) -> None:
        while (due := self._next()) is not None:
            leading = self._leading()
            for duty in due:
                if duty.leader_only and not leading:
                    continue
                try:
                    duty.run()
                except Exception:
                    log.exception("duty %s failed; it runs again in %.1f s", duty.name, duty.interval_s)
                with self._cv:
                    duty.runs += 1


__all__ = ["LeaderDuties"]
