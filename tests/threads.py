"""Thread helpers for tests that need another thread to hold a lock."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any


@contextlib.contextmanager
def held_elsewhere(lock: AbstractContextManager[Any]) -> Iterator[None]:
    """`lock` held by another thread for the whole block (as apply or a reader would hold it)."""
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(5), "the other thread never got the lock"
        yield
    finally:
        release.set()
        holder.join()
