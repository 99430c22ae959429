"""The node's Go gRPC front end ([node] grpc_front = "go"), started and watched by the core.

One process (front/, built by nameserver/ops/gobuild.py) owns the node's gRPC port with the node's limits
and TLS and hands each call to the worker processes over their front sockets (nameserver/api/frontchannel.py),
round-robin over the live ones: a worker that restarts is dialled again, one that is gone gets no calls,
and with none the front end answers UNAVAILABLE. Its stdin is a pipe the core holds, so it exits with the
core; if it exits while the core runs it is started again after a backoff (0.5 s, doubling to 10 s). Its Go
runtime's GOMAXPROCS is set from the node's worker processes and CPUs (runtime_env).

Which front end a node runs is settled at its start (`settle`): "auto", the default, is the Go front end when
the node runs workers and the front end is built (`make setup`), else grpcio, said in the node's log.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import IO, NamedTuple

from nameserver.api import frontchannel
from nameserver.config import AUTO, NodeConfig, usable_cpus
from nameserver.ops import gobuild
from nameserver.pb import api_pb2

log = logging.getLogger("nameserver.front")

BACKOFF_MIN_S, BACKOFF_MAX_S = 0.5, 10.0
STABLE_S = 30.0
STOP_GRACE_S = 5.0
# grpcio's bound on a call's headers (its default max metadata size): the same on both front ends
MAX_HEADER_BYTES = 8 << 10


class Settled(NamedTuple):
    """[node] grpc_front as a node's core runs it (`settle`)."""

    cfg: NodeConfig  # grpc_front "go" or "grpcio", never "auto"
    binary: str  # with "go": the front end's program; else ""
    note: str  # with "auto" settled to "grpcio" on a node with workers: why, for the node's log; else ""


def settle(cfg: NodeConfig) -> Settled:
    """The front end a node's core starts. "go": the built front end, built now if it is not yet (as `make
    setup` would); a node whose front end cannot be built does not start (OSError naming the setting and
    `make setup`). "auto" (the default): "go" when the node runs workers and the front end is built, else
    "grpcio", with a note saying why when it has workers; it never builds at start, so a node's start does
    not wait on a compile or need a Go toolchain, and an install without front/ (deploy/k8s's image) serves
    as it did before "go" was the default."""
    if cfg.grpc_front == "go":
        try:
            return Settled(cfg, gobuild.build(gobuild.FRONT_SOURCE), "")
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:  # an OSError's text is one line
            raise OSError(f'[node] grpc_front = "go": the Go front end ({gobuild.FRONT_SOURCE}) is not built and '
                          f"could not be built now: {exc}. Run `make setup` (it builds the front end with Go), "
                          'or set [node] grpc_front = "grpcio"') from exc
    if cfg.grpc_front != AUTO:
        return Settled(cfg, "", "")
    binary = gobuild.built(gobuild.FRONT_SOURCE) if cfg.worker_processes and not cfg.replica_follow else None
    if binary is not None:
        return Settled(replace(cfg, grpc_front="go"), binary, "")
    note = (f"the Go front end ({gobuild.FRONT_SOURCE}) is not built for this checkout: run `make setup` (or "
            '`make front`) to serve through it; [node] grpc_front = "grpcio" says grpcio is meant, and silences this'
            if cfg.worker_processes and not cfg.replica_follow else "")
    return Settled(replace(cfg, grpc_front="grpcio"), "", note)


def counters_path(data_dir: str) -> str:
    """Where the front end writes its call counts by status code and its reply cache's counts, each second
    (for the core's /metrics)."""
    return os.path.join(data_dir, "channel", "front-calls")


# The Go runtime settings the node gives the front end's process when its own environment names none (an
# operator's export wins, as with etcd's). GOMAXPROCS: one per worker process, at most the CPUs the node may
# use (config.usable_cpus); Go's own default is every CPU. A call's Go work is at most about a worker's
# (docs/benchmarks.md, "The Go front end, cheaper per call"), so more Ps than workers add no throughput,
# only idle Ps whose threads spin and wake for each call: at 1 worker on 2 CPUs, 1 P instead of 2 cut the
# front end's system calls per call by 18-46 %, its thread wakes (futex) by 32-83 % and the cluster's CPU per
# route read by 30-40 % (docs/benchmarks.md, "Issue 27: the Go front end's runtime (session 25)").
RUNTIME_VARS = ("GOMAXPROCS",)


def runtime_env(cfg: NodeConfig, environ: Mapping[str, str] | None = None, cpus: int | None = None) -> dict[str, str]:
    """What the node adds to the front end's environment: GOMAXPROCS = its worker processes, at most its
    usable CPUs (at least 1), unless `environ` (the node's own) sets it already."""
    environ = os.environ if environ is None else environ
    cpus = usable_cpus() if cpus is None else cpus
    out = {"GOMAXPROCS": str(max(1, min(cpus, cfg.worker_processes)))}
    return {k: v for k, v in out.items() if k not in environ}


