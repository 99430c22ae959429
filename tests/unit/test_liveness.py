from nameserver.core.liveness import ChannelTable, HeartbeatBuffer, LivenessTable
from nameserver.pb import api_pb2
from nameserver.state import MetadataState, register_broker
from nameserver.state.shards import moves
from raftlog.pb import entry_pb2


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


def test_grace_after_leader_change_restarts_every_clock_without_current_evidence() -> None:
    clock = FakeClock()
    table = LivenessTable(clock)
    table.touch("a:1")
    table.mark_current()
    clock.t += 100  # never synced since: a node back from a partition
    table.grant_grace(trust_within_s=10)
    assert table.expired([("a:1", 5000, 1)]) == []
    clock.t += 5.1
    assert table.expired([("a:1", 5000, 1)]) == [("a:1", 1)]


def sync(follower: LivenessTable, leader: LivenessTable, registered: list[str], sent_at: float) -> None:
    """A follower's periodic fetch of the leader's silences (what node.py's forward loop does)."""
    follower.merge(leader.silences(registered), sent_at)
    follower.mark_current()


def test_a_new_leader_carries_clocks_on_from_the_old_leaders_silences() -> None:
    clock = FakeClock()  # one clock for brevity; silences carry no timestamps, so clocks may differ
    old, new = LivenessTable(clock), LivenessTable(clock)
    old.grant_grace(trust_within_s=5)
    old.touch("dead:1")
    clock.t += 2.0
    sync(new, old, ["dead:1"], clock.t)
    clock.t += 0.5
    new.grant_grace(trust_within_s=5)  # the old leader died; this node leads now
    assert new.expired([("dead:1", 3000, 4)]) == []
    clock.t += 0.6  # 3.1 s after it was last heard, 0.6 s after the election
    assert new.expired([("dead:1", 3000, 4)]) == [("dead:1", 4)]


def test_a_broker_without_evidence_gets_a_fresh_timeout_and_own_evidence_wins_when_newer() -> None:
    clock = FakeClock()
    old, new = LivenessTable(clock), LivenessTable(clock)
    old.touch("seen:1")
    clock.t += 2.5
    new.touch("seen:1")  # heard by this node itself, after the leader did
    sync(new, old, ["seen:1"], clock.t)
    new.grant_grace(trust_within_s=5)
    clock.t += 2.9
    regs = [("seen:1", 3000, 1), ("unheard:1", 3000, 2)]
    assert new.expired(regs) == []  # seen:1 counts from this node's own hearing, unheard:1 from now
    clock.t += 0.2
    assert new.expired(regs) == [("seen:1", 1), ("unheard:1", 2)]


def test_a_fetched_silence_counts_from_when_its_request_was_sent() -> None:
    clock = FakeClock()
    leader, follower = LivenessTable(clock), LivenessTable(clock)
    leader.touch("a:1")
    sent_at = clock.t
    clock.t += 0.5
    reply = leader.silences(["a:1"])  # measured half a second after the request left: 500 ms
    clock.t += 0.5  # and it took another half to arrive: the broker is taken as heard at sent_at - 0.5
    follower.merge(reply, sent_at)
    silences = follower.silences()
    assert list(zip(silences.broker_addrs, silences.silent_ms, strict=True)) == [("a:1", 1500)]  # never younger


def test_elections_more_frequent_than_the_timeout_do_not_postpone_expiry() -> None:
    """Three nodes; leadership moves every 1.2 s (well under the 3 s timeout); followers sync every 0.5 s.
    The broker that died is expired within its timeout plus one sync interval; one that beats a single
    follower (forwarded to each leader) is never expired."""
    clock = FakeClock()
    nodes = [LivenessTable(clock) for _ in range(3)]
    regs = [("dead:1", 3000, 1), ("live:1", 3000, 2)]
    addrs = [a for a, _, _ in regs]
    leader = 0
    nodes[leader].grant_grace(trust_within_s=2)
    nodes[leader].touch("dead:1")
    died_at, expired_at, step = clock.t, None, 0
    while clock.t - died_at < 20 and expired_at is None:
        clock.t += 0.1
        step += 1
        nodes[2].touch("live:1")  # it beats node 2 only; node 2 forwards to whoever leads
        if leader != 2:
            nodes[leader].touch("live:1")
        if step % 5 == 0:
            for i, n in enumerate(nodes):
                if i != leader:
                    sync(n, nodes[leader], addrs, clock.t)
        if step % 12 == 0:  # an election: the next node leads (node 2 included)
            nodes[leader].mark_current()
            leader = (leader + 1) % 3
            nodes[leader].grant_grace(trust_within_s=2)
        gone = dict(nodes[leader].expired(regs))
        assert "live:1" not in gone
        if "dead:1" in gone:
            expired_at = clock.t
    assert expired_at is not None and expired_at - died_at <= 3.0 + 0.5 + 0.1


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


def _scan(table: LivenessTable, state: MetadataState) -> list[str]:
    """The leader's expiry scan over a group's state (node.py's scan_once, without proposing)."""
    return [addr for addr, _ in table.expired([(addr, live.heartbeat_timeout_ms, version)
                                               for addr, live, version in state.live_addrs()])]


def _register(state: MetadataState, name: str, addr: str) -> None:
    req = api_pb2.RegisterBrokerRequest(cluster_name="c", broker_name=name, broker_addr=addr,
                                        heartbeat_timeout_ms=3000)
    tr = register_broker(state, req, 120_000)
    assert state.apply_entry(state.offset + 1, entry_pb2.Entry(batches=[tr.batch]))[0].applied


def test_a_set_copied_into_a_group_is_not_expired_before_its_timeout_passes_from_the_copy() -> None:
    """The target group's leader never heard the copied addresses (their heartbeats went to the source
    until the move finished): counted from its grace point, long past, its next scan would expire them.
    The scan that first finds them registered starts their clocks; they still expire once silent past their
    timeout from then, and an address found at the first scan after the grace point still counts from it."""
    clock = FakeClock()
    source, target = MetadataState(), MetadataState()
    _register(source, "moved", "10.0.0.1:10911")
    _register(target, "stays", "10.0.0.2:10911")  # registered before this leader: never heard by it
    leader = LivenessTable(clock)
    leader.grant_grace(trust_within_s=5)
    clock.t += 1
    assert _scan(leader, target) == []
    clock.t += 100  # the group's leader has led longer than a timeout (3 s); "stays" went long ago
    assert _scan(leader, target) == ["10.0.0.2:10911"]
    copy = moves.copy_set(source, target, 1, "moved")
    assert target.apply_entry(target.offset + 1, entry_pb2.Entry(batches=[copy.batch]))[0].applied
    copied_at = clock.t
    silences = leader.silences(target.registered_addrs())  # a follower syncing before the next scan
    assert dict(zip(silences.broker_addrs, silences.silent_ms, strict=True))["10.0.0.1:10911"] == 0
    clock.t += 0.5  # the next scan finds it
    found_at = clock.t
    assert _scan(leader, target) == ["10.0.0.2:10911"]
    clock.t = copied_at + 2.9
    assert _scan(leader, target) == ["10.0.0.2:10911"]
    clock.t = found_at + 3.1  # silent past its timeout since: expired as any other broker
    assert _scan(leader, target) == ["10.0.0.1:10911", "10.0.0.2:10911"]
