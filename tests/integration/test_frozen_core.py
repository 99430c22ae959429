"""A node's health when one of its cores is frozen (SIGSTOP: the process alive, its sockets open, nothing
answered) while its worker runs on (nameserver/api/corehealth.py). Real processes: a one-node cluster with
[sharding] groups = 2 and one worker, and a one-group one-node cluster with one worker, started together.

A load balancer's health Watch on the node's port turns NOT_SERVING once the worker has not heard from the
frozen core past its replica's bound (5 s: five missed feed keepalives), Check answers NOT_SERVING at once
instead of waiting for its deadline, and Admin.Status says the node is not ready, naming the core; after
SIGCONT all three say SERVING / ready again. Before, the Watch stayed SERVING for as long as the core was
frozen and Check waited for its deadline. Slow (each freeze lasts the bound and more): `make test-slow`; the
short checks of the same are tests/unit/test_groups_status.py and test_replica_follow.py.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from nameserver.pb import api_pb2
from nameserver.replica.follower import DEFAULT_MAX_SILENCE_S
from tests.cluster import Cluster, running
from tests.integration.groupcores import group_core_pids

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
WATCH_S = 120.0  # the Watch's own deadline: far past the bound, so a status that never comes fails the test
ASK = health_pb2.HealthCheckRequest()


@pytest.fixture(scope="module")
def clusters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, Cluster]]:
    """(the sharded one, the one-group one), each a node with one worker."""
    sharded = Cluster(str(tmp_path_factory.mktemp("frozen-sharded")), size=1, worker_processes=1, groups=2)
    one = Cluster(str(tmp_path_factory.mktemp("frozen-one")), size=1, worker_processes=1)
    one.start()  # started beside the sharded one
    try:
        with running(sharded, timeout=sharded.ready_timeout):
            one.wait_ready()
            yield sharded, one
    finally:
        one.stop()


def _next(watch: Any) -> tuple[int, float]:
    """The Watch's next status, and how long it took."""
    began = time.monotonic()
    status: int = next(watch).status
    return status, time.monotonic() - began


def _checked(health: health_pb2_grpc.HealthStub) -> int | None:
    try:
        status: int = health.Check(ASK, timeout=10).status
        return status
    except grpc.RpcError:  # just after SIGCONT: a call that waited past its deadline
        return None


def _frozen_and_back(cluster: Cluster, pid: int, says: str) -> None:
    """Freeze `pid` (one of the cluster's node's cores): the node's Watch turns NOT_SERVING past the bound,
    Check is NOT_SERVING at once, Status not ready with a reason beginning `says`; then SIGCONT: all back."""
    node = cluster.nodes[0]
    health = health_pb2_grpc.HealthStub(node._channel())
    watch = health.Watch(ASK, timeout=WATCH_S)
    try:
        assert next(watch).status == SERVING
        os.kill(pid, signal.SIGSTOP)
        try:
            status, waited = _next(watch)
            assert status == NOT_SERVING, waited
            print(f"NOT_SERVING {waited:.1f} s after SIGSTOP (bound {DEFAULT_MAX_SILENCE_S} s)")
            # answered, not DEADLINE_EXCEEDED: neither asks the frozen core (its answer would never come)
            assert health.Check(ASK, timeout=10).status == NOT_SERVING
            st = node.admin.Status(api_pb2.StatusRequest(), timeout=10)
            reasons = [st.not_ready_reason, *(g.not_ready_reason for g in st.groups)]
            assert not st.ready and any(r.startswith(says) for r in reasons), reasons
        finally:
            os.kill(pid, signal.SIGCONT)
        status, _ = _next(watch)
        assert status == SERVING
        cluster.wait_for("Check SERVING", lambda: _checked(health) == SERVING)
        cluster.wait_for("Status ready", lambda: (st := node.status(timeout=10)) is not None and st.ready)
    finally:
        watch.cancel()


def test_a_frozen_group_core_turns_the_sharded_node_not_serving_and_back(clusters: tuple[Cluster, Cluster]) -> None:
    sharded, _ = clusters
    [group1] = group_core_pids(sharded.nodes[0])
    _frozen_and_back(sharded, group1, "group 1's core has not answered this worker for ")


def test_a_frozen_group_0_core_the_same(clusters: tuple[Cluster, Cluster]) -> None:
    sharded, _ = clusters
    assert sharded.nodes[0].proc is not None
    _frozen_and_back(sharded, sharded.nodes[0].proc.pid, "group 0's core has not answered this worker for ")


def test_a_one_group_node_s_frozen_core_the_same(clusters: tuple[Cluster, Cluster]) -> None:
    _, one = clusters
    assert one.nodes[0].proc is not None
    _frozen_and_back(one, one.nodes[0].proc.pid, "this node's core has not answered this worker for ")


def test_a_check_while_the_core_is_frozen_within_the_bound_waits_for_its_deadline(
        clusters: tuple[Cluster, Cluster]) -> None:
    """Within the bound the core is asked, and a frozen one does not answer: the caller's deadline says so
    (DEADLINE_EXCEEDED, which load balancers count as a failed check)."""
    _, one = clusters
    node = one.nodes[0]
    assert node.proc is not None
    health = health_pb2_grpc.HealthStub(node._channel())
    os.kill(node.proc.pid, signal.SIGSTOP)
    try:
        with pytest.raises(grpc.RpcError) as err:
            health.Check(ASK, timeout=1)
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    finally:
        os.kill(node.proc.pid, signal.SIGCONT)
    one.wait_for("Check SERVING", lambda: _checked(health) == SERVING)
