"""How nsctl talks to the cluster: its two errors, a command's context (endpoints, deadline,
credentials, one channel per endpoint), a call to the first endpoint that answers or to every endpoint,
and the output every command shares."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import grpc

from nameserver.cli import render
from nameserver.client import Credentials, EndpointPool
from nameserver.client.credentials import PLAINTEXT
from nameserver.pb import api_pb2, api_pb2_grpc
from nameserver.safetext import escape_controls

# Codes that mean "this node could not answer": try the next endpoint. Anything else is the answer.
RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})

StubClass = Callable[[grpc.Channel], Any]


# ---- errors ----


class UsageError(Exception):
    """Bad command line: exit 2."""


class CommandError(Exception):
    """A failed call, printed as `error: CODE: details` (exit 1)."""

    def __init__(self, code: str, details: str) -> None:
        super().__init__(f"{code}: {details}")
        self.code = code
        self.details = details


def status_code(err: grpc.RpcError) -> grpc.StatusCode:
    code = getattr(err, "code", None)
    return code() if callable(code) else grpc.StatusCode.UNKNOWN


def status_details(err: grpc.RpcError) -> str:
    """The server's message, on one line: it may quote a name a client chose."""
    details = getattr(err, "details", None)
    return escape_controls((details() if callable(details) else None) or str(err))


def describe(err: grpc.RpcError) -> str:
    return f"{status_code(err).name}: {status_details(err)}"


def command_error(err: grpc.RpcError) -> CommandError:
    return CommandError(status_code(err).name, status_details(err))


# ---- calling the cluster ----


@dataclass(frozen=True)
class Context:
    endpoints: list[str]
    timeout: float
    json: bool
    credentials: Credentials = PLAINTEXT  # --tls-ca/--tls-cert/--tls-key and --token-file (or env NSCTL_TOKEN)

    @functools.cached_property
    def pool(self) -> EndpointPool:
        """One channel per endpoint for the whole command, from the client library (TLS and token included)."""
        return EndpointPool(self.endpoints, credentials=self.credentials)


def open_channel(ctx: Context | None, endpoint: str, options: Any = ()) -> grpc.Channel:
    """A channel of its own to `endpoint` (for long streams), with the context's TLS files and token."""
    return (ctx.credentials if ctx is not None else PLAINTEXT).connect(endpoint, options)


def _call_one(endpoint: str, stub_class: StubClass, method: str, request: Any, timeout: float,
              ctx: Context) -> Any:
    stub = stub_class(ctx.pool.channel(endpoint))
    # A list is a client stream: a fresh iterator per attempt so a failover resends it whole.
    payload = iter(request) if isinstance(request, list) else request
    return getattr(stub, method)(payload, timeout=timeout)


def call_any(ctx: Context, stub_class: StubClass, method: str, request: Any) -> tuple[str, Any]:
    """Send one call to the first endpoint that answers; return (endpoint, reply).

    Passes over the endpoints repeat, with a short backoff, until --timeout: right after a leader
    dies the survivors still forward to it for a moment, and an election takes about a second.
    (nsctl's writes are idempotent, so resending one whose outcome was unknown is safe.)
    """
    deadline = time.monotonic() + ctx.timeout
    pause = 0.2
    while True:
        failures: list[tuple[str, grpc.RpcError]] = []
        for i, endpoint in enumerate(ctx.endpoints):
            # the time left is shared by the endpoints this pass has yet to try: one paused node
            # must not take it all from the others
            share = (deadline - time.monotonic()) / (len(ctx.endpoints) - i)
            try:
                return endpoint, _call_one(endpoint, stub_class, method, request, max(0.05, share), ctx)
            except grpc.RpcError as err:
                if status_code(err) not in RETRYABLE:
                    raise command_error(err) from None
                failures.append((endpoint, err))
        if deadline - time.monotonic() <= pause:
            break
        time.sleep(pause)
    last_code = status_code(failures[-1][1]).name
    tried = "; ".join(f"{endpoint}: {describe(err)}" for endpoint, err in failures)
    raise CommandError(last_code, f"no endpoint answered ({tried})")


def _call_or_error(endpoint: str, stub_class: StubClass, method: str, request: Any, timeout: float,
                   ctx: Context) -> Any:
    try:
        return _call_one(endpoint, stub_class, method, request, timeout, ctx)
    except grpc.RpcError as err:
        return err


def call_each(ctx: Context, stub_class: StubClass, method: str, request: Any) -> list[tuple[str, Any]]:
    """Send one call to every endpoint in parallel; each result is a reply or the grpc.RpcError."""
    with ThreadPoolExecutor(max_workers=len(ctx.endpoints)) as pool:
        futures = [
            pool.submit(_call_or_error, endpoint, stub_class, method, request, ctx.timeout, ctx)
            for endpoint in ctx.endpoints
        ]
        return [(endpoint, future.result()) for endpoint, future in zip(ctx.endpoints, futures, strict=True)]


def ns_call(ctx: Context, method: str, request: Any) -> Any:
    return call_any(ctx, api_pb2_grpc.NameServerStub, method, request)[1]


# ---- output ----


def emit_json(data: Any) -> None:
    print(render.dump_json(data))


def emit_reply(ctx: Context, reply: Any, *lines: str) -> int:
    """A reply: its JSON under --json, else the text `lines`, one per line (a table counts as one)."""
    if ctx.json:
        emit_json(render.to_dict(reply))
    else:
        for line in lines:
            print(line)
    return 0


def emit_write(ctx: Context, reply: Any, extra: str = "") -> int:  # a write's reply (has .offset)
    """Every write reports the offset of its entry (or the apply offset when nothing changed)."""
    if ctx.json:
        emit_json(render.to_dict(reply))
        return 0
    records = getattr(reply, "records", None)
    if records is None:
        line = f"offset {reply.offset}"
    elif records == 0:
        line = f"offset {reply.offset} (no change)"
    else:
        line = f"offset {reply.offset} ({render.plural(records, 'record')})"
    print(line + extra)
    return 0


def served_at(apply_offset: int) -> str:
    return f"served at apply offset {apply_offset}"


def role_name(role: int) -> str:
    return api_pb2.Role.Name(role).removeprefix("ROLE_").lower()
