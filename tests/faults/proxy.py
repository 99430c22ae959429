"""A userspace TCP proxy with per-direction delay and jitter (the kernel here has no netem).

Run as its own process (`python -m tests.faults.proxy --routes FILE --control FILE --stats FILE`), usually
inside a network namespace (`ip netns exec NS ...`). Every route listens on `listen` (host:port, or
unix:/path) and forwards each accepted connection to `upstream` (host:port). Bytes read from the client
side go "up", bytes read from the upstream side go "down"; each chunk is held for
delay ± jitter (uniform) before it is written on, without reordering (a chunk never overtakes the one
before it), as netem's delay does on a single flow.

Delays are per route class (`link`, e.g. "raft" or "grpc") and per direction, read from the control
file at start and again on SIGHUP:

    {"raft": {"up": {"delay_ms": 50, "jitter_ms": 30}, "down": {"delay_ms": 50, "jitter_ms": 30}}}

The stats file (JSON, rewritten every 0.25 s and after a reload) counts connections and bytes per route,
so a test can prove that traffic really went through the proxy. It is written once every listener is up:
its existence means the proxy is ready.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import random
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("faults.proxy")

CHUNK = 64 * 1024


@dataclass
class Direction:
    delay_ms: float = 0.0
    jitter_ms: float = 0.0

    def hold_s(self, rng: random.Random) -> float:
        if self.delay_ms <= 0 and self.jitter_ms <= 0:
            return 0.0
        return max(0.0, self.delay_ms + rng.uniform(-self.jitter_ms, self.jitter_ms)) / 1000.0


@dataclass
class Route:
    name: str
    listen: str
    upstream: str
    link: str = "default"
    conns: int = 0
    open: int = 0
    up_bytes: int = 0
    down_bytes: int = 0
    refused: int = 0  # upstream connect failures
    max_hold_ms: float = 0.0  # the longest hold applied to a chunk: evidence that delay was in force
    server: asyncio.AbstractServer | None = field(default=None, repr=False)


class Proxy:
    def __init__(self, routes: list[Route], control_path: str | None, stats_path: str | None,
                 seed: int | None = None) -> None:
        self.routes = routes
        self.control_path = control_path
        self.stats_path = stats_path
        self.rng = random.Random(seed)
        self.delays: dict[str, dict[str, Direction]] = {}
        self.reloads = 0

    def reload(self) -> None:
        cfg: dict[str, Any] = {}
        if self.control_path and os.path.exists(self.control_path):
            with open(self.control_path) as f:
                cfg = json.load(f)
        self.delays = {link: {d: Direction(**spec.get(d, {})) for d in ("up", "down")}
                       for link, spec in cfg.items()}
        self.reloads += 1
        log.info("delays now %s", {k: {d: vars(v) for d, v in dirs.items()} for k, dirs in self.delays.items()})
        self.write_stats()

    def direction(self, route: Route, way: str) -> Direction:
        return self.delays.get(route.link, self.delays.get("*", {})).get(way, Direction())

    def write_stats(self) -> None:
        if not self.stats_path:
            return
        doc = {"pid": os.getpid(), "time": time.time(), "reloads": self.reloads,
               "delays": {k: {d: vars(v) for d, v in dirs.items()} for k, dirs in self.delays.items()},
               "routes": {r.name: {"listen": r.listen, "upstream": r.upstream, "link": r.link, "conns": r.conns,
                                   "open": r.open, "up_bytes": r.up_bytes, "down_bytes": r.down_bytes,
                                   "refused": r.refused, "max_hold_ms": round(r.max_hold_ms, 1)}
                          for r in self.routes}}
        tmp = f"{self.stats_path}.tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f)
        os.replace(tmp, self.stats_path)  # readers never see a half-written file

    async def serve(self) -> None:
        for route in self.routes:
            handler = self._handler(route)
            if route.listen.startswith("unix:"):
                path = route.listen[len("unix:"):]
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                route.server = await asyncio.start_unix_server(handler, path=path)
            else:
                host, port = route.listen.rsplit(":", 1)
                route.server = await asyncio.start_server(handler, host, int(port), reuse_address=True)
            log.info("route %s: %s -> %s (%s)", route.name, route.listen, route.upstream, route.link)
        self.reload()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGHUP, self.reload)
        stop = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        loop.add_signal_handler(signal.SIGINT, stop.set)
        while not stop.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.25)
            self.write_stats()
        log.info("stopping")

    def _handler(self, route: Route):  # noqa: ANN202 - asyncio's callback type is long
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            route.conns += 1
            host, port = route.upstream.rsplit(":", 1)
            try:
                up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), 5)
            except (TimeoutError, OSError) as exc:
                route.refused += 1
                log.info("route %s: upstream %s refused: %s", route.name, route.upstream, exc)
                writer.close()
                return
            route.open += 1
            log.info("route %s: connection %d open", route.name, route.conns)
            try:
                await asyncio.gather(self._pipe(route, "up", reader, up_writer),
                                     self._pipe(route, "down", up_reader, writer))
            finally:
                route.open -= 1
                for w in (writer, up_writer):
                    w.close()

        return handle

    async def _pipe(self, route: Route, way: str, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        # Reader and writer are decoupled by a queue so a delayed chunk does not stop the next from
        # being read (the delay is latency, not a bandwidth cap).
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        loop = asyncio.get_running_loop()

        async def read() -> None:
            last = 0.0
            try:
                while True:
                    data = await src.read(CHUNK)
                    hold = self.direction(route, way).hold_s(self.rng)
                    route.max_hold_ms = max(route.max_hold_ms, hold * 1000)
                    last = max(last, loop.time() + hold)  # never overtake the previous chunk
                    await queue.put((last, data))
                    if not data:
                        return
                    if way == "up":
                        route.up_bytes += len(data)
                    else:
                        route.down_bytes += len(data)
            except (OSError, asyncio.IncompleteReadError):
                await queue.put((loop.time(), b""))

        async def write() -> None:
            try:
                while True:
                    at, data = await queue.get()
                    wait = at - loop.time()
                    if wait > 0:
                        await asyncio.sleep(wait)
                    if not data:
                        with contextlib.suppress(OSError):
                            if dst.can_write_eof():
                                dst.write_eof()
                        return
                    dst.write(data)
                    await dst.drain()
            except OSError:
                return

        reader_task = asyncio.ensure_future(read())
        try:
            await write()
        finally:
            reader_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await reader_task
            dst.close()


def load_routes(path: str) -> list[Route]:
    with open(path) as f:
        return [Route(name=r["name"], listen=r["listen"], upstream=r["upstream"], link=r.get("link", "default"))
                for r in json.load(f)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--routes", required=True, help="JSON list of {name, listen, upstream, link}")
    p.add_argument("--control", help="JSON delays per link class, re-read on SIGHUP")
    p.add_argument("--stats", help="JSON counters, rewritten every 0.25 s")
    p.add_argument("--seed", type=int, default=None)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s proxy[%(process)d] %(message)s")
    proxy = Proxy(load_routes(args.routes), args.control, args.stats, args.seed)
    asyncio.run(proxy.serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
