"""The Go front end's reply cache on a sharded node (front/cache.go; the worker's side: nameserver/worker.py
_reusable_reads over every group's replica): [node] grpc_front = "go", [sharding] groups = 2, one node.

Merged reads (GetRoute, GetClusterInfo, GetTopicList over both groups' replicas) are answered from the cache
(the node's /metrics counts the hits), yet a changed registration of a set group 1 holds is read at once: a
move of group 1's route generation moves the worker's generation, which voids what was kept. A read naming an
offset vector the node holds is kept too, and one naming a group-1 offset ahead of it is never answered from
the cache.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable, Iterator

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from nameserver.pb import api_pb2, api_pb2_grpc
from nameserver.state.shards.directory import default_group
from tests.cluster import Cluster, register_request

pytestmark = [pytest.mark.cluster, pytest.mark.slow]  # ~15 s: five rounds of hits the front end counts each second

GROUPS = 2
CLUSTER = "ShardCacheCluster"
TOPIC = "ShardCachedTopic"
SET = next(f"shard-cache-{i}" for i in range(64) if default_group(f"shard-cache-{i}", GROUPS) == 1)  # group 1's


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(str(tmp_path_factory.mktemp("front-cache-groups")), size=1, metrics=True, worker_processes=2,
                groups=GROUPS, grpc_front="go")
    c.start()
    try:
        c.wait_ready(timeout=120)
        yield c
    finally:
        c.stop()


def _stub(cluster: Cluster) -> api_pb2_grpc.NameServerStub:
    return api_pb2_grpc.NameServerStub(grpc.insecure_channel(cluster.nodes[0].grpc_addr))


def _hits(cluster: Cluster) -> dict[str, float]:
    """The node's nameserver_grpc_front_cache_hits_total, by method."""
    with urllib.request.urlopen(f"http://{cluster.nodes[0].metrics_addr}/metrics", timeout=5) as r:
        text = r.read().decode()
    return {s.labels["method"]: s.value for family in text_string_to_metric_families(text)
            for s in family.samples if s.name == "nameserver_grpc_front_cache_hits_total"}


def _reads_hit(cluster: Cluster, method: str, read: Callable[[], object]) -> bool:
    """20 reads (both workers' replies kept, and answered again), then whether the front end counted hits
    of `method` since (it writes its counts each second)."""
    before = _hits(cluster).get(method, 0)
    for _ in range(20):
        read()
    time.sleep(1.1)
    return _hits(cluster).get(method, 0) >= before + 5


def _queues(reply: api_pb2.GetRouteReply) -> list[int]:
    return [q.read_queue_nums for q in reply.route.queue_datas]


def test_a_changed_registration_of_a_group_1_set_is_read_at_once(cluster: Cluster) -> None:
    stub = _stub(cluster)
    first = stub.RegisterBroker(register_request(CLUSTER, SET, "10.9.0.1:10911", [TOPIC]), timeout=10)
    assert len(first.offsets) == GROUPS and first.offsets[1] > 0  # written in group 1
    request = api_pb2.GetRouteRequest(topic=TOPIC)

    def route_with(queues: int) -> Callable[[], bool]:
        return lambda: _queues(stub.GetRoute(request, timeout=5)) == [queues]

    cluster.wait_for(f"{TOPIC}'s route", route_with(4), timeout=15, every=0.05)
    cluster.wait_for("merged route reads answered from the cache", lambda: _reads_hit(
        cluster, "GetRoute", lambda: stub.GetRoute(request, timeout=5)), timeout=20)
    cluster.wait_for("merged cluster info answered from the cache", lambda: _reads_hit(
        cluster, "GetClusterInfo", lambda: stub.GetClusterInfo(api_pb2.GetClusterInfoRequest(), timeout=5)),
        timeout=20)
    listing = api_pb2.GetTopicListRequest(kind=api_pb2.TOPIC_LIST_ALL)
    assert TOPIC in stub.GetTopicList(listing, timeout=5).topics
    cluster.wait_for("merged topic lists answered from the cache", lambda: _reads_hit(
        cluster, "GetTopicList", lambda: stub.GetTopicList(listing, timeout=5)), timeout=20)

    # the same set registers again, its topic now with 8 queues: group 1's records alone change
    changed = stub.RegisterBroker(register_request(CLUSTER, SET, "10.9.0.1:10911", [TOPIC], counter=2, queues=8),
                                  timeout=10)
    assert changed.offsets[0] == 0 and changed.offsets[1] > first.offsets[1]
    cluster.wait_for(f"{TOPIC}'s route with 8 queues", route_with(8), timeout=15, every=0.05)
    hits = _hits(cluster)["GetRoute"]

    def all_new() -> bool:  # every worker's answer (each applies the change moments after group 1's core)
        return all(route_with(8)() for _ in range(20))

    # a kept reply of the old state would be answered for ever: by each worker's share of the reads
    cluster.wait_for("20 reads in a row with the new route", all_new, timeout=15, every=0.05)
    cluster.wait_for("the new route answered from the cache", lambda: _hits(cluster)["GetRoute"] > hits, timeout=10)
    # the new topic list too (a topic added in group 1)
    renamed = stub.RegisterBroker(register_request(CLUSTER, SET, "10.9.0.1:10911", [TOPIC, TOPIC + "2"],
                                                   counter=3, queues=8), timeout=10)
    cluster.wait_for("the topic added in group 1, 20 lists in a row", lambda: all(
        TOPIC + "2" in stub.GetTopicList(listing, timeout=5).topics for _ in range(20)), timeout=15, every=0.05)

    # a read naming the write's offset vector: answered at or past it, and kept
    vector = api_pb2.GetRouteRequest(topic=TOPIC, min_offsets=renamed.offsets)
    cluster.wait_for("vector reads answered from the cache", lambda: _reads_hit(
        cluster, "GetRoute", lambda: stub.GetRoute(vector, timeout=5)), timeout=20)
    assert stub.GetRoute(vector, timeout=5).offsets[1] >= renamed.offsets[1]
    ahead = api_pb2.GetRouteRequest(topic=TOPIC, min_offsets=[0, renamed.offsets[1] + 1_000_000])
    for _ in range(3):
        with pytest.raises(grpc.RpcError) as err:  # a kept reply would be an answer at once
            stub.GetRoute(ahead, timeout=1)
        assert err.value.code() in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE,
                                    grpc.StatusCode.CANCELLED), err.value
