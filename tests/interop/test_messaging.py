"""Messages flow through routes we serve: a real producer and push consumers (4.9.x and 5.x clients)."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from .conftest import Deployment
from .traffic import create_topic, produce, start_consumer

N = 40


def test_producer_sends_n_and_push_consumer_receives_exactly_n(deployment: Deployment) -> None:
    d = deployment
    topic, group = "InteropSendRecv", "interop-cg-sendrecv"
    create_topic(d, topic)
    c = start_consumer(d, topic, group, "c1")
    try:
        c.wait_owning()
        res = produce(d, topic, N, prefix="sr")
        assert not res.failed, res.failed
        assert len(res.sent) == N
        # both broker groups took messages (the route's 8 write queues)
        brokers = Counter(ln.split()[2] for ln in res.lines if ln.startswith("SENT "))
        assert set(brokers) == {"broker-a", "broker-b"}, brokers
        c.wait_received(set(res.sent))
        time.sleep(2)  # nothing more arrives
        got = Counter(c.received())
        assert set(got) == set(res.sent) and all(v == 1 for v in got.values()), got
    finally:
        c.proc.stop()


@pytest.mark.interop
def test_second_consumer_joins_and_no_queue_is_owned_twice(deployment: Deployment) -> None:
    d = deployment
    topic, group = "InteropRebalance", "interop-cg-rebalance"
    create_topic(d, topic)
    all_queues = {f"{b}:{q}" for b in ("broker-a", "broker-b") for q in range(4)}
    c1 = start_consumer(d, topic, group, "r1")
    c2 = None
    try:
        deadline = time.monotonic() + 60
        while c1.owned() != all_queues and time.monotonic() < deadline:
            time.sleep(0.3)
        assert c1.owned() == all_queues, c1.owned()
        c2 = start_consumer(d, topic, group, "r2")
        deadline = time.monotonic() + 90
        last = None
        while time.monotonic() < deadline:
            o1, o2 = c1.owned(), c2.owned()
            last = (o1, o2)
            if o1 and o2 and not (o1 & o2) and (o1 | o2) == all_queues and len(o1) == len(o2) == 4:
                break
            time.sleep(0.5)
        else:
            raise AssertionError(f"no clean 4/4 split after 90 s: {last}")
        # both consume what is sent now, each message once
        res = produce(d, topic, N, prefix="rb")
        assert not res.failed, res.failed
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not set(res.sent) <= set(c1.received()) | set(c2.received()):
            time.sleep(0.3)
        got = Counter(c1.received() + c2.received())
        assert set(got) == set(res.sent) and all(v == 1 for v in got.values()), got
        assert c1.received() and c2.received()
    finally:
        for c in (c1, c2):
            if c is not None:
                c.proc.stop()
