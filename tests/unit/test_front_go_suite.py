"""The Go gRPC front end's own tests (front/*_test.go) in `make test`: the default front end of a node with
workers ([node] grpc_front = "auto"), so its frame, call and cache code is tested with the rest. Run with
the toolchain its build uses (nameserver/ops/gobuild.toolchain: PATH's go, or the one go.mod names)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from nameserver.ops import gobuild

FRONT = Path(__file__).resolve().parents[2] / "front"


@pytest.mark.timeout(600)
def test_the_go_front_ends_own_tests_pass() -> None:
    go, env = gobuild.toolchain(FRONT)
    done = subprocess.run([go, "test", "-mod=readonly", "-count=1", "./..."], cwd=FRONT, capture_output=True,
                          text=True, timeout=600, env={**os.environ, **env})
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "ok" in done.stdout, done.stdout
