"""The leader's lease page for its workers (raftlog/leaseboard.py): what a worker reads of it, what the Raft
tick thread writes to it, and, on three in-process nodes, that an acknowledged write is on the leader's page
before its acknowledgement and a transfer takes the lease off it before the target can campaign."""

from __future__ import annotations

import contextlib
import threading

import pytest

from raftlog import leaseboard
from raftlog.leadership import LEADER, LeadershipConfirmer
from raftlog.leaseboard import LeaseBoard, LeaseView
from raftlog.log import ReplicatedLog
from tests.cluster import free_ports
from tests.unit.fakeraft import FakeRaft
from tests.unit.test_leadership import Clock, confirm_round
from tests.unit.test_raftlog_inprocess import Node, leader_of, put, wait_for

FOLLOWER = 0


@pytest.fixture(autouse=True)
def ordered_stores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(leaseboard, "ORDERED_STORES", True)  # the page's reads are for x86-64 only


def test_the_page_gives_the_commit_index_only_while_its_lease_holds(tmp_path) -> None:
    clock = Clock()
    board = LeaseBoard(str(tmp_path / "channel" / "lease"))
    view = LeaseView(board.path, clock=clock)
    assert view.index() is None  # a fresh page: no lease
    board.commit(41)
    board.publish(clock.now + 0.2)
    assert view.index() == 41
    board.commit(45)
    assert view.index() == 45  # the commit index as it moves
    clock.now += 0.2
    assert view.index() is None  # the lease's end
    board.publish(clock.now + 0.2)
    board.publish(0.0)  # given up
    assert view.index() is None
    assert (tmp_path / "channel" / "lease").stat().st_mode & 0o777 == 0o600


def test_a_write_under_way_gives_no_index(tmp_path) -> None:
    clock = Clock()
    board = LeaseBoard(str(tmp_path / "lease"))
    board.commit(7)
    board.publish(clock.now + 1)
    view = LeaseView(board.path, clock=clock)
    assert view.index() == 7
    leaseboard._SEQ.pack_into(board._page, 0, board._seq + 1)  # the writer between its two stores
    assert view.index() is None


def test_a_page_not_there_yet_is_looked_for_again_and_a_new_core_s_page_starts_without_a_lease(tmp_path) -> None:
    clock = Clock()
    path = str(tmp_path / "lease")
    view = LeaseView(path, clock=clock)
    assert view.index() is None
    board = LeaseBoard(path)
    board.commit(3)
    board.publish(clock.now + 5)
    assert view.index() is None  # not looked for again yet
    clock.now += LeaseView.REOPEN_S
    assert view.index() == 3
    LeaseBoard(path)  # a restarted core: a new page, no lease on it
    assert LeaseView(path, clock=clock).index() is None


def test_no_index_off_x86_64(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    board = LeaseBoard(str(tmp_path / "lease"))
    board.publish(clock.now + 5)
    monkeypatch.setattr(leaseboard, "ORDERED_STORES", False)
    assert LeaseView(board.path, clock=clock).index() is None


def test_the_confirmer_puts_its_lease_on_the_page_and_takes_it_off_before_it_may_be_wrong(tmp_path) -> None:
    """A round that gives the lease puts its end on the page; giving the lease up (before TimeoutNow) takes it
    off at once, as does the next tick after this node stopped leading or moved to another term."""
    clock = Clock()
    raft = FakeRaft(LEADER, 7, noop=40, commit=42)
    confirmer = LeadershipConfirmer(raft, 0.24, clock=clock)
    board = LeaseBoard(str(tmp_path / "lease"))
    board.commit(42)
    confirmer.board = board
    view = LeaseView(board.path, clock=clock)
    confirm_round(raft, confirmer, "B")
    assert view.index() == 42 == confirmer.leased_index()
    confirmer.give_up_lease()
    assert view.index() is None
    for change in ("follower", "term"):
        raft.term += 1
        raft.state = LEADER
        clock.now += 1
        confirm_round(raft, confirmer, "B")
        assert view.index() == 42
        if change == "follower":
            raft.state = FOLLOWER
        else:
            raft.term += 1
        confirmer.on_tick()
        assert view.index() is None


@pytest.fixture
def trio(tmp_path):
    ports = free_ports(3)
    addrs = [f"127.0.0.1:{p}" for p in ports]
    nodes = [Node(a, [b for b in addrs if b != a], tmp_path / f"n{i}") for i, a in enumerate(addrs)]
    yield nodes
    for n in nodes:
        with contextlib.suppress(Exception):
            n.close()


def test_an_acknowledged_write_is_on_the_leader_s_page_and_a_transfer_takes_the_lease_off_first(trio, tmp_path
                                                                                               ) -> None:
    views = {}
    for i, node in enumerate(trio):
        assert isinstance(node.log, ReplicatedLog)
        node.log.publish_lease(str(tmp_path / f"page{i}"))
        views[node] = LeaseView(str(tmp_path / f"page{i}"))
    leader = leader_of(trio)
    wait_for(lambda: views[leader].index() is not None)
    for i in range(20):
        offset = leader.log.propose(put(f"k{i}", "v"), timeout=10).offset
        index = views[leader].index()
        assert index is not None and index >= offset  # acknowledged: on the page already
    assert all(views[n].index() is None for n in trio if n is not leader)
    raft = leader.log.raft
    sent_with_lease: list[int | None] = []
    original = raft.leadership.give_up_lease

    def giving_up() -> None:  # what the page says once the lease is given up, before TimeoutNow is sent
        original()
        sent_with_lease.append(views[leader].index())

    raft.leadership.give_up_lease = giving_up
    leader.log.transfer_leadership(None, timeout=10)
    assert sent_with_lease == [None]
    assert threading.current_thread() is not raft.tick_thread()
    wait_for(lambda: any(n.log.is_leader() for n in trio if n is not leader))
    new = leader_of(trio)
    wait_for(lambda: views[new].index() is not None)
    assert views[leader].index() is None
