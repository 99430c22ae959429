"""A bare Python gRPC echo server: the ceiling of this stack (grpcio, sync server, thread pool).

It runs as its own process with the same grpcio, the same server options and the same thread-pool
size as a nameserver node (nameserver/server.py, NodeConfig.workers), and answers a unary call by
returning the request bytes. No protobuf parsing, no Raft, no state: whatever a node does beyond
this is what our own code costs.

    python -m bench.echo --addr 127.0.0.1:0 [--workers 64] [--aio [--uvloop]]  # prints "listening on HOST:PORT"
    python -m bench.echo --compare [--seconds 5] [--clients 1,4,12] [--rounds 3] [--servers sync,aio,aio-uvloop]

`--aio` serves the same echo from grpc.aio's server (one event loop, the handler a coroutine) instead,
on asyncio's default loop or, with `--uvloop`, on uvloop's. `--compare` measures the servers under one
load generator, one after the other, `--rounds` times over (the machine is shared: compare each round's
ratios), and prints each server's CPU per call beside the sync server's of the same round.
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

from bench.load import new_channel, proc_cpu_s, run_load
from nameserver.config import NodeConfig

SERVICE = "rip18.bench.Echo"
METHOD = f"/{SERVICE}/Echo"


def _default(name: str) -> int:
    return next(f.default for f in dataclasses.fields(NodeConfig) if f.name == name)  # type: ignore[return-value]


DEFAULT_WORKERS: int = _default("workers")
DEFAULT_MAX_MESSAGE: int = _default("max_message_bytes")


def _options(max_message: int) -> list[tuple[str, int]]:
    # The same options nameserver/server.py gives a node's server.
    return [("grpc.max_send_message_length", max_message), ("grpc.max_receive_message_length", max_message),
            ("grpc.so_reuseport", 0)]


def serve(addr: str, workers: int = DEFAULT_WORKERS, max_message: int = DEFAULT_MAX_MESSAGE,
          service: str = SERVICE, methods: dict[str, grpc.RpcMethodHandler] | None = None
          ) -> tuple[grpc.Server, int]:
    """The echo's server (or, given `service` and `methods`, those methods on the same server)."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="grpc"),
                         options=_options(max_message))
    if methods is None:
        # No (de)serializers: the handler sees and returns raw bytes.
        methods = {"Echo": grpc.unary_unary_rpc_method_handler(lambda request, context: request)}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, methods),))
    port = server.add_insecure_port(addr)
    if port == 0:
        raise OSError(f"cannot listen on {addr}")
    server.start()
    return server, port


def serve_aio(addr: str, max_message: int = DEFAULT_MAX_MESSAGE, uvloop: bool = False) -> None:
    """The same echo on grpc.aio's server (on uvloop's loop if asked); runs until SIGTERM/SIGINT."""
    import asyncio

    async def run() -> None:
        server = grpc.aio.server(options=_options(max_message))

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

    if uvloop:
        import uvloop as uv
        uv.run(run())
    else:
        asyncio.run(run())


def echo_stub(channel: grpc.Channel) -> grpc.UnaryUnaryMultiCallable:
    return channel.unary_unary(METHOD)


