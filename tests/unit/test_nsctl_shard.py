"""`nsctl shard list|assign|move` (nameserver/cli/nsctl_shard.py) against an in-process fake Shards servicer,
and against a node without the service (a one-group node: sharded nodes serve it, tests/integration/test_groups.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest

from nameserver.cli import nsctl
from nameserver.cli.nsctl_shard import NOT_ENABLED
from nameserver.pb import api_pb2_grpc, shards_pb2, shards_pb2_grpc, state_pb2

Capsys = pytest.CaptureFixture[str]


class FakeShards(shards_pb2_grpc.ShardsServicer):
    """Three groups; b1 in group 1 (pinned), b2 moving from 0 to 2. Records each request."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.refuse: tuple[grpc.StatusCode, str] | None = None

    def _record(self, method: str, request: Any, context: grpc.ServicerContext) -> None:
        self.calls.append((method, request))
        if self.refuse is not None:
            context.abort(*self.refuse)

    def ListShards(self, request: Any, context: grpc.ServicerContext) -> shards_pb2.ListShardsReply:
        self._record("ListShards", request, context)
        return shards_pb2.ListShardsReply(groups=3, apply_offsets=[12, 40, 7], sets=[
            shards_pb2.ShardEntry(broker_name="b1", set=state_pb2.ShardSet(group=1, pinned=True, cluster="c1",
                                                                           since=33)),
            shards_pb2.ShardEntry(broker_name="b2", set=state_pb2.ShardSet(group=0, moving_to=2, cluster="c1"))])

    def AssignShard(self, request: Any, context: grpc.ServicerContext) -> shards_pb2.AssignShardReply:
        self._record("AssignShard", request, context)
        return shards_pb2.AssignShardReply(offset=13, records=1)

    def MoveShard(self, request: Any, context: grpc.ServicerContext) -> shards_pb2.MoveShardReply:
        self._record("MoveShard", request, context)
        return shards_pb2.MoveShardReply(source=1, steps=5, set=state_pb2.ShardSet(group=request.group, since=41))


def _serve(*servicers: Any) -> Iterator[tuple[str, FakeShards | None]]:
    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    shards = None
    for servicer in servicers:
        if isinstance(servicer, FakeShards):
            shards = servicer
            shards_pb2_grpc.add_ShardsServicer_to_server(servicer, server)
        else:
            api_pb2_grpc.add_AdminServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}", shards
    finally:
        server.stop(0)


@pytest.fixture
def sharded() -> Iterator[tuple[str, FakeShards | None]]:
    yield from _serve(FakeShards())


@pytest.fixture
def unsharded() -> Iterator[tuple[str, FakeShards | None]]:
    """A node serving other services but not Shards."""
    yield from _serve(api_pb2_grpc.AdminServicer())


def run(capsys: Capsys, endpoint: str, *args: str) -> tuple[int, str, str]:
    code = nsctl.main(["--endpoints", endpoint, "--timeout", "5", *args])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


def test_list_prints_the_directory_each_groups_count_and_the_offsets(capsys: Capsys, sharded: Any) -> None:
    endpoint, shards = sharded
    code, out, _ = run(capsys, endpoint, "shard", "list")
    assert code == 0
    assert out.splitlines() == [
        "BROKER SET  GROUP  MOVING TO  SINCE  PINNED  CLUSTER",
        "b1              1  -             33  yes     c1",
        "b2              0  2              -  no      c1",
        "3 groups; 2 sets with a record (group 0: 1, group 1: 1, group 2: 0), 1 moving; a set with no record is "
        "group 0's",
        "served at apply offsets group 0 at 12, group 1 at 40, group 2 at 7"]
    run(capsys, endpoint, "shard", "list", "b1")
    assert [req.broker_name for _, req in shards.calls] == ["", "b1"]
    code, out, _ = run(capsys, endpoint, "--json", "shard", "list")
    doc = json.loads(out)
    assert code == 0 and doc["groups"] == 3 and doc["apply_offsets"] == [12, 40, 7]
    assert doc["sets"][1] == {"broker_name": "b2", "set": {"group": 0, "moving_to": 2, "since": 0, "pinned": False,
                                                             "cluster": "c1"}}


def test_assign_and_move_send_the_set_and_group_and_say_what_was_done(capsys: Capsys, sharded: Any) -> None:
    endpoint, shards = sharded
    code, out, _ = run(capsys, endpoint, "shard", "assign", "team/a", "2")
    assert code == 0 and out == "broker set team/a is now pinned to group 2 (offset 13)\n"
    code, out, _ = run(capsys, endpoint, "shard", "move", "b1", "0")
    assert code == 0
    assert out == "broker set b1 moved from group 1 to group 0 in 5 steps; reads of it wait for group 0's offset 41\n"
    assert [(m, r.broker_name, r.group) for m, r in shards.calls] == [("AssignShard", "team/a", 2),
                                                                      ("MoveShard", "b1", 0)]


def test_a_refusal_by_the_node_is_printed_with_its_code(capsys: Capsys, sharded: Any) -> None:
    endpoint, shards = sharded
    shards.refuse = (grpc.StatusCode.INVALID_ARGUMENT, "group: set 'b1' is in group 1 already")
    code, _, err = run(capsys, endpoint, "shard", "move", "b1", "1")
    assert code == 1 and err == "error: INVALID_ARGUMENT: group: set 'b1' is in group 1 already\n"


def test_bad_arguments_are_refused_by_name_before_any_call(capsys: Capsys, sharded: Any) -> None:
    endpoint, shards = sharded
    for args, says in [(("move", "", "1"), "argument broker_set: a broker set's name must not be empty"),
                       (("move", "b1", "-1"), "argument group: a group is 0 or more: -1"),
                       (("assign", "b1", "two"), "argument group: a group is a number: 'two'"),
                       (("move", "b1"), "the following arguments are required: group")]:
        code, _, err = run(capsys, endpoint, "shard", *args)
        assert code == 2 and says in err, err
    assert shards.calls == []


@pytest.mark.parametrize("args", [("list",), ("assign", "b1", "1"), ("move", "b1", "1")])
def test_a_node_without_sharding_says_so_instead_of_an_empty_directory(capsys: Capsys, unsharded: Any,
                                                                       args: tuple[str, ...]) -> None:
    endpoint, _ = unsharded
    code, out, err = run(capsys, endpoint, "shard", *args)
    assert (code, out) == (1, "")
    assert err == f"error: UNIMPLEMENTED: {NOT_ENABLED}\n"
