"""Which group a request goes to (nameserver/state/shards/router.py), against a real directory."""

from __future__ import annotations

import pytest

from nameserver.pb import api_pb2, state_pb2
from nameserver.state import MetadataState, Translation
from nameserver.state.shards import moves
from nameserver.state.shards.router import AssignFirst, Moving, Split, ToGroup, route
from raftlog.pb import entry_pb2

GROUPS = 3


def apply(state: MetadataState, tr: Translation) -> None:
    assert state.apply_entry(state.offset + 1, entry_pb2.Entry(batches=[tr.batch]))[0].applied


@pytest.fixture()
def g0() -> MetadataState:
    """Group 0's state: b1 in group 1, b2 in group 2, mv moving from 1 to 2; 'new' has no record."""
    state = MetadataState()
    for name, group in (("b1", 1), ("b2", 2), ("mv", 1)):
        apply(state, moves.pin_set(state, name, group, GROUPS))
    apply(state, moves.begin_move(state, "mv", 2, GROUPS))
    return state


def test_writes_of_one_set_go_to_its_group_and_a_new_set_is_assigned_first(g0: MetadataState) -> None:
    d = g0.directory
    assert route(api_pb2.RegisterBrokerRequest(cluster_name="c", broker_name="b1"), d, GROUPS) == ToGroup(1)
    assert route(api_pb2.RegisterBrokerRequest(cluster_name="c", broker_name="new"), d, GROUPS) == AssignFirst(
        "new", "c")
    assert route(api_pb2.UnregisterBrokerRequest(broker_name="b2"), d, GROUPS) == ToGroup(2)
    # a set no record names is group 0's: its unregistration finds it there (or nothing, as one group would)
    assert route(api_pb2.UnregisterBrokerRequest(broker_name="new"), d, GROUPS) == ToGroup(0)
    assert route(api_pb2.BrokerPermRequest(broker_name="b2"), d, GROUPS) == ToGroup(2)
    assert route(api_pb2.GetBrokerMemberGroupRequest(broker_name="b1"), d, GROUPS) == ToGroup(1)


CONTROLLER_REQUESTS = (
    api_pb2.ApplyBrokerIdRequest(cluster_name="c", broker_name="{}", broker_id=1),
    api_pb2.ControllerRegisterRequest(broker_name="{}", broker_id=1, broker_address="a:1"),
    api_pb2.ElectMasterRequest(broker_name="{}"), api_pb2.AlterSyncStateSetRequest(broker_name="{}"),
    api_pb2.CleanBrokerDataRequest(broker_name="{}"), api_pb2.BrokerSetRequest(broker_name="{}"),
    api_pb2.ControllerHeartbeatRequest(broker_name="{}", broker_id=1), api_pb2.ListBrokerSetsRequest())


@pytest.mark.parametrize("name", ["b1", "b2", "mv", "new"])
def test_every_controller_request_goes_to_group0_whichever_group_holds_the_set(g0: MetadataState, name: str) -> None:
    """Controller records are group 0's (docs/scaling.md, "Controller mode with groups"): a set placed in
    group 1 or 2, moving, or not assigned yet (no AssignFirst: a controller claim places no set)."""
    for template in CONTROLLER_REQUESTS:
        request = type(template)()
        request.CopyFrom(template)
        if hasattr(request, "broker_name"):
            request.broker_name = name
        assert route(request, g0.directory, GROUPS) == ToGroup(0), type(request).__name__
    assert not g0.directory.assigned("new")


def test_records_of_no_broker_set_stay_in_group0(g0: MetadataState) -> None:
    d = g0.directory
    for request in (api_pb2.PutKvRequest(namespace="n", key="k", value="v"), api_pb2.DeleteKvRequest(),
                    api_pb2.UpdateSettingsRequest(), api_pb2.BindQueueRequest(topic="b1"),
                    api_pb2.ReleaseQueueRequest(topic="b2")):
        assert route(request, d, GROUPS) == ToGroup(0), type(request).__name__


def test_a_moving_set_refuses_writes_but_its_reads_and_heartbeats_go_to_the_source(g0: MetadataState) -> None:
    d = g0.directory
    moving = Moving("mv", 1, 2)
    assert route(api_pb2.RegisterBrokerRequest(broker_name="mv"), d, GROUPS) == moving
    assert route(api_pb2.UnregisterBrokerRequest(broker_name="mv"), d, GROUPS) == moving
    # its controller record is group 0's and never moves: an election goes on while the set moves
    assert route(api_pb2.ElectMasterRequest(broker_name="mv"), d, GROUPS) == ToGroup(0)
    topic = api_pb2.RegisterTopicRequest(topic="T", queue_datas=[state_pb2.QueueData(broker_name="b1"),
                                                                 state_pb2.QueueData(broker_name="mv")])
    assert route(topic, d, GROUPS) == moving
    assert route(api_pb2.GetBrokerMemberGroupRequest(broker_name="mv"), d, GROUPS) == ToGroup(1)
    hb = api_pb2.HeartbeatRequest(heartbeats=[api_pb2.BrokerHeartbeat(broker_name="mv", broker_addr="a:1")])
    assert route(hb, d, GROUPS) == ToGroup(1)


def test_requests_about_several_sets_are_split_by_group(g0: MetadataState) -> None:
    d = g0.directory
    beats = [api_pb2.BrokerHeartbeat(broker_name=name, broker_addr=f"{name}:1") for name in ("b2", "b1", "new", "b1")]
    placed = route(api_pb2.HeartbeatRequest(heartbeats=beats, want_silences=True), d, GROUPS)
    assert isinstance(placed, Split)
    assert [(g, [hb.broker_addr for hb in part.heartbeats], part.want_silences) for g, part in placed.parts] == [
        (0, ["new:1"], False), (1, ["b1:1", "b1:1"], False), (2, ["b2:1"], False)]
    topic = api_pb2.RegisterTopicRequest(topic="T", queue_datas=[
        state_pb2.QueueData(broker_name=name, perm=6) for name in ("b2", "b1", "b2")])
    placed = route(topic, d, GROUPS)
    assert isinstance(placed, Split)
    assert [(g, part.topic, [qd.broker_name for qd in part.queue_datas]) for g, part in placed.parts] == [
        (1, "T", ["b1"]), (2, "T", ["b2", "b2"])]
    one = api_pb2.RegisterTopicRequest(topic="T", queue_datas=[state_pb2.QueueData(broker_name="b2")])
    assert route(one, d, GROUPS) == ToGroup(2)
    assert route(api_pb2.RegisterTopicRequest(topic="T"), d, GROUPS) == ToGroup(0)
    deleted = api_pb2.DeleteTopicRequest(topic="T")
    assert route(deleted, d, GROUPS) == Split(((0, deleted), (1, deleted), (2, deleted)))


def test_with_one_group_everything_is_group0s_and_the_directory_is_not_read(g0: MetadataState) -> None:
    for request in (api_pb2.RegisterBrokerRequest(broker_name="new"), api_pb2.RegisterBrokerRequest(broker_name="mv"),
                    api_pb2.DeleteTopicRequest(topic="T"), api_pb2.HeartbeatRequest()):
        assert route(request, g0.directory, 1) == ToGroup(0)


def test_a_request_of_no_rule_is_a_type_error_not_a_guess(g0: MetadataState) -> None:
    with pytest.raises(TypeError, match="GetRouteRequest"):
        route(api_pb2.GetRouteRequest(topic="T"), g0.directory, GROUPS)
