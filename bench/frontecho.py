"""Issue 27's spike: a compiled gRPC front end (bench/gofront/, Go) with the proto work left to Python worker
processes, measured beside today's grpcio server and a pure Go server doing the same route read.

Every server answers GetRoute for one topic with the same GetRouteReply (a 16-group route, about 1.4 KB):

- `grpcio`: grpcio's sync server in one Python process (bench/echo.py's, a node's options and pool size),
  the request decoded and the reply encoded by grpcio's (de)serializers;
- `front1`, `front2`: `gofront front` terminates HTTP/2 and gRPC (grpc-go, a raw-bytes codec) and passes
  each call's method, metadata and request bytes to 1 or 2 Python worker processes (`worker` below: a
  plain socket loop, no grpcio) over Unix sockets, many calls in flight per socket; the worker decodes the
  request, builds and encodes the reply;
- `goecho`: `gofront echo`, the same read answered in Go (the compiled ceiling).

    python -m bench.frontecho --compare [--seconds 5] [--clients 1,16,64] [--rounds 3] [--servers ...]
    python -m bench.frontecho --table FILE                  # the table again from a run's saved output
    python -m bench.frontecho grpcio --addr 127.0.0.1:0      # one server, prints "listening on HOST:PORT"
    python -m bench.frontecho worker --socket PATH          # one worker, prints "listening on PATH"

`--compare` runs the servers one at a time in turn (a b c a b c ...) under `gofront load` (closed loop, one
connection per client), and reports per load calls/s, p50/p99, the server processes' CPU per call (/proc,
the Go front end and its workers together, and the Python share alone), each server's CPU per call over
grpcio's in the same round (`vs_grpcio`) and the load generator's own CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from statistics import median
from typing import Any

import grpc

from bench import echo, loadgen
from bench.load import proc_cpu_s
from nameserver.pb import api_pb2, state_pb2

GOFRONT = Path(__file__).with_name("gofront")
SERVICE = "rip18.nameserver.v1.NameServer"
GET_ROUTE = f"/{SERVICE}/GetRoute"
TOPIC = "spike-topic"
APPLY_OFFSET = 123_456
SERVERS = ("grpcio", "front1", "front2", "goecho")

# gRPC status codes the worker answers with (grpc.StatusCode's values).
NOT_FOUND = grpc.StatusCode.NOT_FOUND.value[0]
INVALID_ARGUMENT = grpc.StatusCode.INVALID_ARGUMENT.value[0]
UNIMPLEMENTED = grpc.StatusCode.UNIMPLEMENTED.value[0]


# ---- the route read every server answers ----------------------------------------------------------------

def topic_route(groups: int = 16) -> api_pb2.TopicRoute:
    """A route of `groups` broker groups, a master and a slave each, 8 queues each."""
    route = api_pb2.TopicRoute()
    for i in range(groups):
        name = f"broker-{i:02d}"
        route.broker_datas.add(cluster="DefaultCluster", broker_name=name, addrs=[
            state_pb2.BrokerAddr(broker_id=0, addr=f"10.0.{i}.1:10911"),
            state_pb2.BrokerAddr(broker_id=1, addr=f"10.0.{i}.2:10911")])
        route.queue_datas.add(broker_name=name, read_queue_nums=8, write_queue_nums=8, perm=6)
    return route


ROUTES = {TOPIC: topic_route()}


def route_reply(request: api_pb2.GetRouteRequest) -> api_pb2.GetRouteReply | None:
    """The reply a node builds for a route read (nameserver/api/service.py), None: no such topic."""
    route = ROUTES.get(request.topic)
    return None if route is None else api_pb2.GetRouteReply(route=route, apply_offset=APPLY_OFFSET)


def request_bytes() -> bytes:
    return api_pb2.GetRouteRequest(topic=TOPIC).SerializeToString()


def expected_reply() -> bytes:
    reply = route_reply(api_pb2.GetRouteRequest(topic=TOPIC))
    assert reply is not None
    return reply.SerializeToString()


# ---- (a) grpcio's sync server ---------------------------------------------------------------------------

def serve_grpcio(addr: str) -> None:
    def get_route(request: api_pb2.GetRouteRequest, context: grpc.ServicerContext) -> api_pb2.GetRouteReply:
        reply = route_reply(request)
        if reply is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"topic {request.topic} does not exist")
        return reply

    handler = grpc.unary_unary_rpc_method_handler(
        get_route, request_deserializer=api_pb2.GetRouteRequest.FromString,
        response_serializer=api_pb2.GetRouteReply.SerializeToString)
    echo.serve_until_stopped(addr, *echo.serve(addr, service=SERVICE, methods={"GetRoute": handler}))


# ---- (b) the Python worker behind the Go front end ------------------------------------------------------
# Frames (little-endian; bench/gofront/front.go): a call is u32 length of the rest, u64 id, u16 + method,
# u32 + metadata (repeated u16 + key, u32 + value), request bytes; an answer is u32 length of the rest,
# u64 id, u8 gRPC status code, reply bytes (or the error message).

_U32 = struct.Struct("<I")
_U16 = struct.Struct("<H")
_CALL = struct.Struct("<QH")
_ANSWER = struct.Struct("<IQB")
MAX_CALL = 64 << 20


class CallError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def _metadata(buf: bytes, at: int, end: int) -> list[tuple[str, str]]:
    pairs = []
    while at < end:
        (klen,) = _U16.unpack_from(buf, at)
        key = buf[at + 2:at + 2 + klen].decode()
        at += 2 + klen
        (vlen,) = _U32.unpack_from(buf, at)
        pairs.append((key, buf[at + 4:at + 4 + vlen].decode(errors="replace")))
        at += 4 + vlen
    return pairs


def _get_route(body: bytes, metadata: list[tuple[str, str]]) -> bytes:
    try:
        request = api_pb2.GetRouteRequest.FromString(body)
    except Exception as e:  # protobuf's DecodeError
        raise CallError(INVALID_ARGUMENT, f"GetRouteRequest: {e}") from None
    reply = route_reply(request)
    if reply is None:
        raise CallError(NOT_FOUND, f"topic {request.topic} does not exist")
    return reply.SerializeToString()


HANDLERS: dict[str, Callable[[bytes, list[tuple[str, str]]], bytes]] = {GET_ROUTE: _get_route}


def answer(buf: bytes, start: int, end: int) -> bytes:
    """The answer frame to the call frame buf[start:end] (its length prefix excluded)."""
    call_id, mlen = _CALL.unpack_from(buf, start)
    at = start + _CALL.size
    method = buf[at:at + mlen].decode()
    at += mlen
    (mdlen,) = _U32.unpack_from(buf, at)
    metadata = _metadata(buf, at + 4, at + 4 + mdlen)
    body = buf[at + 4 + mdlen:end]
    handler = HANDLERS.get(method)
    try:
        if handler is None:
            raise CallError(UNIMPLEMENTED, f"method {method}: not served")
        code, reply = 0, handler(body, metadata)
    except CallError as e:
        code, reply = e.code, str(e).encode()
    return _ANSWER.pack(len(reply) + _ANSWER.size - 4, call_id, code) + reply


def _serve_link(conn: socket.socket) -> None:
    """One front end's socket: read what is there, answer every whole call in it, write the answers at once."""
    buf = b""
    with conn:
        while data := conn.recv(256 << 10):
            buf = buf + data if buf else data
            out, at = [], 0
            while len(buf) - at >= 4:
                (size,) = _U32.unpack_from(buf, at)
                if size > MAX_CALL:
                    return  # a broken front end: drop its socket
                if at + 4 + size > len(buf):
                    break
                out.append(answer(buf, at + 4, at + 4 + size))
                at += 4 + size
            buf = buf[at:]
            if out:
                conn.sendall(b"".join(out))


