"""A sharded worker's decision on an unchanged re-registration of a group k set (nameserver/groups/
registrations.py), over in-process replicas fed by hand (tests/unit/test_groups_reads.py): the reply group
k's core gives (group k's state, group 0's order-topic KV), and None (ask the core) for a change, a set the
directory places elsewhere or is moving, and a replica not ready.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from nameserver.groups.registrations import GroupRegistrations
from nameserver.pb import api_pb2
from nameserver.replica import ReadReplica
from nameserver.state import translate
from nameserver.state.metadata import ORDER_TOPIC_CONFIG
from nameserver.state.shards import moves
from tests.cluster import register_request
from tests.unit.test_groups_reads import GROUPS, TIMEOUT_MS, apply, fed_replica, register


@pytest.fixture
def groups() -> Iterator[list[ReadReplica]]:
    """b1 pinned to group 1 and registered there; b0 in group 0; group 0 holds the order-topic KV."""
    replicas = [fed_replica(group) for group in range(GROUPS)]
    g0, g1 = replicas
    apply(g0, translate.put_kv(g0.state, ORDER_TOPIC_CONFIG, "T", "b1:4"))
    register(g0, "b0", "10.0.0.1:10911", ["T"])
    apply(g0, moves.pin_set(g0.state, "b1", 1, GROUPS))
    register(g1, "b1", "10.0.1.1:10911", ["T"], group0=g0.state)
    yield replicas
    for replica in replicas:
        replica.stop()


def again(name: str, addr: str, topics: list[str], counter: int = 1) -> api_pb2.RegisterBrokerRequest:
    """The registration `register` made (register_request's defaults), or a changed one."""
    return register_request("c", name, addr, topics, counter=counter)


def test_an_unchanged_registration_gets_group_k_s_reply_with_group_0_s_order_topics(
        groups: list[ReadReplica]) -> None:
    g0, g1 = groups
    decide = GroupRegistrations(groups, 1, TIMEOUT_MS)
    reply = decide.unchanged_registration(again("b1", "10.0.1.1:10911", ["T"]))
    assert reply is not None
    assert (reply.offset, reply.records) == (g1.state.offset, 0)  # group 1's offset: nothing written
    assert dict(reply.order_topic_config) == {"T": "b1:4"} and reply.order_topic_config_exists  # group 0's KV
    # the same as translating it in group 1 with group 0's state, as group 1's core does
    assert not translate.register_broker(g1.state, again("b1", "10.0.1.1:10911", ["T"]), TIMEOUT_MS,
                                         group0=g0.state).batch.records


def test_a_change_or_a_set_of_another_group_or_moving_is_left_to_the_core(groups: list[ReadReplica]) -> None:
    g0, _ = groups
    decide = GroupRegistrations(groups, 1, TIMEOUT_MS)
    assert decide.unchanged_registration(again("b1", "10.0.1.1:10911", ["T", "U"], counter=2)) is None
    assert decide.unchanged_registration(again("b1", "10.0.1.2:10911", ["T"])) is None  # a new address
    assert decide.unchanged_registration(again("b0", "10.0.0.1:10911", ["T"])) is None  # group 0's set
    apply(g0, moves.begin_move(g0.state, "b1", 0, GROUPS))
    assert decide.unchanged_registration(again("b1", "10.0.1.1:10911", ["T"])) is None  # moving


def test_nothing_is_decided_while_a_replica_is_not_ready(groups: list[ReadReplica]) -> None:
    for replica in groups:
        decide = GroupRegistrations(groups, 1, TIMEOUT_MS)
        replica._bootstrapped = False
        assert decide.unchanged_registration(again("b1", "10.0.1.1:10911", ["T"])) is None
        replica._bootstrapped = True
    assert GroupRegistrations(groups, 1, TIMEOUT_MS).unchanged_registration(
        again("b1", "10.0.1.1:10911", ["T"])) is not None


def test_the_locks_are_taken_in_group_order(groups: list[ReadReplica]) -> None:
    """As a merged read takes them: a decision waits for group 0's lock before it holds group 1's, so a
    read holding group 0's and waiting for group 1's never waits on it (no cycle)."""
    g0, g1 = groups
    decided: list[object] = []
    decide = GroupRegistrations(groups, 1, TIMEOUT_MS)
    with g0.lock:
        worker = threading.Thread(target=lambda: decided.append(
            decide.unchanged_registration(again("b1", "10.0.1.1:10911", ["T"]))))
        worker.start()
        worker.join(timeout=0.2)
        assert worker.is_alive() and g1.lock.acquire(timeout=1)  # waiting for group 0's, not holding group 1's
        g1.lock.release()
    worker.join(timeout=10)
    assert decided and decided[0] is not None
