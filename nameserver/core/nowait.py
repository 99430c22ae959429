"""Calls that must not wait: a caller on an event loop thread runs a cheap read inline only when
nothing would block it, and hands it to a thread otherwise.

Within `with no_wait():`, a step that would have to wait (the node's state lock held by the apply
thread or a long translation, a read waiting for an offset) raises WouldBlock instead, before it has
changed anything; the caller then runs the same call on a worker thread.
"""

from __future__ import annotations

import contextvars

_no_wait: contextvars.ContextVar[bool] = contextvars.ContextVar("rip18_no_wait", default=False)


class WouldBlock(Exception):
    """The call would have to wait; nothing was done. Run it where waiting is allowed."""


class no_wait:  # noqa: N801 - used as a function: `with no_wait():`
    """Within it, steps that would wait raise WouldBlock. A class, not a generator: the remoting listener
    enters it for every route read, and contextlib's machinery cost a few microseconds each time."""

    __slots__ = ("_token",)

    def __enter__(self) -> None:
        self._token = _no_wait.set(True)

    def __exit__(self, *exc: object) -> None:
        _no_wait.reset(self._token)


def waiting_allowed() -> bool:
    return not _no_wait.get()
