from nameserver.liveness import HeartbeatBuffer, LivenessTable


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


def test_heartbeat_buffer_coalesces_per_address() -> None:
    buf = HeartbeatBuffer()
    buf.add("a:1", "c", "b")
    buf.add("a:1", "c", "b")
    buf.add("z:1", "c", "y")
    assert buf.drain() == {"a:1": ("c", "b"), "z:1": ("c", "y")}
    assert buf.drain() == {}
