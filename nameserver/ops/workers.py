"""The node's child processes, started and watched by the core: its remoting worker processes ([node]
worker_processes; docs/architecture.md, "Processes") and, with [sharding] groups > 1, its group cores
(nameserver/groupcore.py). One supervisor for both (`Children` says which).

Each worker is `python -m nameserver.worker --index I --core-pid P`, given the core's configuration on
its stdin (pickled: the same settings, command-line overrides and secrets as the core, never in argv
or the environment). The pipe stays open: a worker stops at its end-of-file, so it never outlives the
core, which also asks the kernel to kill it when the core dies (PR_SET_PDEATHSIG, nameserver/worker.py).
A worker that exits is started again after a backoff (0.5 s, doubling to 10 s; back to 0.5 s once one
ran 30 s), and counted.

At the node's start no more processes load the state at once than the node has CPUs: the core and the
first cores - 1 workers (at least one) start together, the rest once one worker says it serves (a line
on its stdout) or DEFER_BOUND_S later. Each process loads its own copy of the state (a million records:
~2.5 s of one CPU each): three loads on two CPUs would hold the node's ports closed ~1.5x longer.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import pickle
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import IO

from nameserver.config import NodeConfig
from nameserver.ops.workermetrics import ENV as METRICS_ENV

log = logging.getLogger("nameserver.workers")

BACKOFF_MIN_S, BACKOFF_MAX_S = 0.5, 10.0
STABLE_S = 30.0       # a worker that ran this long restarts after the shortest backoff again
CHECK_EVERY_S = 0.2
STOP_GRACE_S = 5.0
SERVING = b"serving\n"  # what a worker writes on its stdout once its ports are open (nameserver/worker.py)
DEFER_BOUND_S = 60.0  # the deferred workers start after this even if none said it serves


@dataclass(frozen=True)
class Children:
    """What a supervisor runs: `python -m <module> <flag> I --core-pid P` for each I of `indexes`."""

    what: str                  # for the log: "remoting worker", "group core"
    module: str
    flag: str
    indexes: tuple[int, ...]
    staggered: bool = True     # no more state loads at once than CPUs (below); False: every one at the start


def workers_of(cfg: NodeConfig) -> Children:
    return Children("remoting worker", "nameserver.worker", "--index", tuple(range(cfg.worker_processes)))


def group_cores_of(cfg: NodeConfig) -> Children:
    """Groups 1..G-1 (the core itself runs group 0). They load disjoint states, each needed for its writes:
    all start at once."""
    return Children("group core", "nameserver.groupcore", "--group", tuple(range(1, cfg.groups)), staggered=False)


def loading_at_once(workers: int, cpus: int) -> int:
    """How many of `workers` start with the core: the core and they fill the CPUs, one at least."""
    return min(workers, max(1, cpus - 1))


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker reads from its stdin."""

    cfg: NodeConfig
    log_format: str = "text"
    log_level: str = "INFO"
    # the core's largest remoting reply per code so far: a worker's reply budget starts from them instead of
    # reserving a connection's whole share for each code it has not answered yet (SYSTEM_BUSY in a burst)
    reply_sizes: dict[int, int] = field(default_factory=dict)