def serve_worker(path: str) -> None:
    """Answers front ends on the Unix socket `path`, a thread per connection, until SIGTERM or SIGINT."""
    lis = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    lis.bind(path)
    lis.listen(16)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    print(f"listening on {path}", flush=True)
    while True:
        conn, _ = lis.accept()
        threading.Thread(target=_serve_link, args=(conn,), daemon=True).start()


# ---- the driver -----------------------------------------------------------------------------------------

class Child:
    """A server process that prints "listening on WHERE" once ready."""

    def __init__(self, cmd: list[str]) -> None:
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                     start_new_session=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("listening on "):
            self.stop()
            raise RuntimeError(f"{cmd[:3]} did not start: {line!r}")
        self.where = line.split()[-1]

    def stop(self) -> None:
        echo.stop_child(self.proc)


class Files:
    """The request, the expected reply and the route as files, for the Go processes."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.request = root / "request.bin"
        self.expect = root / "reply.bin"
        self.route = root / "route.bin"
        self.request.write_bytes(request_bytes())
        self.expect.write_bytes(expected_reply())
        self.route.write_bytes(ROUTES[TOPIC].SerializeToString())


@contextmanager
def running(name: str, files: Files) -> Iterator[tuple[str, list[int], list[int]]]:
    """Server `name` up: (its address, the pids of its Python processes, the pids of its Go processes)."""
    py = [sys.executable, "-m", "bench.frontecho"]
    children: list[Child] = []
    try:
        if name == "grpcio":
            children.append(Child(py + ["grpcio", "--addr", "127.0.0.1:0"]))
            yield children[0].where, [children[0].proc.pid], []
        elif name in ("front1", "front2"):
            socks = [str(files.root / f"{name}-worker{i}.sock") for i in range(int(name[-1]))]
            for path in socks:
                Path(path).unlink(missing_ok=True)
                children.append(Child(py + ["worker", "--socket", path]))
            front = Child([loadgen.build(GOFRONT), "front", "-addr", "127.0.0.1:0", "-workers", ",".join(socks)])
            children.append(front)
            yield front.where, [c.proc.pid for c in children[:-1]], [front.proc.pid]
        elif name == "goecho":
            children.append(Child([loadgen.build(GOFRONT), "echo", "-addr", "127.0.0.1:0", "-route",
                                   str(files.route), "-topic", TOPIC, "-offset", str(APPLY_OFFSET)]))
            yield children[0].where, [], [children[0].proc.pid]
        else:
            raise ValueError(f"server {name!r}: not one of {', '.join(SERVERS)}")
    finally:
        for child in reversed(children):
            child.stop()


def load(addr: str, files: Files, clients: int, seconds: float, conns: int = 0) -> dict[str, Any]:
    """`gofront load`'s JSON for one closed-loop load on `addr`."""
    cmd = [loadgen.build(GOFRONT), "load", "-addr", addr, "-method", GET_ROUTE, "-request", str(files.request),
           "-expect", str(files.expect), "-clients", str(clients), "-seconds", str(seconds), "-conns", str(conns)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60)
    if res.returncode != 0:
        raise RuntimeError(f"gofront load failed ({res.returncode}): {res.stderr.strip()[-500:]}")
    out: dict[str, Any] = json.loads(res.stdout)
    return out


