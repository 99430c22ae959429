"""SIGTERM and SIGINT, waited for by a process's main thread (the node's, a remoting worker's).

Python runs a signal's handler on the main thread only, when that thread is back in the interpreter;
the kernel may hand a process's signal to any of its threads (POSIX). When one of the node's other
threads takes it, a main thread blocked in an untimed Event.wait() is never woken: the node went on
serving after SIGTERM, and stopped only at a second signal that the main thread took itself (seen
in a rolling restart: no "stopping" line for 15 s). So the main thread waits in slices of POLL_S:
after a signal, taken by whichever thread, the handler runs within one slice.
"""

from __future__ import annotations

import signal
import threading

POLL_S = 0.2  # how late a stop signal taken by another thread is acted on; the wait costs nothing meanwhile


def stop_event() -> threading.Event:
    """An Event set by SIGTERM or SIGINT (installs the handlers: call it on the main thread)."""
    stopped = threading.Event()

    def on_signal(_signum: int, _frame: object) -> None:
        stopped.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return stopped


def wait_until_set(stopped: threading.Event) -> None:
    """Block until `stopped` is set, in slices, so that the main thread runs pending signal handlers."""
    while not stopped.wait(POLL_S):
        pass


__all__ = ["POLL_S", "stop_event", "wait_until_set"]