def stop_child(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after 10 s; its stdout pipe closed."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    if proc.stdout is not None:
        proc.stdout.close()


class EchoProcess:
    """The echo server as a child process (its own GIL, like a node), on a free 127.0.0.1 port."""

    def __init__(self, workers: int = DEFAULT_WORKERS, log_path: str | None = None, aio: bool = False,
                 uvloop: bool = False) -> None:
        self.workers = workers
        self.log_path = log_path
        self.aio = aio
        self.uvloop = uvloop
        self.proc: subprocess.Popen | None = None
        self.addr = ""

    def start(self, timeout: float = 30.0) -> str:
        with open(self.log_path or os.devnull, "ab") as log:  # the child keeps its own copy of the fd
            self.proc = subprocess.Popen([sys.executable, "-m", "bench.echo", "--addr", "127.0.0.1:0",
                                          "--workers", str(self.workers)] + (["--aio"] if self.aio else [])
                                         + (["--uvloop"] if self.uvloop else []),
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
        if self.proc is not None:
            stop_child(self.proc)

    def __enter__(self) -> EchoProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


SERVERS = {"sync": {}, "aio": {"aio": True}, "aio-uvloop": {"aio": True, "uvloop": True}}


def _report(rows: list[dict[str, object]], load: list[dict[str, object]]) -> None:
    """Adds one load's rows (one per server), each with `vs_sync`: its CPU per call over the sync server's."""
    sync_us = next((float(row["server_us_per_op"]) for row in load if row["server"] == "sync"), 0.0)  # type: ignore[arg-type]
    for row in load:
        if row["server"] != "sync" and sync_us:
            row["vs_sync"] = round(float(row["server_us_per_op"]) / sync_us, 2)  # type: ignore[arg-type]
        rows.append(row)
        print(row, flush=True)


def compare(seconds: float, clients: list[int], payload_bytes: int, rounds: int = 1,
            servers: tuple[str, ...] = ("sync", "aio")) -> list[dict[str, object]]:
    """calls/s and server CPU per call of each server under the same client threads, one server at a time,
    `rounds` times over."""
    payload = b"r" * payload_bytes
    rows: list[dict[str, object]] = []
    for r in range(rounds):
        for c in clients:
            load: list[dict[str, object]] = []
            for name in servers:
                with EchoProcess(**SERVERS[name]) as echo:  # type: ignore[arg-type]
                    def make(i: int, addr: str = echo.addr) -> tuple[grpc.Channel, object]:
                        channel = new_channel(addr)
                        call = echo_stub(channel)
                        return channel, lambda: (call(payload, timeout=10), 0)[1]

                    assert echo.proc is not None
                    res = run_load(make, c, seconds, [echo.proc.pid])  # type: ignore[arg-type]
                load.append({"round": r + 1, "server": name, "clients": c, **{k: res[k] for k in
                             ("per_s", "p50_ms", "p99_ms", "client_cpu_cores", "server_cpu_cores",
                              "server_us_per_op", "errors") if k in res}})
            _report(rows, load)
    return rows


def _interleaved_load(servers: tuple[str, ...], clients: int, seconds: float,
                      payload: bytes) -> tuple[dict[str, object], list[float]]:
    """One load over every server at once: run_load's result (a turn is one call to each) and each server's
    CPU seconds over it."""
    procs = [EchoProcess(**SERVERS[name]) for name in servers]  # type: ignore[arg-type]
    extra: list[grpc.Channel] = []  # the channels run_load does not close (all but each client's first)
    try:
        for proc in procs:
            proc.start()

        def make(i: int) -> tuple[grpc.Channel, object]:
            channels = [new_channel(proc.addr) for proc in procs]
            extra.extend(channels[1:])
            for ch in channels[1:]:
                grpc.channel_ready_future(ch).result(timeout=15)
            calls = [echo_stub(ch) for ch in channels]

            def turn() -> int:
                for call in calls:
                    call(payload, timeout=10)
                return 0
            return channels[0], turn

        pids = [proc.proc.pid for proc in procs if proc.proc is not None]
        cpu0 = [proc_cpu_s([pid]) for pid in pids]
        res = run_load(make, clients, seconds, pids)  # type: ignore[arg-type]
        return res, [proc_cpu_s([pid]) - before for pid, before in zip(pids, cpu0, strict=True)]
    finally:
        for ch in extra:
            ch.close()
        for proc in procs:
            proc.stop()


def compare_interleaved(seconds: float, clients: list[int], payload_bytes: int, rounds: int = 1,
                        servers: tuple[str, ...] = ("sync", "aio")) -> list[dict[str, object]]:
    """Every server up at once; each client thread calls them in turn (one call to each per turn), so all
    see the same calls at the same moments of a shared, noisy machine: the fairest CPU-per-call pairing."""
    payload = b"r" * payload_bytes
    rows: list[dict[str, object]] = []
    for r in range(rounds):
        for c in clients:
            res, spent = _interleaved_load(servers, c, seconds, payload)
            turns = float(res["per_s"]) * float(res["seconds"])  # type: ignore[arg-type]
            _report(rows, [{"round": r + 1, "server": name, "clients": c, "turns_per_s": res["per_s"],
                            "server_us_per_op": round(cpu / turns * 1e6, 1) if turns else 0.0,
                            "errors": res["errors"]} for name, cpu in zip(servers, spent, strict=True)])
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--addr", default="127.0.0.1:0")
    p.add_argument("--workers", type=int, default=DEFAULT_WORKERS)
    p.add_argument("--aio", action="store_true", help="serve from grpc.aio's server instead of the sync one")
    p.add_argument("--compare", action="store_true", help="measure the sync and the aio server side by side")
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--clients", default="1,4,12")
    p.add_argument("--uvloop", action="store_true", help="with --aio: run grpc.aio on uvloop's event loop")
    p.add_argument("--rounds", type=int, default=1, help="with --compare: measure every server this many times")
    p.add_argument("--interleave", action="store_true",
                   help="with --compare: every server up at once, each client calling them in turn")
    p.add_argument("--servers", default="sync,aio", help=f"with --compare: among {','.join(SERVERS)}")
    p.add_argument("--payload", type=int, default=600, help="request and reply size in bytes (a route reply)")
    args = p.parse_args(argv)
    if args.compare:
        (compare_interleaved if args.interleave else compare)(
            args.seconds, [int(c) for c in args.clients.split(",")], args.payload, args.rounds,
            tuple(args.servers.split(",")))
        return 0
    if args.aio:
        serve_aio(args.addr, uvloop=args.uvloop)
        return 0
    serve_until_stopped(args.addr, *serve(args.addr, args.workers))
    return 0


def serve_until_stopped(addr: str, server: grpc.Server, port: int) -> None:
    """Says where `server` listens, then serves until SIGTERM or SIGINT."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    print(f"listening on {addr.rsplit(':', 1)[0]}:{port}", flush=True)
    stop.wait()
    server.stop(grace=1).wait()


if __name__ == "__main__":
    raise SystemExit(main())
