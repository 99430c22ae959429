"""LeaderForwarder (nameserver/core/forwarder.py) against a real gRPC server standing in for the leader."""

from __future__ import annotations

import threading
import time
from concurrent import futures

import grpc
import pytest

from nameserver import headers
from nameserver.config import Member, NodeConfig
from nameserver.core.forwarder import LeaderForwarder, NoLeader
from nameserver.localports import free_ports
from nameserver.pb import api_pb2, api_pb2_grpc
from raftlog.proposer import NotLeader

ME, LEADER = "127.0.0.1:1", "127.0.0.1:2"


class _Leader(api_pb2_grpc.NameServerServicer):
    def __init__(self) -> None:
        self.seen: list[dict[str, str]] = []

    def Heartbeat(self, request, context):  # noqa: N802 (gRPC's name)
        self.seen.append(dict(context.invocation_metadata()))
        return api_pb2.HeartbeatReply(unknown_addrs=[b.broker_addr for b in request.heartbeats])


@pytest.fixture
def leader_server():
    port = free_ports(1)[0]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = _Leader()
    api_pb2_grpc.add_NameServerServicer_to_server(servicer, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    server.stop(None)


class _Roles:
    """Who leads, as the log would say; changed by the test."""

    def __init__(self, leader: str | None) -> None:
        self.leader = leader

    def is_leader(self) -> bool:
        return self.leader == ME


def _forwarder(roles: _Roles, grpc_addr: str) -> LeaderForwarder:
    cfg = NodeConfig(raft_addr=ME, grpc_addr="127.0.0.1:3", data_dir="/nonexistent",
                     members=[Member(ME, "127.0.0.1:3")])
    return LeaderForwarder(cfg, lambda: roles.leader, roles.is_leader,
                           lambda raft: grpc_addr if raft == LEADER else None)


def test_a_call_reaches_the_leader_marked_forwarded_with_the_callers_metadata(leader_server) -> None:
    servicer, addr = leader_server
    fwd = _forwarder(_Roles(LEADER), addr)
    try:
        reply = fwd.call("Heartbeat", api_pb2.HeartbeatRequest(heartbeats=[api_pb2.BrokerHeartbeat(
            broker_addr="10.0.0.1:10911")]), 5.0, metadata=[(headers.CLIENT_ID, "c1")])
        assert list(reply.unknown_addrs) == ["10.0.0.1:10911"]
        assert servicer.seen[0][headers.FORWARDED] == "1" and servicer.seen[0][headers.CLIENT_ID] == "c1"
        fwd.call("Heartbeat", api_pb2.HeartbeatRequest(), 5.0)
        assert len(fwd._channels) == 1  # one channel per peer, reused
    finally:
        fwd.close()


def test_a_call_carries_its_callers_deadline_by_the_wall_clock(leader_server) -> None:
    """FORWARD_DEADLINE: when the call's time runs out by this node's wall clock (unix ms), even where
    gRPC's own timeout is raised to its 0.1 s floor: the leader checks it, not the time left at arrival."""
    servicer, addr = leader_server
    fwd = _forwarder(_Roles(LEADER), addr)
    try:
        before = time.time() * 1000
        fwd.call("Heartbeat", api_pb2.HeartbeatRequest(), 5.0)
        after = time.time() * 1000
        assert before + 5000 - 100 <= int(servicer.seen[0][headers.FORWARD_DEADLINE]) <= after + 5000
        before = time.time() * 1000
        fwd.serve_or_forward(lambda left: "here", "Heartbeat", api_pb2.HeartbeatRequest(), 0.0, forwarded=False)
        assert int(servicer.seen[1][headers.FORWARD_DEADLINE]) <= time.time() * 1000  # spent, not given 0.1 s
        assert int(servicer.seen[1][headers.FORWARD_DEADLINE]) >= before - 1
    finally:
        fwd.close()


def test_no_leader_raises_without_sending_and_waits_at_most_its_wait(leader_server) -> None:
    servicer, addr = leader_server
    fwd = _forwarder(_Roles(None), addr)
    started = time.monotonic()
    with pytest.raises(NoLeader, match="no leader elected"):
        fwd.call("Heartbeat", api_pb2.HeartbeatRequest(), 5.0, wait_s=0.3)
    assert 0.25 <= time.monotonic() - started < 2.0
    assert servicer.seen == []
    fwd.close()


def test_the_wait_ends_when_a_leader_is_elected(leader_server) -> None:
    servicer, addr = leader_server
    roles = _Roles(None)
    fwd = _forwarder(roles, addr)
    threading.Timer(0.2, lambda: setattr(roles, "leader", LEADER)).start()
    try:
        fwd.call("Heartbeat", api_pb2.HeartbeatRequest(), 5.0, wait_s=3.0)
        assert len(servicer.seen) == 1
    finally:
        fwd.close()


def test_a_waiting_call_goes_as_soon_as_the_node_hears_of_its_new_leader(leader_server, monkeypatch) -> None:
    """The node calls leader_changed() on each leader event: a caller waiting for an election (or after a
    dead leader's refusal) goes at once, not at its next poll (POLL_S, made a minute here)."""
    import nameserver.core.forwarder as forwarder
    monkeypatch.setattr(forwarder, "POLL_S", 60.0)
    servicer, addr = leader_server
    roles = _Roles(None)
    fwd = _forwarder(roles, addr)
    done = threading.Event()

    def call() -> None:
        fwd.call("Heartbeat", api_pb2.HeartbeatRequest(), 30.0, wait_s=30.0)
        done.set()

    threading.Thread(target=call, daemon=True).start()
    try:
        time.sleep(0.3)  # the caller is waiting
        roles.leader = LEADER
        fwd.leader_changed()
        assert done.wait(10), "the waiting call did not go when the new leader was heard of"
        assert len(servicer.seen) == 1
        # a change heard between the caller's look and its wait is not missed: the count says so
        roles.leader = None
        seen = fwd._changed
        roles.leader = LEADER
        fwd.leader_changed()
        started = time.monotonic()
        fwd._pause(seen, 30.0)
        assert time.monotonic() - started < 5
    finally:
        fwd.close()


def test_this_node_winning_the_election_ends_the_wait_at_once(leader_server) -> None:
    servicer, addr = leader_server
    roles = _Roles(None)
    fwd = _forwarder(roles, addr)
    threading.Timer(0.2, lambda: setattr(roles, "leader", ME)).start()
    started = time.monotonic()
    with pytest.raises(NoLeader, match="this node leads now"):
        fwd.call("Heartbeat", api_pb2.HeartbeatRequest(), 5.0, wait_s=3.0)
    assert time.monotonic() - started < 1.5
    assert servicer.seen == []
    fwd.close()


DEAD = "127.0.0.1:4"


def _dead_leader_forwarder(roles: _Roles, addr: str) -> LeaderForwarder:
    """A forwarder whose leader DEAD's gRPC port refuses connections (nothing listens); LEADER's is `addr`."""
    dead_grpc = f"127.0.0.1:{free_ports(1)[0]}"
    cfg = NodeConfig(raft_addr=ME, grpc_addr="127.0.0.1:3", data_dir="/nonexistent",
                     members=[Member(ME, "127.0.0.1:3")])
    return LeaderForwarder(cfg, lambda: roles.leader, roles.is_leader,
                           lambda raft: {LEADER: addr, DEAD: dead_grpc}.get(raft or ""))


def test_an_idempotent_call_to_a_dead_leader_goes_to_the_next_one(leader_server) -> None:
    """The node still believes in a leader that died (connection refused) until the election ends."""
    servicer, addr = leader_server
    roles = _Roles(DEAD)
    fwd = _dead_leader_forwarder(roles, addr)
    try:
        with pytest.raises(grpc.RpcError) as err:  # no leader reachable in its time: the caller hears why
            fwd.call("Heartbeat", api_pb2.HeartbeatRequest(), 1.0)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        threading.Timer(0.5, lambda: setattr(roles, "leader", LEADER)).start()
        fwd.call("Heartbeat", api_pb2.HeartbeatRequest(), 5.0, idempotent=True)
        assert len(servicer.seen) == 1
        roles.leader = DEAD  # and never replaced: the call gives up at its timeout
        started = time.monotonic()
        with pytest.raises(grpc.RpcError):
            fwd.call("Heartbeat", api_pb2.HeartbeatRequest(), 1.0, idempotent=True)
        assert 0.8 < time.monotonic() - started < 2.5
    finally:
        fwd.close()


HB = api_pb2.HeartbeatRequest(heartbeats=[api_pb2.BrokerHeartbeat(broker_addr="10.0.0.9:10911")])


@pytest.fixture
def led_here(leader_server):
    """(the stand-in leader's servicer, the roles, a forwarder) on a node that leads to begin with."""
    servicer, addr = leader_server
    roles = _Roles(ME)
    fwd = _forwarder(roles, addr)
    yield servicer, roles, fwd
    fwd.close()


def test_serve_or_forward_serves_a_leader_s_request_here_and_passes_a_follower_s_on(led_here) -> None:
    """The one serve-or-forward path of both services (NameServer writes, Admin changes)."""
    servicer, roles, fwd = led_here
    served: list[float] = []

    def here(left: float) -> str:
        served.append(left)
        return "here"

    assert fwd.serve_or_forward(here, "Heartbeat", HB, 5.0, forwarded=False) == "here"
    assert served == [5.0] and servicer.seen == []
    roles.leader = LEADER
    reply = fwd.serve_or_forward(here, "Heartbeat", HB, 5.0, forwarded=False, metadata=[(headers.CLIENT_ID, "c1")])
    assert list(reply.unknown_addrs) == ["10.0.0.9:10911"] and len(served) == 1
    assert servicer.seen[0][headers.FORWARDED] == "1" and servicer.seen[0][headers.CLIENT_ID] == "c1"
    # a request forwarded to us once is never passed on again: refused, nothing sent
    with pytest.raises(NoLeader, match=r"not the leader \(forwarded request\)"):
        fwd.serve_or_forward(here, "Heartbeat", HB, 5.0, forwarded=True)
    assert len(servicer.seen) == 1 and len(served) == 1


def test_serve_or_forward_after_losing_or_winning_the_lead(led_here) -> None:
    servicer, roles, fwd = led_here

    def lost_lead(left: float) -> str:
        roles.leader = LEADER  # another node won meanwhile: nothing was appended here
        raise NotLeader("this node is not the leader")

    with pytest.raises(NotLeader):  # the Admin service's changes: refused, not sent on
        fwd.serve_or_forward(lost_lead, "Heartbeat", HB, 5.0, forwarded=False)
    roles.leader = ME
    reply = fwd.serve_or_forward(lost_lead, "Heartbeat", HB, 5.0, forwarded=False, forward_if_lead_lost=True)
    assert list(reply.unknown_addrs) == ["10.0.0.9:10911"]  # a write: sent on to the new leader
    # no leader yet, then this node wins the election while waiting: served here
    roles.leader = None
    threading.Timer(0.2, lambda: setattr(roles, "leader", ME)).start()
    assert fwd.serve_or_forward(lambda left: "here", "Heartbeat", HB, 5.0, forwarded=False, wait_s=2.0) == "here"
    roles.leader = None
    with pytest.raises(NoLeader, match="no leader elected"):
        fwd.serve_or_forward(lambda left: "here", "Heartbeat", HB, 5.0, forwarded=False, wait_s=0.2)


def _serve_leader(port: int) -> tuple[_Leader, grpc.Server]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = _Leader()
    api_pb2_grpc.add_NameServerServicer_to_server(servicer, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    return servicer, server


def test_a_call_waits_for_a_leader_whose_port_opens_late() -> None:
    """A follower learns of its leader before the leader's port is open (a node's workers open it once the
    node is ready): its channel, refused meanwhile, reconnects up to a second after the port opens, and gRPC
    failed a call at once until then (`Connection refused`: seen as a sharded cluster's first registration
    answered SYSTEM_BUSY right after the cluster was ready). Nothing was sent, so the call, a write's too,
    waits for the connection within its deadline."""
    port = free_ports(1)[0]
    fwd = _forwarder(_Roles(LEADER), f"127.0.0.1:{port}")
    server = None
    try:
        with pytest.raises(grpc.RpcError) as err:  # nothing listens yet: refused at the call's deadline
            fwd.call("Heartbeat", HB, 0.5)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE and str(port) in (err.value.details() or "")
        time.sleep(2.0)  # refused again and again meanwhile: gRPC's reconnect backoff grows to its 1 s cap
        servicer, server = _serve_leader(port)
        reply = fwd.call("Heartbeat", HB, 10.0)  # right after the port opened, not waiting for the backoff
        assert list(reply.unknown_addrs) == ["10.0.0.9:10911"] and len(servicer.seen) == 1
    finally:
        fwd.close()
        if server is not None:
            server.stop(None)


def test_a_call_waiting_for_an_unreachable_leader_goes_to_the_next_one(leader_server) -> None:
    """A write (not idempotent) to a leader that does not accept connections is not sent there: it waits,
    and goes to the next leader once this node hears of it (a leader event, or at its next look)."""
    servicer, addr = leader_server
    roles = _Roles(DEAD)
    fwd = _dead_leader_forwarder(roles, addr)
    try:
        threading.Timer(0.5, lambda: setattr(roles, "leader", LEADER)).start()  # no event: found at a look
        reply = fwd.call("Heartbeat", HB, 10.0)
        assert list(reply.unknown_addrs) == ["10.0.0.9:10911"] and len(servicer.seen) == 1
        roles.leader = DEAD
        fwd.leader_changed()
        threading.Timer(0.5, lambda: (setattr(roles, "leader", LEADER), fwd.leader_changed())).start()
        reply = fwd.serve_or_forward(lambda left: "here", "Heartbeat", HB, 10.0, forwarded=False)
        assert list(reply.unknown_addrs) == ["10.0.0.9:10911"] and len(servicer.seen) == 2
    finally:
        fwd.close()


def test_ask_reaches_the_given_peer_unmarked_and_fails_at_once_on_a_closed_port(leader_server) -> None:
    """`ask` (the leader-balancing duty's readiness check) calls the peer it names, not the leader, not marked
    forwarded (the workers there answer it as a client's), and does not wait for a port that is not open."""
    servicer, addr = leader_server
    roles = _Roles(None)  # no leader known: ask does not need one
    fwd = _forwarder(roles, addr)
    try:
        request = api_pb2.HeartbeatRequest(heartbeats=[api_pb2.BrokerHeartbeat(broker_addr="b:1")])
        reply = fwd.ask(addr, "Heartbeat", request, 5.0, service=api_pb2_grpc.NameServerStub)
        assert list(reply.unknown_addrs) == ["b:1"]
        assert headers.FORWARDED not in servicer.seen[-1] and headers.GROUP not in servicer.seen[-1]
        closed = f"127.0.0.1:{free_ports(1)[0]}"
        with pytest.raises(grpc.RpcError) as failed:
            fwd.ask(closed, "Heartbeat", request, 30.0, service=api_pb2_grpc.NameServerStub)
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE  # at once, not at the 30 s deadline
    finally:
        fwd.close()
