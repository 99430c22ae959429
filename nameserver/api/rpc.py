"""How every gRPC method of a node is wrapped: one mapping of our exceptions to gRPC statuses (`rpc`),
the call's own deadline, forwarding mark and exactly-once identity read from its metadata, whether a
write's call is still wanted (`in_time`), and `DecodeGuard`, which answers undecodable request bytes with
INVALID_ARGUMENT naming the request."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from nameserver import headers
from nameserver.api import auth
from nameserver.api.grpcwrap import wrap_handler
from nameserver.api.later import Later
from nameserver.core.forwarder import NoLeader
from nameserver.core.node import (
    ClientRef,
    MembershipError,
    NotReady,
    OffsetNotReached,
    SessionSuperseded,
)
from nameserver.errors import TooLargeError, ValidationError
from nameserver.state.shards.moves import SetMoving
from nameserver.state.translate import CasFailed
from raftlog.proposer import ProposalError


def forwarded(context: grpc.ServicerContext) -> bool:
    return any(k == headers.FORWARDED for k, _ in context.invocation_metadata())


_SESSION_KEYS = frozenset({headers.CLIENT_ID, headers.CLIENT_SEQ})


def client_ref(context: grpc.ServicerContext) -> ClientRef | None:
    """The exactly-once identity from metadata, validated, within its caller's sessions; None when the
    caller sent none."""
    metadata = context.invocation_metadata()
    if not any(k in _SESSION_KEYS for k, _ in metadata):
        return None  # most writes: no session (what the rest would find, without a dict of the metadata)
    md = {k: v for k, v in metadata if isinstance(v, str)}  # binary (-bin) values: none of ours
    cid, seq = md.get(headers.CLIENT_ID), md.get(headers.CLIENT_SEQ)
    if cid is None and seq is None:
        return None
    if not cid or len(cid) > 64 or not cid.isprintable() or "/" in cid:
        raise ValidationError(headers.CLIENT_ID, "must be 1..64 printable characters without '/'")
    if seq is None or not seq.isdigit() or int(seq) <= 0 or int(seq) >= 1 << 63:
        raise ValidationError(headers.CLIENT_SEQ, "must be a positive integer")
    return ClientRef(cid, int(seq), auth.session_owner(md, headers.FORWARDED in md))


class DeadlinePassed(Exception):
    """A write's call reached its deadline before the write was proposed: nothing was (DEADLINE_EXCEEDED)."""


class CallCancelled(Exception):
    """A write's caller went away before the write was proposed: nothing was (CANCELLED)."""


def in_time(context: grpc.ServicerContext, skew_ms: int) -> Callable[[], None]:
    """What a write checks before it is forwarded and before it is proposed: raises DeadlinePassed once its
    call's deadline passed, CallCancelled once its caller cancelled (a context off the write channel is
    cancelled by its worker: nameserver/api/writechannel.py). On a call a peer forwarded, also once the
    forwarder's own deadline (FORWARD_DEADLINE, its wall clock) is within `skew_ms` of this node's wall
    clock ([limits] forward_clock_skew_ms: ours may be that much behind): gRPC's timeout counts from the
    call's arrival, and a call held in a TCP queue through a partition arrives with all of it. The header
    is read only when the call is forwarded, which only peers may send (auth.Authorizer.check).
    The allowance narrows what is taken, on purpose: a write with less than `skew_ms` left is refused
    although it might still have time, because by a forwarder whose clock is ahead of ours by up to
    `skew_ms` its deadline may have passed already, and a write proposed after its caller's deadline is what
    this check exists to prevent (docs/faults.md, finding 14). Widening it (refusing only past the deadline
    plus `skew_ms`) would trade that guarantee for writes with under `skew_ms` left, which could hardly commit
    and answer in time anyway."""
    limit = _forward_deadline_ms(context)

    def check() -> None:
        now = time.time() * 1000
        if limit is not None and now + skew_ms >= limit:
            when = f"passed {now - limit:.0f} ms ago" if now >= limit else f"is only {limit - now:.0f} ms away"
            raise DeadlinePassed(f"the forwarding node's deadline for this write {when} by this node's clock "
                                 f"(limits.forward_clock_skew_ms = {skew_ms}); nothing was proposed")
        if not context.is_active():
            left = context.time_remaining()
            if left is not None and left <= 0:
                raise DeadlinePassed("the call's deadline passed before its write was proposed")
            raise CallCancelled("the caller cancelled the call before its write was proposed")

    return check


def _forward_deadline_ms(context: grpc.ServicerContext) -> int | None:
    if not forwarded(context):
        return None
    value = next((v for k, v in context.invocation_metadata() if k == headers.FORWARD_DEADLINE), None)
    if not isinstance(value, str) or not value.isdigit():
        return None  # none sent: the call is bounded by gRPC's timeout alone
    return int(value)


