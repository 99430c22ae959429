"""Calls into this node's gRPC servicer without gRPC: the remoting listener's path to the service layer
(one semantics for both protocols, and no loopback hop, serialization or second thread per request).

`InProcessStub(servicer, role=...)` has the generated stub's calling convention,
`stub.GetRoute(request, timeout=5)`, so the remoting handlers cannot tell which one they hold. A call runs
on the caller's thread with a LocalContext: its deadline, metadata, trailing metadata, cancel and abort
as grpc's ServicerContext offers them. `abort` raises LocalRpcError, a grpc.RpcError with code() and
details(), exactly what a failed stub call raises. When a role is given, it is checked against the role
table (auth.allowed) before the method runs, with the interceptor's message.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import grpc

from nameserver.api import auth
from nameserver.core.nowait import WouldBlock
from nameserver.localfeed import StatusError

log = logging.getLogger("nameserver.api.inprocess")

Metadata = Sequence[tuple[str, str]]


class LocalRpcError(StatusError):
    """A failed in-process call: the status the method aborted with."""

    def __init__(self, code: grpc.StatusCode, details: str, trailing: Metadata = ()) -> None:
        super().__init__(code, details)
        self._trailing = tuple(trailing)

    def trailing_metadata(self) -> Any:  # grpc's stubs type it as their private _Metadatum tuples
        return self._trailing


class LocalContext:
    """The part of grpc.ServicerContext our servicers use, for a call made on the caller's thread."""

    def __init__(self, timeout: float | None, metadata: Metadata = ()) -> None:
        self._deadline = None if timeout is None else time.monotonic() + timeout
        self._metadata = tuple(metadata)
        self._trailing: tuple[tuple[str, str], ...] = ()
        self._cancelled = False  # set by cancel() from any thread (a plain store)

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def time_remaining(self) -> float | None:
        return None if self._deadline is None else max(0.0, self._deadline - time.monotonic())

    def is_active(self) -> bool:
        return not self._cancelled and (self._deadline is None or time.monotonic() < self._deadline)

    def cancel(self) -> None:
        self._cancelled = True

    def set_trailing_metadata(self, metadata: Metadata) -> None:
        self._trailing = tuple(metadata)

    def abort(self, code: grpc.StatusCode, details: str) -> NoReturn:
        raise LocalRpcError(code, details, self._trailing)


class InProcessStub:
    """`stub.Method(request, timeout=None, metadata=())` calls `servicer.Method(request, LocalContext)`.

    role: the rights every call has (auth.allowed's table); "" when calls are not checked (auth off)."""

    def __init__(self, servicer: Any, service: str, role: str = "") -> None:
        self._servicer = servicer
        self._service = service  # the full gRPC service name, for the role table and messages
        self._role = role

    def __getattr__(self, name: str) -> Callable[..., Any]:
        """The method's caller, made once: later lookups find it on the instance (a route read asks for it
        every time)."""
        if name.startswith("_"):
            raise AttributeError(name)
        method = getattr(self._servicer, name)  # AttributeError for a method the servicer lacks
        full = f"/{self._service}/{name}"

        def call(request: Any, timeout: float | None = None, metadata: Metadata = ()) -> Any:
            if self._role and not auth.allowed(self._role, full):
                raise LocalRpcError(grpc.StatusCode.PERMISSION_DENIED,
                                    f"role {self._role} (remoting) may not call {full}")
            try:
                return method(request, LocalContext(timeout, metadata))
            except (grpc.RpcError, WouldBlock):  # WouldBlock: the caller retries where it may wait
                raise
            except Exception as exc:  # a servicer bug: what gRPC answers for one, and a log line
                log.exception("in-process call %s failed", full)
                raise LocalRpcError(grpc.StatusCode.UNKNOWN, f"Exception calling application: {exc}") from exc

        setattr(self, name, call)
        return call
