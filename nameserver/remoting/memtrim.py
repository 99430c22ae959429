"""Give freed memory back to the system (glibc's malloc_trim).

Large replies are built and freed on the listener's worker threads; glibc keeps what they freed in its
arenas for reuse, so a node that once held hundreds of MiB of unread replies would keep that resident
after the connections are gone. Trimming after such a peak returns it. A no-op where there is no glibc.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
from collections.abc import Callable

_trim: Callable[[int], int] | None = None
with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim with
    _trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim


def give_back() -> bool:
    """Return free heap memory to the system; True when something was returned."""
    return bool(_trim(0)) if _trim is not None else False
