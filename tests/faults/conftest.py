"""Fixtures of the fault suite: one teardown stack, so a test's resources go in reverse order of creation
(node processes before the tmpfs they write to, both before the namespaces they run in), even when the
test fails."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import pytest

from tests.cluster import Cluster
from tests.faults.netns import Lab, NetnsCluster, NetnsUnavailable
from tests.faults.scenario import Run
from tests.faults.workers import GRPC_FRONT, WORKERS


@pytest.fixture
def teardown() -> Iterator[ExitStack]:
    with ExitStack() as stack:
        yield stack


@pytest.fixture
def lab(tmp_path, teardown: ExitStack) -> Callable[..., Lab]:
    """Factory: a hub namespace and one namespace per node (tests/faults/netns.py)."""

    def make(size: int = 3, proxied: bool = False) -> Lab:
        made = Lab(size)
        teardown.callback(_check_removed, made)
        teardown.callback(made.destroy)  # registered first: a half-built lab is removed too
        try:
            made.create(str(tmp_path), proxied=proxied)
        except NetnsUnavailable as exc:
            # Not a skip: the issue requires these scenarios, so their absence must be loud.
            pytest.fail(f"network namespaces are not usable here: {exc}")
        return made

    return make


def _check_removed(made: Lab) -> None:
    left = made.leftovers()
    assert not left, f"namespaces left behind: {left}"


@pytest.fixture
def fault_cluster(tmp_path, teardown: ExitStack) -> Callable[..., Cluster]:
    """Factory: a real 3-process cluster (in `lab`'s namespaces when given); stopped at teardown. Its nodes
    run FAULTS_WORKERS worker processes each unless `worker_processes` is given, behind FAULTS_GRPC_FRONT's
    gRPC front end (tests/faults/workers.py)."""
    count = [0]

    def make(lab: Lab | None = None, size: int = 3, start: bool = True, **settings: Any) -> Cluster:
        root = tmp_path / f"cluster{count[0]}"
        count[0] += 1
        root.mkdir(exist_ok=True)
        settings.setdefault("worker_processes", WORKERS)
        settings.setdefault("grpc_front", GRPC_FRONT)
        c: Cluster = NetnsCluster(str(root), lab, **settings) if lab is not None else Cluster(str(root), size,
                                                                                                 **settings)
        teardown.callback(c.stop)
        if start:
            c.start()
        return c

    return make


@pytest.fixture
def tmpfs(teardown: ExitStack) -> Callable[[str, int], None]:
    """Factory: mount a tmpfs of `size_mb` MiB on `path` (created if missing); unmounted at teardown."""

    def mount(path: str, size_mb: int) -> None:
        os.makedirs(path, exist_ok=True)
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=0755", "tmpfs", path],
                           capture_output=True, text=True)
        if r.returncode != 0:
            pytest.fail(f"cannot mount a tmpfs here: `mount -t tmpfs -o size={size_mb}m tmpfs {path}`: "
                        f"{r.stderr.strip()}")
        teardown.callback(_umount, path)

    return mount


def _umount(path: str) -> None:
    r = subprocess.run(["umount", path], capture_output=True, text=True)
    if r.returncode != 0:  # still busy (a process that outlived its cluster): detach it anyway
        subprocess.run(["umount", "-l", path], capture_output=True, text=True)


@pytest.fixture
def make_run(teardown: ExitStack) -> Callable[..., Run]:
    """Factory: the workloads of tests/faults/scenario.py, stopped before their cluster when a test fails."""

    def make(cluster: Cluster, **kw: Any) -> Run:
        run = Run(cluster, **kw)
        teardown.callback(run.stop)  # after the cluster's stop was registered: runs first
        return run

    return make
