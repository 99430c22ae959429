"""One remoting request's header fields, read as RocketMQ's RemotingCommand.decodeCommandCustomHeader reads
them, and the dispatch through a protocol's handler table that turns every failure into a response."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import grpc

from nameserver.remoting import bodies, codes
from nameserver.remoting.bodies import BodyError
from nameserver.remoting.command import Command
from nameserver.remoting.status import response_code, rpc_error_parts
from nameserver.safetext import shown


class RequestError(Exception):
    """Answer the request with this response code and remark."""

    def __init__(self, code: int, remark: str) -> None:
        super().__init__(remark)
        self.code = code
        self.remark = remark


QUOTED = 64  # characters of a client's value quoted in a remark


def need(req: Command, name: str) -> str:
    value = req.ext(name)
    if value is None:
        # RocketMQ's wording (RemotingCommand.decodeCommandCustomHeader).
        raise RequestError(codes.SYSTEM_ERROR, f"the custom field <{name}> is null")
    return value


def int_field(req: Command, name: str, default: int | None = None) -> int:
    value = req.ext(name)
    if value is None or value == "":
        if default is None:
            raise RequestError(codes.SYSTEM_ERROR, f"the custom field <{name}> is null")
        return default
    try:
        number = int(value)
    except ValueError:
        raise RequestError(codes.SYSTEM_ERROR,
                           f"the custom field <{name}> is not an integer: {shown(value, QUOTED)!r}") from None
    if not bodies.INT64[0] <= number <= bodies.INT64[1]:  # Java's Long; our int64 fields could not hold it
        # quoted shortened: a 70,000-digit number echoed whole made the reply's header pass its 64 KiB bound
        raise RequestError(codes.SYSTEM_ERROR, f"the custom field <{name}> is out of range: {shown(value, QUOTED)}")
    return number


def bool_field(req: Command, name: str) -> bool:
    value = req.ext_fields.get(name)
    return value is not None and value.strip().lower() == "true"  # Java Boolean.parseBoolean (null: false)


def wants_fastjson(req: Command) -> bool:
    """Old clients (before 4.9.4) expect fastjson's unquoted numeric keys unless they opt out."""
    return req.version < codes.STANDARD_JSON_MIN_VERSION and not bool_field(req, "acceptStandardJsonOnly")


def dispatch(table: Mapping[int, Callable[[Command], Command]], req: Command) -> Command:
    """One request through a protocol's handler table: its answer, or the error it ended with as a response."""
    if req.invalid is not None:
        return req.response(codes.SYSTEM_ERROR, req.invalid)
    fn = table.get(req.code)
    if fn is None:
        return req.response(codes.REQUEST_CODE_NOT_SUPPORTED, f" request type {req.code} not supported")
    try:
        return fn(req)
    except RequestError as exc:
        return req.response(exc.code, exc.remark)
    except BodyError as exc:
        return req.response(codes.SYSTEM_ERROR, str(exc))
    except grpc.RpcError as exc:
        status, details = rpc_error_parts(exc)
        return req.response(response_code(status), details)
