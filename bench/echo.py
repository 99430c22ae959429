"""A bare Python gRPC echo server: the ceiling of this stack (grpcio, sync server, thread pool).

It runs as its own process with the same grpcio, the same server options and the same thread-pool
size as a nameserver node (nameserver/server.py, NodeConfig.workers), and answers a unary call by
returning the request bytes. No protobuf parsing, no Raft, no state: whatever a node does beyond
this is what our own code costs.

    python -m bench.echo --addr 127.0.0.1:0 [--workers 64] [--aio]   # prints "listening on HOST:PORT"
    python -m bench.echo --compare [--seconds 5] [--clients 1,4,12]  # sync vs grpc.aio, side by side

`--aio` serves the same echo from grpc.aio's server (one event loop, the handler a coroutine) instead:
issue 12 asks whether moving the hot reads there would lift the ceiling, and `--compare` measures
both servers under one load generator, one after the other.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import subprocess
import sys
import threading
from concurrent import futures

import grpc

from bench.load import new_channel, run_load
from nameserver.config import NodeConfig

SERVICE = "rip18.bench.Echo"
METHOD = f"/{SERVICE}/Echo"


def _default(name: str) -> int:
    return next(f.default for f in dataclasses.fields(NodeConfig) if f.name == name)  # type: ignore[return-value]


DEFAULT_WORKERS: int = _default("workers")
DEFAULT_MAX_MESSAGE: int = _default("max_message_bytes")


def serve(addr: str, workers: int = DEFAULT_WORKERS, max_message: int = DEFAULT_MAX_MESSAGE) -> tuple[grpc.Server, int]:
    # The same options nameserver/server.py gives a node's server.
    opts = [("grpc.max_send_message_length", max_message), ("grpc.max_receive_message_length", max_message),
            ("grpc.so_reuseport", 0)]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="grpc"), options=opts)
    # No (de)serializers: the handler sees and returns raw bytes.
    handler: grpc.RpcMethodHandler = grpc.unary_unary_rpc_method_handler(lambda request, context: request)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {"Echo": handler}),))
    port = server.add_insecure_port(addr)
    if port == 0:
        raise OSError(f"cannot listen on {addr}")
    server.start()
    return server, port


def serve_aio(addr: str, max_message: int = DEFAULT_MAX_MESSAGE) -> None:
    """The same echo on grpc.aio's server; runs until SIGTERM/SIGINT."""
    import asyncio

    async def run() -> None:
        opts = [("grpc.max_send_message_length", max_message), ("grpc.max_receive_message_length", max_message),
                ("grpc.so_reuseport", 0)]
        server = grpc.aio.server(options=opts)

        async def echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            return request

        handler: grpc.RpcMethodHandler = grpc.unary_unary_rpc_method_handler(echo)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {"Echo": handler}),))
        port = server.add_insecure_port(addr)
        if port == 0:
            raise OSError(f"cannot listen on {addr}")
        await server.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        print(f"listening on {addr.rsplit(':', 1)[0]}:{port}", flush=True)
        await stop.wait()
        await server.stop(1)

    asyncio.run(run())


def echo_stub(channel: grpc.Channel) -> grpc.UnaryUnaryMultiCallable:
    return channel.unary_unary(METHOD)


class EchoProcess:
    """The echo server as a child process (its own GIL, like a node), on a free 127.0.0.1 port."""

    def __init__(self, workers: int = DEFAULT_WORKERS, log_path: str | None = None, aio: bool = False) -> None:
        self.workers = workers
        self.log_path = log_path
        self.aio = aio
        self.proc: subprocess.Popen | None = None
        self.addr = ""

    def start(self, timeout: float = 30.0) -> str:
        with open(self.log_path or os.devnull, "ab") as log:  # the child keeps its own copy of the fd
            self.proc = subprocess.Popen([sys.executable, "-m", "bench.echo", "--addr", "127.0.0.1:0",
                                          "--workers", str(self.workers)] + (["--aio"] if self.aio else []),
                                         stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # blocks until the server is listening (or the child died)
        if not line.startswith("listening on "):
            self.stop()
            raise RuntimeError(f"echo server did not start: {line!r}")
        self.addr = line.split()[-1]
        channel = grpc.insecure_channel(self.addr)
        try:
            grpc.channel_ready_future(channel).result(timeout=timeout)
        finally:
            channel.close()
        return self.addr

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def __enter__(self) -> EchoProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def compare(seconds: float, clients: list[int], payload_bytes: int) -> list[dict[str, object]]:
    """calls/s of the sync and the aio echo server under the same client threads, one server at a time."""
    payload = b"r" * payload_bytes
    rows: list[dict[str, object]] = []
    for c in clients:
        for aio in (False, True):
            with EchoProcess(aio=aio) as echo:
                def make(i: int, addr: str = echo.addr) -> tuple[grpc.Channel, object]:
                    channel = new_channel(addr)
                    call = echo_stub(channel)
                    return channel, lambda: (call(payload, timeout=10), 0)[1]

                assert echo.proc is not None
                res = run_load(make, c, seconds, [echo.proc.pid])  # type: ignore[arg-type]
            row: dict[str, object] = {"server": "aio" if aio else "sync", "clients": c, **{k: res[k] for k in
                   ("per_s", "p50_ms", "p99_ms", "client_cpu_cores", "server_cpu_cores", "errors") if k in res}}
            rows.append(row)
            print(row, flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--addr", default="127.0.0.1:0")
    p.add_argument("--workers", type=int, default=DEFAULT_WORKERS)
    p.add_argument("--aio", action="store_true", help="serve from grpc.aio's server instead of the sync one")
    p.add_argument("--compare", action="store_true", help="measure the sync and the aio server side by side")
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--clients", default="1,4,12")
    p.add_argument("--payload", type=int, default=600, help="request and reply size in bytes (a route reply)")
    args = p.parse_args(argv)
    if args.compare:
        compare(args.seconds, [int(c) for c in args.clients.split(",")], args.payload)
        return 0
    if args.aio:
        serve_aio(args.addr)
        return 0
    server, port = serve(args.addr, args.workers)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    print(f"listening on {args.addr.rsplit(':', 1)[0]}:{port}", flush=True)
    stop.wait()
    server.stop(grace=1).wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
