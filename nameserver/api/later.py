"""A handler's reply that comes after the handler returned: the core's answer to a worker's write, made on the
apply thread once the write applied, with no thread waiting for it (nameserver/api/writechannel.py,
NameServerService.write). The interceptors pass it up as they pass any reply; what one does at a call's end
(corelink.WorkerCallers stamps the core's apply offset) it does when the reply comes (`then`)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("nameserver.api.later")


class Later:
    """A reply, or the exception that stands for its status, set once (`resolve`, `fail`); `then(fn)` calls
    fn(self) when it is set (at once when it is), in the order given, on the thread that sets it."""

    __slots__ = ("_callbacks", "_error", "_lock", "_value")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[Later], None]] | None = []  # None once set
        self._value: Any = None
        self._error: BaseException | None = None

    def then(self, fn: Callable[[Later], None]) -> None:
        with self._lock:
            if self._callbacks is not None:
                self._callbacks.append(fn)
                return
        fn(self)

    def resolve(self, value: Any) -> None:
        self._set(value, None)

    def fail(self, error: BaseException) -> None:
        self._set(None, error)

    def result(self) -> Any:
        """The reply; raises the exception it was failed with."""
        if self._error is not None:
            raise self._error
        return self._value

    def _set(self, value: Any, error: BaseException | None) -> None:
        with self._lock:
            callbacks, self._callbacks = self._callbacks, None
            if callbacks is None:
                return  # set already
            self._value, self._error = value, error
        for fn in callbacks:
            try:  # often the apply thread: one callback's bug must neither stop it nor the others
                fn(self)
            except Exception:
                log.exception("a reply's callback failed")


__all__ = ["Later"]
