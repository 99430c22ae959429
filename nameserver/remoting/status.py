"""gRPC statuses (from our own gRPC API) to RocketMQ response codes."""

from __future__ import annotations

import grpc

from nameserver.remoting import codes

_BY_STATUS = {
    grpc.StatusCode.UNAVAILABLE: codes.SYSTEM_BUSY,          # no leader yet, not ready: retry later
    grpc.StatusCode.DEADLINE_EXCEEDED: codes.SYSTEM_BUSY,
    grpc.StatusCode.ABORTED: codes.SYSTEM_BUSY,
    grpc.StatusCode.PERMISSION_DENIED: codes.NO_PERMISSION,
    grpc.StatusCode.UNAUTHENTICATED: codes.NO_PERMISSION,
}


def response_code(status: grpc.StatusCode | None, not_found: int = codes.SYSTEM_ERROR) -> int:
    """INVALID_ARGUMENT, RESOURCE_EXHAUSTED and anything unexpected are SYSTEM_ERROR (the remark says
    which field); NOT_FOUND is what the caller says it means (TOPIC_NOT_EXIST, QUERY_NOT_FOUND)."""
    if status == grpc.StatusCode.NOT_FOUND:
        return not_found
    return _BY_STATUS.get(status, codes.SYSTEM_ERROR) if status is not None else codes.SYSTEM_ERROR


def rpc_error_parts(exc: grpc.RpcError) -> tuple[grpc.StatusCode | None, str]:
    code = exc.code() if callable(getattr(exc, "code", None)) else None
    details = exc.details() if callable(getattr(exc, "details", None)) else None
    return code, details or (code.name if code is not None else str(exc))
