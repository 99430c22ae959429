"""Calls that must not wait: a caller on an event loop thread runs a cheap read inline only when
nothing would block it, and hands it to a thread otherwise.

Within `with no_wait():`, a step that would have to wait (the node's state lock held by the apply
thread or a long translation, a read waiting for an offset) raises WouldBlock instead, before it has
changed anything; the caller then runs the same call on a worker thread.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

_no_wait: contextvars.ContextVar[bool] = contextvars.ContextVar("rip18_no_wait", default=False)


class WouldBlock(Exception):
    """The call would have to wait; nothing was done. Run it where waiting is allowed."""


@contextlib.contextmanager
def no_wait() -> Iterator[None]:
    token = _no_wait.set(True)
    try:
        yield
    finally:
        _no_wait.reset(token)


def waiting_allowed() -> bool:
    return not _no_wait.get()