def measure(name: str, files: Files, clients: int, seconds: float) -> dict[str, Any]:
    """One load on server `name`: the load generator's figures and the server processes' CPU per call."""
    with running(name, files) as (addr, py_pids, go_pids):
        py0, go0 = proc_cpu_s(py_pids), proc_cpu_s(go_pids)
        res = load(addr, files, clients, seconds)
        py_s, go_s = proc_cpu_s(py_pids) - py0, proc_cpu_s(go_pids) - go0
    calls = max(res["calls"], 1)
    return {"server": name, "clients": clients, "calls_per_s": round(res["calls_per_s"]),
            "p50_ms": round(res["p50_ms"], 3), "p99_ms": round(res["p99_ms"], 3),
            "server_us_per_call": round((py_s + go_s) / calls * 1e6, 1),
            "python_us_per_call": round(py_s / calls * 1e6, 1), "go_us_per_call": round(go_s / calls * 1e6, 1),
            "server_cores": round((py_s + go_s) / res["seconds"], 2),
            "load_us_per_call": round(res["cpu_us_per_call"], 1), "load_cores": round(res["cpu_cores"], 2),
            "errors": res["errors"] + res["mismatches"], "first_error": res["first_error"]}


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Each row's `vs_grpcio`: its server CPU per call over grpcio's in the same round at the same clients
    (the machine is shared: a ratio within a round is steadier than either figure)."""
    grpcio = {(row["round"], row["clients"]): float(row["server_us_per_call"]) for row in rows
              if row["server"] == "grpcio"}
    for row in rows:
        base = grpcio.get((row["round"], row["clients"]))
        if base:
            row["vs_grpcio"] = round(float(row["server_us_per_call"]) / base, 2)


def compare(seconds: float, clients: list[int], rounds: int, servers: tuple[str, ...]) -> list[dict[str, Any]]:
    """Each load on every server in turn (a b c a b c), `rounds` times over."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="frontecho-") as tmp:
        files = Files(Path(tmp))
        for r in range(rounds):
            for c in clients:
                for name in servers:
                    row = {"round": r + 1, **measure(name, files, c, seconds)}
                    print(json.dumps(row), flush=True)
                    rows.append(row)
    add_ratios(rows)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown: per server and clients, the median over rounds and [min-max] of each figure."""
    keys = ("calls_per_s", "p50_ms", "p99_ms", "server_us_per_call", "vs_grpcio", "python_us_per_call",
            "go_us_per_call", "load_us_per_call", "load_cores")
    lines = ["| server | clients | " + " | ".join(keys) + " | errors |", "|---" * (len(keys) + 3) + "|"]
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["server"], row["clients"]), []).append(row)
    for (server, c), group in sorted(groups.items(), key=lambda g: (g[0][1], SERVERS.index(g[0][0]))):
        cells = []
        for k in keys:
            vals = [float(g[k]) for g in group if k in g]
            if not vals:
                cells.append("")
                continue
            cells.append(f"{median(vals):g} [{min(vals):g}-{max(vals):g}]" if len(vals) > 1 else f"{vals[0]:g}")
        lines.append(f"| {server} | {c} | " + " | ".join(cells) + f" | {sum(g['errors'] for g in group)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("role", nargs="?", choices=("grpcio", "worker"), help="serve one server (else --compare)")
    p.add_argument("--addr", default="127.0.0.1:0")
    p.add_argument("--socket", help="worker: the Unix socket path to listen on")
    p.add_argument("--compare", action="store_true")
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--clients", default="1,16,64")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--servers", default=",".join(SERVERS), help=f"among {','.join(SERVERS)}")
    p.add_argument("--table", metavar="FILE", help="tabulate the JSON rows a --compare run printed to FILE")
    args = p.parse_args(argv)
    if args.role == "grpcio":
        serve_grpcio(args.addr)
    elif args.role == "worker":
        if not args.socket:
            p.error("worker: --socket PATH is required")
        serve_worker(args.socket)
    elif args.table:
        saved = [json.loads(line) for line in Path(args.table).read_text().splitlines() if line.startswith("{")]
        add_ratios(saved)
        print(table(saved))
    elif args.compare:
        rows = compare(args.seconds, [int(c) for c in args.clients.split(",")], args.rounds,
                       tuple(args.servers.split(",")))
        print(table(rows))
    else:
        p.error("a role (grpcio, worker) or --compare")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
