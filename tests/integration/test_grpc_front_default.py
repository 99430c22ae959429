"""[node] grpc_front's default, "auto", on a real node with a worker (nameserver/ops/gofront.py settle): the Go
front end when it is built (`make setup` built it for this checkout before the tests), and grpcio when it is
not, the node's log saying so and naming the setting and `make setup`. "Not built" is a node whose cache
directory ($XDG_CACHE_HOME, where gobuild looks) has no front end: the node does not build one at start.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from nameserver.ops import gobuild
from nameserver.pb import api_pb2
from tests.cluster import Cluster

pytestmark = [pytest.mark.cluster, pytest.mark.slow]  # a node with a worker started twice


def test_auto_serves_through_the_go_front_end_when_built_and_grpcio_saying_so_when_not(tmp_path: Path) -> None:
    assert gobuild.built() is not None, "make setup builds the Go front end before the tests"
    cluster = Cluster(str(tmp_path), size=1, worker_processes=1)  # no grpc_front: the default
    node = cluster.nodes[0]
    empty = tmp_path / "empty-cache"
    node.env = {"XDG_CACHE_HOME": str(empty)}
    try:
        cluster.start()
        cluster.wait_ready()
        st = node.status(timeout=10)
        assert st is not None and not st.HasField("grpc_front")  # no Go front end: grpcio's port
        assert node.ns.GetClusterInfo(api_pb2.GetClusterInfoRequest(), timeout=10) is not None
        log = Path(node.log_path).read_text()
        assert 'serves gRPC with grpcio ([node] grpc_front = "auto", the default): the Go front end' in log
        assert "is not built for this checkout: run `make setup`" in log
        assert not empty.exists() or not any(empty.rglob("front-*"))  # nothing was built at start
        cluster.stop()
        node.env = {}
        cluster.start()
        cluster.wait_ready()
        st = cluster.wait_for("the Go front end up", lambda: (s := node.status(timeout=10)) is not None
                              and s.grpc_front.up and s, timeout=30)
        assert st.grpc_front.pid > 0
        assert node.ns.GetClusterInfo(api_pb2.GetClusterInfoRequest(), timeout=10) is not None
    finally:
        cluster.stop()
