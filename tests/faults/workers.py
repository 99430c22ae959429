"""The fault suite with worker processes ([node] worker_processes; nameserver/ops/workers.py).

FAULTS_WORKERS=N starts every node of the suite's clusters with N workers (tests/faults/conftest.py), and
the Nemesis (tests/faults/harness.py) then also SIGKILLs one worker of a node during each of its faults.
A node's workers are its core's children; a killed one is started again by the core, and `Run.verify`
(tests/faults/scenario.py) waits for every node to have all its workers listening again.

FAULTS_GRPC_FRONT=go runs the nodes' workers behind the Go gRPC front end ([node] grpc_front; "" or unset:
the node's default, "auto": the Go front end when `make setup` built it): the front end owns the gRPC port
and a worker serves through its front socket. FAULTS_GRPC_FRONT=grpcio: each worker's grpcio on the port.
"""

from __future__ import annotations

import os
import random
import signal
import time

from bench.procnet import children, grpc_serving, is_worker
from tests.cluster import Cluster, NodeProc

WORKERS = int(os.environ.get("FAULTS_WORKERS", "0"))
GRPC_FRONT = os.environ.get("FAULTS_GRPC_FRONT", "")


def workers_of(node: NodeProc) -> list[int]:
    """The pids of `node`'s live worker processes (its core's children running nameserver.worker)."""
    if not node.alive:
        return []
    assert node.proc is not None
    return [pid for pid in children(node.proc.pid) if is_worker(pid)]


def serving(node: NodeProc) -> list[int]:
    """Of `node`'s workers, those listening on its public gRPC port; behind the Go front end (grpc_front =
    "go"), those listening on their front socket while the front end listens on the port (none without it)."""
    if not node.alive:
        return []
    assert node.proc is not None
    return grpc_serving(node.proc.pid, int(node.grpc_addr.rsplit(":", 1)[1]))


def kill_one(node: NodeProc, rng: random.Random) -> int | None:
    """SIGKILL one of `node`'s workers, chosen with `rng`; its pid, or None when it has none running."""
    pids = sorted(workers_of(node))
    if not pids:
        return None
    victim = rng.choice(pids)
    try:
        os.kill(victim, signal.SIGKILL)
    except ProcessLookupError:
        return None
    return victim


def wait_serving(cluster: Cluster, timeout: float) -> None:
    """Every live node has all its workers listening on its gRPC port (the killed ones restarted)."""
    want = cluster.worker_processes
    if not want:
        return
    deadline = time.monotonic() + timeout
    while True:
        short = {n.name: serving(n) for n in cluster.nodes if n.alive and len(serving(n)) != want}
        if not short:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"workers not all back after {timeout:.0f} s (want {want} a node, listening: "
                                 f"{short})\n{cluster.logs()}")
        time.sleep(0.2)
