"""Route reads reuse a computed route while the state's route generation stays (nameserver/core/routecache.py),
on a real one-node NameServerNode: a write that changes a route is seen by the next read, stamped at least
at the write's offset, and reads of unchanged routes do not take the state lock."""

from __future__ import annotations

from nameserver.core import NameServerNode
from nameserver.core.routecache import MISS, RouteCache
from nameserver.state import translate
from tests.cluster import register_request
from tests.threads import held_elsewhere


def test_a_kept_route_is_used_only_at_its_generation() -> None:
    cache = RouteCache(max_entries=2)
    assert cache.get(("T", ""), 1) is MISS
    cache.put(("T", ""), 1, "route-1")
    cache.put(("U", ""), 1, None)  # no such topic: kept too
    assert cache.get(("T", ""), 1) == "route-1" and cache.get(("U", ""), 1) is None
    assert cache.get(("T", ""), 2) is MISS
    cache.put(("V", ""), 2, "route-v")  # full: the oldest goes
    assert len(cache) == 2 and cache.get(("T", ""), 1) is MISS


def _register(node: NameServerNode, addr: str, counter: int) -> int:
    req = register_request("C", "broker-a", addr, ["T"], counter=counter)
    return node.write(lambda s: translate.register_broker(s, req, 120_000), 10).offset


def _route(node: NameServerNode, min_offset: int = 0):
    return node.read_route(("T", ""), lambda s: s.route("T"), min_offset, 5.0)


def test_a_changed_route_is_read_at_once_and_an_unchanged_one_from_the_cache(node: NameServerNode) -> None:
    first = _register(node, "10.0.0.1:10911", 1)
    route, offset = _route(node, first)
    assert offset >= first and route.broker_datas[0].addrs[0].addr == "10.0.0.1:10911"
    hits = node.routes.hits
    with held_elsewhere(node.lock):  # another thread holds the state lock, as apply would
        again, _ = _route(node)  # a hit needs no lock: it answers meanwhile
    assert again is route and node.routes.hits == hits + 1
    second = _register(node, "10.0.0.2:10911", 2)  # the broker moved: the next read must see it
    route, offset = _route(node, second)
    assert offset >= second and route.broker_datas[0].addrs[0].addr == "10.0.0.2:10911"
    none, _ = node.read_route(("missing", ""), lambda s: s.route("missing"), 0, 5.0)
    assert none is None
