"""A bare Python gRPC echo server: the ceiling of this stack (grpcio, sync server, thread pool).

It runs as its own process with the same grpcio, the same server options and the same thread-pool
size as a nameserver node (nameserver/server.py, NodeConfig.workers), and answers a unary call by
returning the request bytes. No protobuf parsing, no Raft, no state: whatever a node does beyond
this is what our own code costs.

    python -m bench.echo --addr 127.0.0.1:0 [--workers 64]   # prints "listening on HOST:PORT"
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
    handler = grpc.unary_unary_rpc_method_handler(lambda request, context: request)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {"Echo": handler}),))
    port = server.add_insecure_port(addr)
    if port == 0:
        raise OSError(f"cannot listen on {addr}")
    server.start()
    return server, port


def echo_stub(channel: grpc.Channel) -> grpc.UnaryUnaryMultiCallable:
    return channel.unary_unary(METHOD)


class EchoProcess:
    """The echo server as a child process (its own GIL, like a node), on a free 127.0.0.1 port."""

    def __init__(self, workers: int = DEFAULT_WORKERS, log_path: str | None = None) -> None:
        self.workers = workers
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self.addr = ""

    def start(self, timeout: float = 30.0) -> str:
        with open(self.log_path or os.devnull, "ab") as log:  # the child keeps its own copy of the fd
            self.proc = subprocess.Popen([sys.executable, "-m", "bench.echo", "--addr", "127.0.0.1:0",
                                          "--workers", str(self.workers)], stdout=subprocess.PIPE, stderr=log,
                                         text=True, start_new_session=True)
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--addr", default="127.0.0.1:0")
    p.add_argument("--workers", type=int, default=DEFAULT_WORKERS)
    args = p.parse_args(argv)
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