def call_timeout(context: grpc.ServicerContext, default: float, cap: float) -> float:
    """How long this call may wait here: its own deadline, never more than the node's limits.max_wait_ms
    (a call without a deadline reports an effectively infinite one; `default` is for callers that say
    nothing at all)."""
    left = context.time_remaining()
    return min(default, cap) if left is None else max(0.0, min(left, cap))


def rpc(fn: Callable) -> Callable:
    """Map our exceptions to gRPC statuses, one place for every method; a reply that comes later (Later: a
    write the core answers from its apply) is mapped the same way when it comes."""

    @functools.wraps(fn)
    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            reply = fn(self, request, context)
        except Exception as exc:
            abort_for(exc, context)
            raise
        return _mapped_later(reply, context) if isinstance(reply, Later) else reply

    return wrapper


def _mapped_later(reply: Later, context: grpc.ServicerContext) -> Later:
    """`reply`, its exception mapped to the status `rpc` gives it (context.abort's), when it comes."""
    out = Later()

    def mapped(got: Later) -> None:
        try:
            out.resolve(got.result())
        except Exception as exc:
            try:
                abort_for(exc, context)
            except Exception as aborted:  # context.abort raised the status
                out.fail(aborted)
                return
            out.fail(exc)  # not one of ours: as it came (the caller answers UNKNOWN)

    reply.then(mapped)
    return out


def abort_for(exc: Exception, context: grpc.ServicerContext) -> None:
    """context.abort with the status `exc` maps to (which raises); returns for an exception of no status here."""
    if isinstance(exc, TooLargeError):
        context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{exc.field}: {exc.message}")
    elif isinstance(exc, ValidationError):
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{exc.field}: {exc.message}")
    elif isinstance(exc, NotReady):
        context.abort(grpc.StatusCode.UNAVAILABLE, f"not ready: {exc}")
    elif isinstance(exc, OffsetNotReached):
        context.set_trailing_metadata(((headers.APPLY_OFFSET, str(exc.apply_offset)),))
        context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
    elif isinstance(exc, ProposalError):  # NotLeader too (a ProposalError): "write not applied: ..."
        what = "outcome unknown" if exc.unknown_outcome else "not applied"
        context.abort(grpc.StatusCode.UNAVAILABLE, f"write {what}: {exc}")
    elif isinstance(exc, CasFailed):
        context.set_trailing_metadata(((headers.CURRENT_VERSION, str(exc.current)),))
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
    elif isinstance(exc, SessionSuperseded):
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
    elif isinstance(exc, DeadlinePassed):
        context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, str(exc))
    elif isinstance(exc, CallCancelled):
        context.abort(grpc.StatusCode.CANCELLED, str(exc))
    elif isinstance(exc, SetMoving | NoLeader):
        # SetMoving is retriable: the set's writes go to its new group once the move is done. (NotLeader is a
        # ProposalError, answered above, as the rpc wrapper's clauses in that order always did.)
        context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
    elif isinstance(exc, TimeoutError):
        context.abort(grpc.StatusCode.UNAVAILABLE, f"linearizable read: {exc}")
    elif isinstance(exc, MembershipError):
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
    elif isinstance(exc, grpc.RpcError) and hasattr(exc, "code") and callable(exc.code):
        # a forwarded call's status passes through unchanged
        context.abort(exc.code(), exc.details() or "forwarded call failed")


class _Undecodable:
    """Stands in for a request whose bytes did not parse (the servicer never sees it)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _lenient(deserializer: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def parse(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception as exc:  # protobuf's DecodeError, or invalid UTF-8 in a string field
            return _Undecodable(str(exc) or type(exc).__name__)
    return parse


def _refuse(context: grpc.ServicerContext, method: str, bad: _Undecodable) -> None:
    context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"request: not a valid {method} request: {bad.reason}")


class DecodeGuard(grpc.ServerInterceptor):
    """Request bytes that do not parse get INVALID_ARGUMENT naming the request, where gRPC itself
    answers INTERNAL ("Exception deserializing request!") and logs a traceback per call."""

    def intercept_service(self, continuation: Callable, details: grpc.HandlerCallDetails) -> Any:
        handler = continuation(details)
        if handler is None or handler.request_deserializer is None:
            return handler
        method = details.method.rsplit("/", 1)[-1]

        def checked(behavior: Callable, kind: str) -> Callable:
            if handler.request_streaming:
                def stream(requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
                    def items() -> Iterator[Any]:
                        for item in requests:
                            if isinstance(item, _Undecodable):
                                _refuse(context, method, item)
                            yield item
                    return behavior(items(), context)
                return stream

            def unary(request: Any, context: grpc.ServicerContext) -> Any:
                if isinstance(request, _Undecodable):
                    _refuse(context, method, request)
                return behavior(request, context)
            return unary

        return wrap_handler(handler, checked, request_deserializer=_lenient(handler.request_deserializer))


__all__ = ["CallCancelled", "DeadlinePassed", "DecodeGuard", "abort_for", "call_timeout", "client_ref", "forwarded",
           "in_time", "rpc"]
