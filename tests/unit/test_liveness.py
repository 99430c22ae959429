from nameserver.core.liveness import ChannelTable, HeartbeatBuffer, LivenessTable
from nameserver.pb import api_pb2


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_silent_broker_expires_after_its_own_timeout() -> None:
    clock = FakeClock()
    table = LivenessTable(clock)
    table.touch("a:1")
    table.touch("b:1")
    clock.t += 2.5
    table.touch("b:1")
    regs = [("a:1", 2000, 7), ("b:1", 2000, 9), ("c:1", 10000, 3)]
    assert table.expired(regs) == [("a:1", 7)]  # c counts from the grace point, b was refreshed


def test_grace_after_leader_change_restarts_every_clock() -> None:
    clock = FakeClock()
    table = LivenessTable(clock)
    table.touch("a:1")
    clock.t += 100
    table.grant_grace()
    assert table.expired([("a:1", 5000, 1)]) == []
    clock.t += 5.1
    assert table.expired([("a:1", 5000, 1)]) == [("a:1", 1)]


def test_unregistered_addresses_are_forgotten() -> None:
    table = LivenessTable(FakeClock())
    table.touch("gone:1")
    table.touch("here:1")
    table.expired([("here:1", 1000, 1)])
    assert len(table) == 1


def beat(addr: str, node: str = "", closed: bool = False) -> api_pb2.BrokerHeartbeat:
    return api_pb2.BrokerHeartbeat(broker_addr=addr, cluster_name="c", broker_name="b", channel_node=node,
                                   channel_closed=closed)


def test_heartbeat_buffer_coalesces_per_address_and_node() -> None:
    buf = HeartbeatBuffer()
    buf.add(beat("a:1"))
    buf.add(beat("a:1"))
    buf.add(beat("z:1"))
    buf.add(beat("z:1", "n1", closed=True))  # a close is kept apart from plain heartbeats
    assert buf.drain() == [beat("a:1"), beat("z:1"), beat("z:1", "n1", closed=True)]
    assert buf.drain() == []
    buf.add(beat("a:1", "n1"))
    buf.add(beat("a:1", "n1", closed=True))  # the latest state of a node's connection wins
    assert buf.drain() == [beat("a:1", "n1", closed=True)]


def test_channel_table_reports_the_last_close_only() -> None:
    t = ChannelTable()
    t.opened("a:1", "n1")
    t.opened("a:1", "n2")
    assert not t.closed("a:1", "n1")  # still connected to n2
    assert t.closed("a:1", "n2")      # the last one
    assert not t.closed("a:1", "n2")  # already gone
    assert not t.closed("b:1", "n1")  # never known (e.g. after a failover): proves nothing
    t.opened("c:1", "n1")
    t.clear()
    assert not t.closed("c:1", "n1")


def test_disconnect_expires_after_the_grace_unless_heard_again() -> None:
    clock = FakeClock()
    table = LivenessTable(clock)
    table.touch("a:1")
    table.touch("b:1")
    table.disconnect("a:1", 1.0)
    table.disconnect("b:1", 1.0)
    assert table.expired([("a:1", 120_000, 1), ("b:1", 120_000, 2)]) == []  # within the grace
    table.touch("b:1")  # another node's connection reported in time
    clock.t += 1.5
    assert table.expired([("a:1", 120_000, 1), ("b:1", 120_000, 2)]) == [("a:1", 1)]
