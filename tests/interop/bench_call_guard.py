"""Server CPU per unary gRPC echo call: plain, served as request-streaming (what the call guard does to a
unary method so the wait for its request can be bounded), and through the whole call guard
(nameserver/api/callguard.py). The server runs in a subprocess; rounds alternate the three.

    /work/main/.venv/bin/python -m tests.interop.bench_call_guard [rounds]
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent import futures
from typing import Any

import grpc

from bench.load import proc_cpu_s
from nameserver.api.callguard import CallGuard

MODES = ("plain", "as-stream", "guard")


class AsStream(grpc.ServerInterceptor):
    """A unary method served as request-streaming, reading its one message: the guard's shape, no more."""

    def intercept_service(self, continuation: Any, details: grpc.HandlerCallDetails) -> Any:
        behavior = continuation(details).unary_unary
        return grpc.stream_unary_rpc_method_handler(lambda requests, context: behavior(next(requests), context))


def serve(mode: str, port_file: str) -> None:
    handlers = grpc.method_handlers_generic_handler(
        "t.G", {"Echo": grpc.unary_unary_rpc_method_handler(lambda request, context: request)})
    interceptors: list[grpc.ServerInterceptor] = (
        [CallGuard(10_000, 16, 4)] if mode == "guard" else [AsStream()] if mode == "as-stream" else [])
    server = grpc.server(futures.ThreadPoolExecutor(8), handlers=[handlers], interceptors=interceptors)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    with open(port_file, "w") as f:
        f.write(str(port))
    server.wait_for_termination()


def run(mode: str, calls: int = 20_000, threads: int = 4) -> tuple[float, float]:
    """(server CPU us per call, calls/s)."""
    port_file = os.path.join(tempfile.mkdtemp(prefix="bench-call-guard-"), "port")
    proc = subprocess.Popen([sys.executable, "-m", "tests.interop.bench_call_guard", "serve", mode, port_file])
    try:
        while not os.path.exists(port_file) or not os.path.getsize(port_file):
            time.sleep(0.05)
        with open(port_file) as f:
            port = f.read()
        with grpc.insecure_channel("127.0.0.1:" + port) as channel:
            echo = channel.unary_unary("/t.G/Echo")
            for _ in range(500):
                echo(b"x" * 50)
            cpu0, t0 = proc_cpu_s([proc.pid]), time.monotonic()

            def client() -> None:
                for _ in range(calls // threads):
                    echo(b"x" * 50)

            workers = [threading.Thread(target=client) for _ in range(threads)]
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            cpu1, t1 = proc_cpu_s([proc.pid]), time.monotonic()
    finally:
        proc.kill()
    return (cpu1 - cpu0) / calls * 1e6, calls / (t1 - t0)


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    results: dict[str, list[tuple[float, float]]] = {m: [] for m in MODES}
    for _ in range(rounds):
        for mode in MODES:
            results[mode].append(run(mode))
    for mode, runs in results.items():
        print(mode, " ".join(f"{cpu:.0f} us/{rate:.0f}/s" for cpu, rate in runs))
    median = {m: statistics.median(cpu for cpu, _ in runs) for m, runs in results.items()}
    print("server CPU per call (median): " + ", ".join(
        f"{m} {median[m]:.0f} us ({median[m] / median['plain']:.2f})" for m in MODES))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "serve":
        serve(sys.argv[2], sys.argv[3])
    else:
        main()
