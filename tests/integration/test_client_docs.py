"""docs/client.md's examples are runnable: every python code block runs against a real cluster."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.cluster

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(ROOT, "docs", "client.md")


def python_blocks() -> list[str]:
    with open(DOC, encoding="utf-8") as f:
        return re.findall(r"^```python\n(.*?)^```", f.read(), flags=re.S | re.M)


def test_the_reference_has_examples() -> None:
    blocks = python_blocks()
    assert len(blocks) >= 3
    assert all("NAMESERVER_ENDPOINTS" in b for b in blocks)


def test_every_example_runs_against_a_real_cluster(make_cluster) -> None:
    c = make_cluster(scan_interval_ms=500)
    c.wait_ready()
    env = os.environ | {"NAMESERVER_ENDPOINTS": ",".join(n.grpc_addr for n in c.nodes), "PYTHONPATH": ROOT}
    for i, code in enumerate(python_blocks()):
        done = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                              timeout=180)
        assert done.returncode == 0, f"example {i + 1} failed:\n{code}\n--- stdout\n{done.stdout}\n" \
                                     f"--- stderr\n{done.stderr}"
