"""FollowerPreference (nameserver/replica/voters.py) against voters' Admin.Status on in-process gRPC servers."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import SimpleNamespace

import grpc
import pytest

from nameserver.pb import api_pb2, api_pb2_grpc
from nameserver.replica.voters import FollowerPreference


class StatusOnly(api_pb2_grpc.AdminServicer):
    def __init__(self, answer: Callable[[], api_pb2.NodeStatus]) -> None:
        self.answer = answer

    def Status(self, request: api_pb2.StatusRequest, context: grpc.ServicerContext) -> api_pb2.NodeStatus:  # noqa: N802
        return self.answer()


@pytest.fixture
def voter(serve_grpc) -> Callable[[Callable[[], api_pb2.NodeStatus]], str]:
    """A voter's address whose Admin.Status answers `answer()`."""
    return lambda answer: serve_grpc(lambda server: api_pb2_grpc.add_AdminServicer_to_server(StatusOnly(answer),
                                                                                               server))


def replica_of(targets: list[str]) -> SimpleNamespace:
    moves: list[str] = []
    return SimpleNamespace(targets=targets, target=targets[0], ready=True, moves=moves,
                           move_to=lambda addr, reason: moves.append(addr) or True)


def test_a_voter_that_never_answers_status_does_not_hold_up_the_readiness_loop(voter) -> None:
    """check() runs in the replica's readiness loop, which also logs readiness and sees the stop signal: its
    Status polls (each up to its timeout, one voter after another) run off that loop."""
    asked, release = threading.Event(), threading.Event()

    def silent() -> api_pb2.NodeStatus:
        asked.set()
        release.wait(10)
        return api_pb2.NodeStatus()

    replica = replica_of([voter(silent), voter(silent)])
    preference = FollowerPreference(replica, grpc.insecure_channel)  # type: ignore[arg-type]
    try:
        t0 = time.monotonic()
        preference.check(t0)
        held = time.monotonic() - t0
        assert asked.wait(10)  # the poll went out
        assert held < 0.5, f"check() waited {held:.2f} s for a voter's Status (the poll's timeout: 1 s)"
        preference.check(t0 + FollowerPreference.CHECK_S + 1)  # a round still running: no second one
    finally:
        release.set()


def test_a_replica_following_the_leader_moves_to_a_ready_follower(voter) -> None:
    leader = voter(lambda: api_pb2.NodeStatus(role=api_pb2.ROLE_LEADER, ready=True))
    follower = voter(lambda: api_pb2.NodeStatus(role=api_pb2.ROLE_FOLLOWER, ready=True))
    replica = replica_of([leader, follower])
    FollowerPreference(replica, grpc.insecure_channel).check(time.monotonic())  # type: ignore[arg-type]
    deadline = time.monotonic() + 10
    while not replica.moves and time.monotonic() < deadline:
        time.sleep(0.01)
    assert replica.moves == [follower]
