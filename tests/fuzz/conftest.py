"""One real 3-node cluster (with the remoting listener) per live fuzz module, started once for the module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.cluster import Cluster


@pytest.fixture(scope="module")
def fuzz_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    # No expiry scans during the run (nothing but our own calls writes to the log), so "a refused
    # request wrote nothing" can be checked by comparing the leader's end offset before and after.
    c = Cluster(str(tmp_path_factory.mktemp("fuzz-cluster")), 3, remoting=True, scan_interval_ms=3_600_000)
    c.start()
    try:
        c.wait_ready()
        yield c
    finally:
        c.stop(wait=False)  # the nodes shut down while the next test starts
