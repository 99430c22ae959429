"""The one exception the client library raises for a failed call."""

from __future__ import annotations

import grpc

from nameserver import headers


class NameServerError(Exception):
    """A call that failed for good: a non-retryable status, or retries exhausted by the deadline.

    `code` is the last gRPC status, `details` its message, `attempts` how many tries were made and
    `apply_offset` the serving node's apply offset when it reported one (`x-apply-offset`).
    """

    def __init__(self, method: str, code: grpc.StatusCode, details: str, attempts: int = 1,
                 apply_offset: int | None = None) -> None:
        super().__init__(f"{method}: {code.name}: {details} (after {attempts} attempt(s))")
        self.method = method
        self.code = code
        self.details = details
        self.attempts = attempts
        self.apply_offset = apply_offset


def status_of(err: grpc.RpcError) -> tuple[grpc.StatusCode, str]:
    """(code, details) of a gRPC error, tolerant of errors that carry neither."""
    code = getattr(err, "code", None)
    details = getattr(err, "details", None)
    return (code() if callable(code) else grpc.StatusCode.UNKNOWN,
            (details() if callable(details) else None) or str(err))


def apply_offset_of(err: grpc.RpcError) -> int | None:
    """The `x-apply-offset` trailer of a read that timed out waiting for min_offset, if any."""
    trailers = getattr(err, "trailing_metadata", None)
    if not callable(trailers):
        return None
    for key, value in trailers() or ():
        if key == headers.APPLY_OFFSET and str(value).isdigit():
            return int(value)
    return None
