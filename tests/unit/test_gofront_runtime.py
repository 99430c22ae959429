"""The Go front end's runtime settings (nameserver/ops/gofront.py, runtime_env): GOMAXPROCS from the node's
worker processes and CPUs, and an operator's own export left as it is."""

from __future__ import annotations

import pytest

from nameserver.config import NodeConfig
from nameserver.ops import gofront


def _cfg(workers: int) -> NodeConfig:
    return NodeConfig(raft_addr="127.0.0.1:1", grpc_addr="127.0.0.1:2", data_dir="/tmp/x", members=[],
                      worker_processes=workers, grpc_front="go")


@pytest.mark.parametrize(("workers", "cpus", "procs"), [
    (1, 2, "1"),    # the compare's nodes: one worker on a 2-CPU machine, not Go's default of 2
    (2, 2, "2"),
    (4, 2, "2"),    # never more than the CPUs the node may use
    (8, 32, "8"),   # a bigger machine: one per worker, not all 32
    (0, 4, "1"),
])
def test_gomaxprocs_is_one_per_worker_within_the_cpus(workers: int, cpus: int, procs: str) -> None:
    assert gofront.runtime_env(_cfg(workers), environ={}, cpus=cpus) == {"GOMAXPROCS": procs}


def test_an_operators_own_gomaxprocs_is_kept() -> None:
    assert gofront.runtime_env(_cfg(1), environ={"GOMAXPROCS": "3"}, cpus=2) == {}
