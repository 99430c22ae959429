"""A blocking remoting client for the tests: one request, one response, over nameserver.remoting's codec."""

from __future__ import annotations

import itertools
import socket
from typing import Any

from nameserver.remoting import frame
from nameserver.remoting.command import Command
from tests.fakebroker import read_frame

from .recorder import parse_body

_opaque = itertools.count(1)

GET_ROUTEINFO_BY_TOPIC = 105
GET_BROKER_CLUSTER_INFO = 106


def call(addr: str, code: int, ext: dict[str, str] | None = None, body: bytes = b"", version: int = 479,
         language: str = "JAVA", timeout: float = 10.0) -> Command:
    req = Command(code=code, language=language, version=version, opaque=next(_opaque), flag=0,
                  ext_fields=ext or {}, body=body)
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(frame.encode(req))
        payload = read_frame(sock)
    assert payload is not None, f"{addr} closed the connection instead of answering code {code}"
    resp = frame.decode(payload)
    assert resp.opaque == req.opaque and resp.is_response, resp
    return resp


def route(addr: str, topic: str) -> dict[str, Any] | None:
    """TopicRouteData as a dict, or None for TOPIC_NOT_EXIST. Bodies are read in standard JSON or fastjson's
    form (the stock 4.9 NameServer writes integer map keys unquoted)."""
    r = call(addr, GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
    if r.code == 17:
        return None
    assert r.code == 0, (r.code, r.remark)
    return parse_body(r.body)


def cluster_info(addr: str) -> dict[str, Any]:
    r = call(addr, GET_BROKER_CLUSTER_INFO)
    assert r.code == 0, (r.code, r.remark)
    return parse_body(r.body)
