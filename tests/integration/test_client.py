"""The client library on real 3-process clusters: leader following, read-your-writes, exactly-once
retries, the broker fleet across a leader kill, and a producer dropping a dead broker via watch."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import pytest

from nameserver.client import (
    BrokerAgent,
    BrokerFleet,
    BrokerIdentity,
    Client,
    QueueSelector,
    RetryPolicy,
    RouteCache,
    topic_config,
)
from tests.cluster import Cluster, running

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One cluster for the tests that kill no node (a cluster's start is seconds). Each writes names of its
    own (namespace NS; brokers p-* with topic Sim0; cluster CliSim), so they pass in any order."""
    with running(Cluster(str(tmp_path_factory.mktemp("shared")), 3, scan_interval_ms=500)) as c:
        yield c


def endpoints(c) -> str:
    return ",".join(n.grpc_addr for n in c.nodes)


def fleet_agents(n: int, topics: int, timeout_ms: int, prefix: str = "sim") -> list[BrokerAgent]:
    return [BrokerAgent(BrokerIdentity("SimCluster", f"{prefix}-{i}", f"10.1.{i // 250}.{i % 250 + 1}:10911",
                                       heartbeat_timeout_ms=timeout_ms),
                        [topic_config(f"Sim{t}") for t in range(topics)] + [topic_config(f"{prefix}-{i}-own")])
            for i in range(n)]


def test_writes_find_the_leader_and_reads_see_them_on_any_node(shared: Cluster) -> None:
    c = shared
    leader = c.wait_ready()
    with Client(endpoints(c), timeout=30) as client:
        for i in range(10):
            put = client.put_kv("NS", f"k{i}", f"v{i}")
            assert put.offset > 0 and put.records == (2 if i == 0 else 1)  # the first also makes the namespace
            assert client.get_kv("NS", f"k{i}") == f"v{i}"  # whichever node answers: read-your-writes
        assert client.pool.leader == leader.grpc_addr
        assert client.list_kv("NS") == {f"k{i}": f"v{i}" for i in range(10)}
        assert client.get_kv("NS", "missing") is None
        # the same write again is an unchanged re-write: offsets only grow
        assert client.put_kv("NS", "k0", "v0").offset >= put.offset


def test_writes_survive_a_leader_kill(make_cluster) -> None:
    c = make_cluster()
    leader = c.wait_ready()
    with Client(endpoints(c), retry=RetryPolicy(deadline_s=60)) as client:
        first = client.put_kv("NS", "before", "1")
        c.kill(leader, signal.SIGKILL)
        second = client.put_kv("NS", "after", "2")  # retried until a new leader commits it
        assert second.offset > first.offset
        assert client.get_kv("NS", "after") == "2" and client.get_kv("NS", "before") == "1"
        assert client.pool.leader != leader.grpc_addr


def test_a_fleet_loses_no_broker_when_the_leader_is_killed(make_cluster) -> None:
    c = make_cluster(scan_interval_ms=500)
    leader = c.wait_ready()
    client = Client(endpoints(c), retry=RetryPolicy(deadline_s=30))
    agents = fleet_agents(30, topics=10, timeout_ms=4000)
    removed: list[str] = []
    cache = RouteCache(client, progress_interval_ms=200)
    cache.add_listener(lambda offset, keys: removed.extend(k for k in keys if k.startswith("broker/")
                                                           and k.removeprefix("broker/") not in cache.broker_names()))
    fleet = BrokerFleet(client, agents, heartbeat_interval_s=1.0)
    try:
        cache.start()
        fleet.start()
        assert cache.wait_for(lambda: len(cache.broker_names()) == 30, 60), cache.broker_names()
        c.kill(leader, signal.SIGKILL)
        c.wait_ready(timeout=60)
        # three times every broker's 4 s timeout (plus scans) with the new leader in charge, which gave
        # every broker a fresh timeout when it took over
        time.sleep(12)
        info = client.get_cluster_info()
        assert sorted(info.cluster_addr_table["SimCluster"].names) == sorted(a.identity.broker_name for a in agents)
        assert removed == [] and len(cache.broker_names()) == 30
        assert all(a.registered for a in agents)
        assert sum(a.stats.heartbeats for a in agents) > 30 * 10
        fleet.stop(unregister=True)
        assert cache.wait_for(lambda: not cache.broker_names(), 30)
        assert "SimCluster" not in client.get_cluster_info().cluster_addr_table
    finally:
        fleet.stop(unregister=False)
        cache.stop()
        client.close()


def test_a_producer_stops_choosing_a_dead_broker_once_its_removal_is_applied(shared: Cluster) -> None:
    c = shared
    c.wait_ready()
    client = Client(endpoints(c), retry=RetryPolicy(deadline_s=30))
    agents = fleet_agents(3, topics=1, timeout_ms=3000, prefix="p")
    cache = RouteCache(client, topics=["Sim0"])
    pull_only = RouteCache(Client(endpoints(c)), topics=["Sim0"], watch=False, pull_interval_s=1.0)
    fleet = BrokerFleet(client, agents, heartbeat_interval_s=0.5)
    selector = QueueSelector(cache, enabled=False)  # route only: the watch alone must drop the broker
    try:
        fleet.start()
        cache.start()
        pull_only.start()
        assert cache.wait_for(lambda: len(cache.publish_queues("Sim0")) == 12, 60)
        assert {selector.select("Sim0").broker_name for _ in range(12)} == {"p-0", "p-1", "p-2"}
        fleet.kill(agents[1])
        assert cache.wait_for(lambda: "p-1" not in {q.broker_name for q in cache.publish_queues("Sim0")}, 60)
        assert {selector.select("Sim0").broker_name for _ in range(24)} == {"p-0", "p-2"}
        assert pull_only.wait_for(
            lambda: {q.broker_name for q in pull_only.publish_queues("Sim0")} == {"p-0", "p-2"}, 60)
        # a changed topic table (new DataVersion) is registered again and reaches the cache
        agents[0].update_topics([topic_config("Sim0"), topic_config("Fresh")])
        fresh = RouteCache(client, topics=["Fresh"]).start()
        try:
            assert fresh.wait_for(lambda: [q.broker_name for q in fresh.publish_queues("Fresh")][:1] == ["p-0"], 60)
        finally:
            fresh.stop()
    finally:
        fleet.stop()
        cache.stop()
        pull_only.stop()
        pull_only.client.close()
        client.close()


def test_nsctl_broker_simulate_registers_then_unregisters(shared: Cluster, capsys) -> None:
    from nameserver.cli import nsctl

    c = shared
    c.wait_ready()
    code = nsctl.main(["--endpoints", endpoints(c), "broker", "simulate", "--brokers", "4", "--topics", "5",
                       "--interval", "0.5", "--duration", "3", "--cluster", "CliSim"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "registered 4" in out and "unregistered 4 broker(s)" in out
    with Client(endpoints(c)) as client:  # nsctl's writes are acknowledged: the leader's commit covers them
        assert "CliSim" not in client.get_cluster_info(min_offset=c.wait_ready().status().commit_offset
                                                       ).cluster_addr_table
