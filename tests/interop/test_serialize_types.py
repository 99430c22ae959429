"""A RocketMQ Java client started with -Drocketmq.serialize.type=ROCKETMQ (binary remoting headers) against our
cluster, through a recording proxy: it gets routes, sends and receives; every request it sent us had a binary
header, and every answer we gave it was binary too, as the stock 4.9.7 NameServer answers (docs/remoting.md)."""

from __future__ import annotations

from collections import Counter

import pytest

from nameserver.remoting import codes

from .conftest import Deployment
from .recorder import CODE_NAMES, Exchange, Recorder
from .traffic import BINARY_HEADERS, create_topic, produce, start_consumer

pytestmark = pytest.mark.interop

BINARY = BINARY_HEADERS
N = 20


def test_a_binary_header_client_produces_and_consumes_through_our_cluster(deployment: Deployment) -> None:
    d = deployment
    topic, group = "InteropBinaryHeaders", "interop-cg-binary"
    create_topic(d, topic)
    rec = Recorder(d.addrs[1], "binary").start()  # a follower's remoting port
    c = None
    try:
        c = start_consumer(d, topic, group, "bin1", namesrv=rec.addr, props=BINARY)
        c.wait_owning()
        res = produce(d, topic, N, prefix="bin", namesrv=rec.addr, props=BINARY)
        assert not res.failed, res.failed
        assert len(res.sent) == N
        c.wait_received(set(res.sent))
        assert Counter(c.received()) == Counter(res.sent)
    finally:
        if c is not None:
            c.proc.stop()
        rec.stop()
    exchanges = rec.snapshot()
    assert not rec.undecodable
    # answered: a request in flight when a client was stopped has no answer on record
    routes = [ex.response for ex in exchanges if ex.request.code == codes.GET_ROUTEINFO_BY_TOPIC
              and ex.request.ext("topic") == topic and ex.response is not None]
    assert routes, f"no route request for {topic} answered: {_kinds(exchanges)}"
    assert all(r.code == codes.SUCCESS for r in routes), [(r.code, r.remark) for r in routes]
    assert all(ex.request.serialize_type == codes.SERIALIZE_ROCKETMQ for ex in exchanges), _kinds(exchanges)
    answered = [ex for ex in exchanges if ex.response is not None]
    assert all(ex.response.serialize_type == codes.SERIALIZE_ROCKETMQ for ex in answered), _kinds(exchanges)


def _kinds(exchanges: list[Exchange]) -> Counter:
    """(request code, request type, response type): how many."""
    return Counter((CODE_NAMES.get(ex.request.code, ex.request.code), ex.request.serialize_type,
                    ex.response.serialize_type if ex.response is not None else None) for ex in exchanges)
