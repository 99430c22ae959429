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
    fn(self) once it is set, in the order given, whichever thread gives one: those given before or while it is
    set run on the thread that sets it, those given after on the thread that gives them."""

    __slots__ = ("_callbacks", "_done", "_error", "_lock", "_set_once", "_value")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[Later], None]] = []
        self._set_once = False  # a value or an error was set
        self._done = False  # and every callback given so far ran
        self._value: Any = None
        self._error: BaseException | None = None

    def then(self, fn: Callable[[Later], None]) -> None:
        with self._lock:
            if not self._done:
                self._callbacks.append(fn)  # the setter's thread runs it, after those before it
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
        # The callbacks given so far taken at once, then those given while they ran (after them, in order): the
        # lock taken once more when they are done, not twice a callback (on a leader's apply thread, for every
        # write of a worker's).
        with self._lock:
            if self._set_once:
                return  # set already
            self._set_once = True
            self._value, self._error = value, error
            given, self._callbacks = self._callbacks, []
            if not given:
                self._done = True
                return
        while True:
            for fn in given:
                try:  # often the apply thread: one callback's bug must neither stop it nor the others
                    fn(self)
                except Exception:
                    log.exception("a reply's callback failed")
            with self._lock:
                given, self._callbacks = self._callbacks, []
                if not given:
                    self._done = True
                    return


__all__ = ["Later"]