def process_share(cfg: NodeConfig) -> NodeConfig:
    """Each worker's connection limits: the node's public ports are the workers' alone (the core keeps
    only private sockets: nameserver/api/corelink.py, nameserver/remoting/corechannel.py), so each
    connection cap is divided among them (the kernel spreads connections about evenly). The
    unsent-bytes total stays per process: divided, a process would answer SYSTEM_BUSY to its fifth fresh
    connection (a code never answered yet reserves a connection's whole 32 MiB share: 4 of them fill 128 MiB)."""
    if not cfg.remoting_max_connections:  # each process takes what its own descriptor limit leaves
        return cfg
    workers = max(1, cfg.worker_processes)
    return replace(cfg, remoting_max_connections=max(1, cfg.remoting_max_connections // workers),
                   grpc_max_connections=max(1, cfg.grpc_max_connections // workers))


class WorkerSupervisor:
    def __init__(self, spec: WorkerSpec, on_exit: Callable[[int], None] | None = None,
                 reply_sizes: Callable[[], dict[int, int]] | None = None, metrics_dir: str | None = None,
                 children: Children | None = None) -> None:
        """`children`: which processes (default: the remoting workers of spec.cfg);
        `on_exit(pid)`: told of each worker that exited (the core closes what it held for it);
        `reply_sizes()`: what a worker starting now begins its reply budget with (WorkerSpec);
        `metrics_dir`: where the workers keep their metric files (nameserver/ops/workermetrics.py), None
        for no metrics."""
        self.spec = spec
        # prometheus_client counts in files under this variable when it is set as it is imported
        self.env = {k: v for k, v in os.environ.items() if k != METRICS_ENV}
        if metrics_dir is not None:
            self.env[METRICS_ENV] = metrics_dir
        self.reply_sizes = reply_sizes
        self.children = children or workers_of(spec.cfg)
        self.count = len(self.children.indexes)
        self.on_exit = on_exit
        self.restarts_total = 0
        self._procs: list[subprocess.Popen | None] = [None] * self.count
        self._started = [0.0] * self.count
        self._backoff = [BACKOFF_MIN_S] * self.count
        self._due = [0.0] * self.count  # when a dead worker starts again
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._served = threading.Event()  # a worker has said it serves (its ports are open)
        self._release_at = math.inf  # when the workers deferred at the start begin, at the latest

    def alive(self) -> int:
        with self._lock:
            return sum(1 for p in self._procs if p is not None and p.poll() is None)

    def pids(self) -> list[int]:
        with self._lock:
            return [p.pid for p in self._procs if p is not None and p.poll() is None]

    def start(self) -> None:
        first = (loading_at_once(self.count, len(os.sched_getaffinity(0))) if self.children.staggered
                 else self.count)
        for i in range(first):
            self._spawn(i)
        self._due[first:] = [math.inf] * (self.count - first)
        self._release_at = time.monotonic() + DEFER_BOUND_S
        self._thread = threading.Thread(target=self._watch, name="workers", daemon=True)
        self._thread.start()
        what = self.children.what.removeprefix("remoting ")  # "worker process(es)", as ever; "group core ..."
        log.info("started %d %s process(es): pids %s%s", first, what, self.pids(),
                 f"; {self.count - first} more once one serves (no more loads at once than CPUs)"
                 if first < self.count else "")

    def _spawn(self, i: int) -> subprocess.Popen:
        kind = self.children
        proc = subprocess.Popen([sys.executable, "-m", kind.module, kind.flag, str(kind.indexes[i]),
                                 "--core-pid", str(os.getpid())], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                env=self.env)
        assert proc.stdin is not None and proc.stdout is not None
        threading.Thread(target=self._read_stdout, args=(proc.stdout,), name=f"{kind.module}-{i}-stdout",
                         daemon=True).start()
        spec = replace(self.spec, reply_sizes=self.reply_sizes()) if self.reply_sizes is not None else self.spec
        try:
            proc.stdin.write(pickle.dumps(spec))
            proc.stdin.flush()  # left open: its end tells the worker the core is gone
        except OSError as exc:
            log.warning("%s %d (pid %d) did not take its configuration: %s", kind.what, kind.indexes[i], proc.pid,
                        exc)
        with self._lock:
            self._procs[i] = proc
        self._started[i] = time.monotonic()
        return proc

    def _read_stdout(self, stdout: IO[bytes]) -> None:
        """Until the worker's stdout ends: note that it serves; pass anything else on to ours."""
        with contextlib.suppress(OSError, ValueError):
            for line in stdout:
                if line == SERVING:
                    self._served.set()
                else:
                    sys.stdout.buffer.write(line)
                    sys.stdout.buffer.flush()

    def _watch(self) -> None:
        while not self._stop.wait(CHECK_EVERY_S):
            now = time.monotonic()
            if self._release_at != math.inf and (self._served.is_set() or now >= self._release_at):
                self._release_at = math.inf
                self._due = [now if due == math.inf else due for due in self._due]
            for i, proc in enumerate(self._procs):
                if proc is not None and proc.poll() is not None:
                    self._exited(i, proc, now)
                elif proc is None and now >= self._due[i] and not self._stop.is_set():
                    first_start = self._started[i] == 0.0
                    self.restarts_total += 0 if first_start else 1
                    what, index = self.children.what, self.children.indexes[i]
                    try:
                        pid = self._spawn(i).pid
                        if first_start:
                            log.info("%s %d started: pid %d (one serves now)", what, index, pid)
                        else:
                            log.info("%s %d restarted: pid %d (%d restarts)", what, index, pid, self.restarts_total)
                    except OSError as exc:  # out of processes or memory: try again after the backoff
                        log.warning("%s %d could not be started: %s; trying again in %.1f s", what, index,
                                    exc, self._retry_later(i, now))

    def _retry_later(self, i: int, now: float) -> float:
        """Start worker `i` after its backoff, which doubles for next time; returns the wait."""
        wait = self._backoff[i]
        self._due[i] = now + wait
        self._backoff[i] = min(BACKOFF_MAX_S, wait * 2)
        return wait

    def _exited(self, i: int, proc: subprocess.Popen, now: float) -> None:
        if now - self._started[i] >= STABLE_S:
            self._backoff[i] = BACKOFF_MIN_S
        what, index = self.children.what, self.children.indexes[i]
        log.warning("%s %d (pid %d) exited with %s; starting it again in %.1f s", what, index, proc.pid,
                    proc.returncode, self._retry_later(i, now))
        if proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        with self._lock:
            self._procs[i] = None
        if self.on_exit is not None:
            try:
                self.on_exit(proc.pid)
            except Exception:  # the core's bookkeeping must not stop the supervision
                log.exception("%s %d: cleanup after its exit failed", what, index)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._lock:
            procs = [p for p in self._procs if p is not None]
        for proc in procs:
            if proc.stdin is not None:
                with contextlib.suppress(OSError):
                    proc.stdin.close()
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + STOP_GRACE_S
        for proc in procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