def command(cfg: NodeConfig, binary: str, max_connections: int) -> list[str]:
    """The front end's command line: the node's address, its workers' sockets, limits and TLS."""
    socks = [frontchannel.socket_path(cfg.data_dir, i) for i in range(cfg.worker_processes)]
    cmd = [binary, "-addr", cfg.grpc_addr, "-workers", ",".join(socks), "-counters", counters_path(cfg.data_dir),
           "-max-message", str(cfg.max_message_bytes), "-max-connections", str(max_connections),
           "-max-streams", str(cfg.grpc_max_streams_per_connection), "-max-header-bytes", str(MAX_HEADER_BYTES),
           "-handshake-timeout", f"{cfg.grpc_handshake_timeout_ms}ms", "-idle-timeout", f"{cfg.grpc_idle_timeout_ms}ms",
           "-cache-bytes", str(cfg.grpc_front_cache_mb << 20)]
    if cfg.tls_enabled:
        cmd += ["-tls-cert", cfg.tls_cert_file, "-tls-key", cfg.tls_key_file, "-client-auth", cfg.tls_client_auth]
        if cfg.tls_ca_file:
            cmd += ["-tls-ca", cfg.tls_ca_file]
    return cmd


class CacheCounts(NamedTuple):
    """The Go front end's reply cache (front/cache.go), as its counters file says it."""

    hits: dict[str, int]  # full method name -> calls answered from the cache
    misses: int  # calls of a reusable method looked up and not found
    entries: int
    bytes: int


class FrontProcess:
    """The front end's process: start(), restarted when it exits, stop()."""

    def __init__(self, cfg: NodeConfig, max_connections: int, binary: str = "") -> None:
        """`binary`: the front end's program (settle's); "": built at start."""
        self.cfg = cfg
        self.max_connections = max_connections
        self.binary = binary
        self.restarts_total = 0
        self._proc: subprocess.Popen | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._cmd: list[str] = []
        self._spawned_at = 0.0

    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def status(self) -> api_pb2.GrpcFront:
        """What Admin.Status says of the process (nsctl status)."""
        pid = self.pid()
        return api_pb2.GrpcFront(pid=pid or 0, up=pid is not None, restarts=self.restarts_total)

    def calls(self) -> dict[int, int]:
        """The calls the running front end answered, by status code number (written each second; a new
        process starts from none)."""
        return {int(row[0]): int(row[1]) for row in self._rows() if len(row) == 2 and row[0].isdigit()}

    def cache(self) -> CacheCounts:
        """The running front end's reply cache: its hits by method, its misses, what it holds now."""
        rows = self._rows()
        single = {row[0]: int(row[1]) for row in rows if len(row) == 2 and not row[0].isdigit()}
        return CacheCounts({row[1]: int(row[2]) for row in rows if len(row) == 3 and row[0] == "hit"},
                           single.get("miss", 0), single.get("entries", 0), single.get("bytes", 0))

    def _rows(self) -> list[list[str]]:
        """The counters file's lines (front/counters.go, front/cache.go): "CODE N" a status code answered,
        "hit METHOD N", "miss N", "entries N", "bytes N"."""
        try:
            with open(counters_path(self.cfg.data_dir)) as f:
                return [line.split() for line in f]
        except OSError:
            return []

    def start(self) -> None:
        binary = self.binary or settle(replace(self.cfg, grpc_front="go")).binary
        self._cmd = command(self.cfg, binary, self.max_connections)
        self._spawn()
        self._thread = threading.Thread(target=self._watch, name="front", daemon=True)
        self._thread.start()

    def _spawn(self) -> None:
        with contextlib.suppress(OSError):  # the last process's counts: this one starts from none
            os.unlink(counters_path(self.cfg.data_dir))
        runtime = runtime_env(self.cfg)
        proc = subprocess.Popen(self._cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env={**os.environ, **runtime})
        for stream, say in ((proc.stdout, log.info), (proc.stderr, log.warning)):
            assert stream is not None
            threading.Thread(target=_relay, args=(stream, say, proc.pid), name="front-output", daemon=True).start()
        self._proc, self._spawned_at = proc, time.monotonic()
        log.info("Go gRPC front end started: pid %d, for %d worker processes (%s)", proc.pid,
                 self.cfg.worker_processes, " ".join(f"{k}={os.environ.get(k, runtime.get(k))}" for k in RUNTIME_VARS))

    def _watch(self) -> None:
        backoff = BACKOFF_MIN_S
        while not self._stop.wait(0.2):
            proc = self._proc
            if proc is None or proc.poll() is None:
                continue
            if time.monotonic() - self._spawned_at >= STABLE_S:
                backoff = BACKOFF_MIN_S
            log.warning("Go gRPC front end (pid %d) exited with %s; starting it again in %.1f s", proc.pid,
                        proc.returncode, backoff)
            if self._stop.wait(backoff):
                return
            self.restarts_total += 1
            try:
                self._spawn()
            except OSError as exc:
                log.warning("Go gRPC front end could not be started: %s", exc)
            backoff = min(BACKOFF_MAX_S, backoff * 2)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
        try:
            proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()


def _relay(stream: IO[bytes], say: Callable[..., None], pid: int) -> None:
    with contextlib.suppress(OSError, ValueError):
        for line in stream:
            say("Go gRPC front end (pid %d): %s", pid, line.decode(errors="replace").rstrip())
