"""A sharded node ([sharding] groups = 2) behind the Go front end ([node] grpc_front = "go"): its health.

A load balancer's grpc.health.v1 Watch reaches the workers through the front end (a server stream on the
front socket: nameserver/api/frontchannel.py), where the sharded node's health is every group core's
(nameserver/groups/shards.py): SERVING while both group cores are, NOT_SERVING as soon as group 1's core is
SIGKILLed, SERVING again once its node's core has started it again and it is ready. The same as
tests/integration/test_groups.py's test of the grpcio port, on one node.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.cluster import Cluster, running
from tests.integration.groupcores import group_core_pids, group_status

pytestmark = [pytest.mark.cluster, pytest.mark.slow]  # a sharded node of 5 processes and a group core's restart

SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(str(tmp_path_factory.mktemp("front-groups")), size=1, worker_processes=2, groups=2,
                grpc_front="go")
    with running(c, timeout=c.ready_timeout) as started:
        yield started


def test_a_watch_through_the_go_front_end_follows_a_killed_group_core(cluster: Cluster) -> None:
    node = cluster.nodes[0]
    st = node.status(timeout=10)
    assert st is not None and st.grpc_front.up  # the Go front end holds the port (Admin.Status, nsctl status)
    [victim] = cluster.wait_for("the node's group 1 core", lambda: group_core_pids(node), timeout=30)
    channel = grpc.insecure_channel(node.grpc_addr)
    health = health_pb2_grpc.HealthStub(channel)
    try:
        watch = health.Watch(health_pb2.HealthCheckRequest(), timeout=150)
        assert next(watch).status == SERVING
        os.kill(victim, signal.SIGKILL)
        assert next(watch).status == NOT_SERVING  # the stream's next message: nothing else changed
        cluster.wait_for("the group 1 core started again", lambda: [p for p in group_core_pids(node) if p != victim],
                         timeout=60)
        cluster.wait_for("the group 1 core ready again",
                         lambda: (st := group_status(node, 1)) is not None and st.ready, timeout=90)
        assert next(watch).status == SERVING
        assert health.Check(health_pb2.HealthCheckRequest(), timeout=10).status == SERVING
        watch.cancel()
    finally:
        channel.close()
