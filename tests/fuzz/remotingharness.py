"""The remoting request handlers over the in-process servicer: RocketMQ commands in, responses out, no sockets.

Handlers normally call this node's gRPC API through a stub; StubAdapter answers those calls with the
real NameServerService over a LocalNode, so the whole remoting -> gRPC servicer -> state path runs in
one process, as fast as a fuzzer needs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import grpc

from nameserver.config import NodeConfig
from nameserver.pb import api_pb2
from nameserver.remoting.handlers import Handlers
from tests.fuzz.inprocess import Servicer


class FakeRpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self._code = code
        self._details = details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class _WatchStream:
    """The initial listing of a Watch from offset 0, as the real stream starts."""

    def __init__(self, svc: Servicer, request: api_pb2.WatchRequest) -> None:
        state = svc.node.state
        prefixes = tuple(request.key_prefixes) or ("",)
        events = [api_pb2.WatchEvent(type=t, key=k, value=v, version=ver)
                  for k, v, ver, t in sorted(state.kv.items()) if k.startswith(prefixes)]
        self._messages = [api_pb2.WatchResponse(offset=state.offset, events=events, initial_state=True),
                          api_pb2.WatchResponse(offset=state.offset, initial_state=True, initial_state_done=True)]

    def __iter__(self) -> Iterator[api_pb2.WatchResponse]:
        return iter(self._messages)

    def cancel(self) -> None:
        pass


class StubAdapter:
    """A NameServerStub look-alike: each method calls the in-process servicer."""

    def __init__(self, svc: Servicer) -> None:
        self.svc = svc

    def __getattr__(self, method: str) -> Callable[..., Any]:
        def invoke(request: Any, timeout: float | None = None, metadata: Any = None) -> Any:
            if method == "Watch":
                return _WatchStream(self.svc, request)
            out = self.svc.call(method, list(request) if method == "RegisterBrokerStream" else request)
            if out.code != grpc.StatusCode.OK:
                raise FakeRpcError(out.code, out.details)
            return out.reply
        return invoke


_CHANNEL = grpc.insecure_channel("127.0.0.1:9")  # never connected: the stub on it is replaced


def handlers(svc: Servicer | None = None) -> Handlers:
    """Handlers whose gRPC calls go to `svc` (a fresh in-memory node by default)."""
    cfg = NodeConfig(raft_addr="127.0.0.1:1", grpc_addr="127.0.0.1:2", data_dir="", members=[])
    h = Handlers(_CHANNEL, cfg, timeout_s=1.0)
    h.ns = StubAdapter(svc or Servicer())  # type: ignore[assignment]  # duck-typed stub
    return h
