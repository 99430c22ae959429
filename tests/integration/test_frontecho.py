"""Issue 27's front-end spike (bench/frontecho.py, bench/gofront/): each server of the trio (grpcio, the Go front
end with 1 and 2 Python workers, the pure Go server) answers GetRoute with the expected reply, a missing topic
NOT_FOUND, bad request bytes INVALID_ARGUMENT, an unknown method UNIMPLEMENTED; the driver's closed-loop
load gets only expected replies from each; and the front end answers UNAVAILABLE, not a hang, once its
worker is gone. Counts only, never speeds (those are docs/benchmarks.md's).
Marked slow: a cold build of bench/gofront (grpc-go) takes a minute or more on this machine."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import grpc
import pytest

from bench import frontecho
from nameserver.pb import api_pb2

pytestmark = pytest.mark.slow


def _call(addr: str, method: str, request: bytes) -> bytes:
    with grpc.insecure_channel(addr) as channel:
        call: grpc.UnaryUnaryMultiCallable = channel.unary_unary(method)
        reply: bytes = call(request, timeout=10)
        return reply


def _code(addr: str, method: str, request: bytes) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as err:
        _call(addr, method, request)
    return err.value.code(), err.value.details() or ""


@pytest.mark.parametrize("server", frontecho.SERVERS)
def test_server_answers_route_reads(server: str, tmp_path: Path) -> None:
    files = frontecho.Files(tmp_path)
    with frontecho.running(server, files) as (addr, _, _):
        assert _call(addr, frontecho.GET_ROUTE, frontecho.request_bytes()) == frontecho.expected_reply()
        reply = api_pb2.GetRouteReply.FromString(_call(addr, frontecho.GET_ROUTE, frontecho.request_bytes()))
        assert len(reply.route.broker_datas) == 16 and reply.apply_offset == frontecho.APPLY_OFFSET

        missing = api_pb2.GetRouteRequest(topic="no-such-topic").SerializeToString()
        code, details = _code(addr, frontecho.GET_ROUTE, missing)
        assert code == grpc.StatusCode.NOT_FOUND and "no-such-topic" in details
        code, _ = _code(addr, frontecho.GET_ROUTE, b"\x0a\xff")  # field 1, a length past the end
        # grpcio's own deserializer fails the call as INTERNAL; the worker names the message.
        assert code == (grpc.StatusCode.INTERNAL if server == "grpcio" else grpc.StatusCode.INVALID_ARGUMENT)
        code, _ = _code(addr, f"/{frontecho.SERVICE}/NoSuchMethod", b"")
        assert code == grpc.StatusCode.UNIMPLEMENTED

        res = frontecho.load(addr, files, clients=4, seconds=1.0)
        assert res["errors"] == 0 and res["mismatches"] == 0, res["first_error"]
        assert res["calls"] > 0 and res["cpu_s"] > 0


def test_compare_measures_every_server() -> None:
    rows = frontecho.compare(seconds=1.0, clients=[2], rounds=1, servers=frontecho.SERVERS)
    assert [row["server"] for row in rows] == list(frontecho.SERVERS)
    for row in rows:
        assert row["errors"] == 0, row["first_error"]
        assert row["calls_per_s"] > 0 and row["server_us_per_call"] > 0 and row["load_us_per_call"] > 0
    assert rows[0]["vs_grpcio"] == 1.0 and all(row["vs_grpcio"] > 0 for row in rows)
    python = {row["server"]: row["python_us_per_call"] for row in rows}
    assert python["goecho"] == 0 and all(python[s] > 0 for s in ("grpcio", "front1", "front2"))
    assert "| front2 | 2 |" in frontecho.table(rows)


def test_front_end_answers_unavailable_once_its_worker_is_gone(tmp_path: Path) -> None:
    files = frontecho.Files(tmp_path)
    with frontecho.running("front1", files) as (addr, workers, _):
        assert _call(addr, frontecho.GET_ROUTE, frontecho.request_bytes()) == frontecho.expected_reply()
        os.kill(workers[0], signal.SIGKILL)
        for _ in range(3):  # the call that meets the closed socket, and those after it
            code, details = _code(addr, frontecho.GET_ROUTE, frontecho.request_bytes())
            assert code == grpc.StatusCode.UNAVAILABLE and "worker link" in details
