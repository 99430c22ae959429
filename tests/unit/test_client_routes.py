"""RouteCache bookkeeping (watch listings and changes, pulls) and BrokerFleet, without a cluster."""

from __future__ import annotations

from typing import Any

import grpc

from nameserver.client import (
    BrokerAgent,
    BrokerFleet,
    BrokerIdentity,
    Client,
    NameServerError,
    RouteCache,
    topic_config,
)
from nameserver.pb import api_pb2, state_pb2


def qd_event(topic: str, broker: str, queues: int = 2, perm: int = 6, deleted: bool = False) -> api_pb2.WatchEvent:
    value = b"" if deleted else state_pb2.QueueData(broker_name=broker, read_queue_nums=queues,
                                                   write_queue_nums=queues, perm=perm).SerializeToString()
    return api_pb2.WatchEvent(type=3, key=f"topic/{topic}/{broker}", value=value, deleted=deleted)


def broker_event(name: str, deleted: bool = False) -> api_pb2.WatchEvent:
    value = b"" if deleted else state_pb2.BrokerData(
        cluster="C", broker_name=name, addrs=[state_pb2.BrokerAddr(broker_id=0, addr="10.0.0.1:10911")]
    ).SerializeToString()
    return api_pb2.WatchEvent(type=1, key=f"broker/{name}", value=value, deleted=deleted)


def test_listing_then_changes_drive_the_publish_queues() -> None:
    cache = RouteCache(Client("127.0.0.1:1"))
    seen: list[tuple[int, list[str]]] = []
    cache.add_listener(lambda offset, keys: seen.append((offset, keys)))
    cache.replace_all(10, [broker_event("a"), broker_event("b"), qd_event("T", "a"), qd_event("T", "b")])
    assert [(q.broker_name, q.queue_id) for q in cache.publish_queues("T")] == [
        ("a", 0), ("a", 1), ("b", 0), ("b", 1)]
    cache.apply_changes(11, [qd_event("T", "b", deleted=True), broker_event("b", deleted=True)])
    assert {q.broker_name for q in cache.publish_queues("T")} == {"a"}
    cache.apply_changes(12, [qd_event("T", "a", perm=4)])  # write permission wiped
    assert cache.publish_queues("T") == []
    assert cache.route("T") is not None and cache.offset == 12
    assert [offset for offset, _ in seen] == [10, 11, 12]
    # a new listing replaces everything (e.g. after the watch was compacted away)
    cache.replace_all(20, [broker_event("c"), qd_event("U", "c")])
    assert cache.topics() == {"U"} and cache.broker_names() == {"c"}
    assert cache.route("T") is None


def test_broker_names_escaped_in_watched_keys_come_out_as_sent() -> None:
    # The node escapes '/' and '~' in a broker name where it goes into a key (nameserver/state/keys.py).
    from nameserver.state import keys

    name = "team/a~b ü"
    broker, queue = broker_event(name), qd_event("T", name)
    broker.key, queue.key = keys.broker_key(name), keys.topic_key("T", name)
    assert "/a" not in broker.key
    cache = RouteCache(Client("127.0.0.1:1"))
    cache.replace_all(10, [broker, queue])
    assert cache.broker_names() == {name}
    assert [q.broker_name for q in cache.publish_queues("T")] == [name, name]
    cache.apply_changes(11, [api_pb2.WatchEvent(type=3, key=queue.key, deleted=True),
                             api_pb2.WatchEvent(type=1, key=broker.key, deleted=True)])
    assert cache.broker_names() == set() and cache.route("T") is None


class PullClient:
    """Answers GetRoute like a node would, at a given apply offset."""

    def __init__(self, offset: int) -> None:
        self.offset = offset
        self.last_offset = offset

    def get_route(self, topic: str) -> api_pb2.GetRouteReply:
        if topic == "Gone":
            raise NameServerError("GetRoute", grpc.StatusCode.NOT_FOUND, "no topic", apply_offset=self.offset)
        route = api_pb2.TopicRoute(
            queue_datas=[state_pb2.QueueData(broker_name="p", read_queue_nums=1, write_queue_nums=1, perm=6)],
            broker_datas=[state_pb2.BrokerData(cluster="C", broker_name="p",
                                               addrs=[state_pb2.BrokerAddr(broker_id=0, addr="10.0.0.9:1")])])
        return api_pb2.GetRouteReply(route=route, apply_offset=self.offset)


def test_a_pull_never_installs_a_staler_route_than_the_watch() -> None:
    client: Any = PullClient(offset=5)
    cache = RouteCache(client, topics=["T"])
    cache.apply_changes(9, [broker_event("a"), qd_event("T", "a")])
    assert not cache.pull_topic("T")  # the node answered at 5 < 9
    client.offset = 12
    assert cache.pull_topic("T")
    assert [q.broker_name for q in cache.publish_queues("T")] == ["p"]
    assert cache.pull_topic("Gone") and cache.route("Gone") is None


class FleetClient:
    def __init__(self) -> None:
        self.registered: dict[str, int] = {}
        self.calls: list[str] = []
        self.unknown: set[str] = set()

    def register_broker(self, request: api_pb2.RegisterBrokerRequest) -> api_pb2.RegisterBrokerReply:
        self.calls.append(f"register {request.broker_name} v{request.data_version.counter}")
        self.registered[request.broker_addr] = request.data_version.counter
        return api_pb2.RegisterBrokerReply(offset=1)

    def heartbeat(self, beats: list[api_pb2.BrokerHeartbeat]) -> list[str]:
        self.calls.append("heartbeat " + ",".join(b.broker_name for b in beats))
        unknown, self.unknown = [a for a in self.unknown if a in {b.broker_addr for b in beats}], set()
        return unknown

    def unregister_broker(self, cluster: str, name: str, addr: str, broker_id: int) -> api_pb2.WriteReply:
        self.calls.append(f"unregister {name}")
        return api_pb2.WriteReply(offset=2)


def test_fleet_registers_heartbeats_reregisters_and_unregisters() -> None:
    client = FleetClient()
    agents = [BrokerAgent(BrokerIdentity("C", f"b{i}", f"10.0.0.{i}:10911"), [topic_config("T")]) for i in (1, 2)]
    fleet = BrokerFleet(client, agents)  # type: ignore[arg-type]
    fleet.run_once()
    assert client.calls == ["register b1 v1", "register b2 v1", "heartbeat b1,b2"]
    client.calls.clear()
    agents[0].update_topics([topic_config("T"), topic_config("U")])  # DataVersion changes
    client.unknown = {"10.0.0.2:10911"}  # e.g. expired while partitioned
    fleet.run_once()
    assert client.calls == ["register b1 v2", "heartbeat b1,b2", "register b2 v1"]
    assert agents[1].stats.reregistrations == 1
    client.calls.clear()
    fleet.kill(agents[1])  # a crash: no more heartbeats, no unregistration
    fleet.run_once()
    assert client.calls == ["heartbeat b1"]
    assert fleet.stop() == 1 and client.calls[-1] == "unregister b1"
