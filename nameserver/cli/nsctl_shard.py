"""`nsctl shard ...`: which Raft group holds each broker set (RIP-18 sharding, docs/scaling.md).

    nsctl shard list [BROKER_SET]          # group 0's directory: each set's group, a move under way
    nsctl shard assign BROKER_SET GROUP    # pin a set to a group (before its first registration, or where it is)
    nsctl shard move BROKER_SET GROUP      # move a set to a group; answers once moved (admin)

The calls are the Shards service (proto/nameserver/pb/shards.proto), served by the workers of a node with
[sharding] groups > 1. A one-group node does not serve it, and nsctl says sharding is not enabled rather
than print an empty directory as if every set were placed. Assign and move run on group 0's leader (the
move duty: nameserver/groups/moveduty.py); a move that outlasts --timeout goes on there, and nsctl prints
the node's message saying so (DEADLINE_EXCEEDED; `nsctl shard list SET` shows where it stands).
"""

from __future__ import annotations

import argparse
from typing import Any

import grpc

from nameserver.cli import render
from nameserver.cli.nsctl_calls import CommandError, Context, call_any, emit_reply
from nameserver.pb import shards_pb2, shards_pb2_grpc, state_pb2

# What nsctl says for a node without the service, a one-group node (UNIMPLEMENTED: gRPC's own "Method not
# found!" would not say why)
NOT_ENABLED = "sharding is not enabled on this cluster: [sharding] groups = 1"


def _call(ctx: Context, method: str, request: Any) -> Any:
    try:
        return call_any(ctx, shards_pb2_grpc.ShardsStub, method, request)[1]
    except CommandError as err:
        if err.code == grpc.StatusCode.UNIMPLEMENTED.name:
            raise CommandError(err.code, NOT_ENABLED) from None
        raise


def broker_set(text: str) -> str:
    """A BROKER_SET argument: any text but empty (broker names are free text, escaped in keys)."""
    if not text:
        raise argparse.ArgumentTypeError("a broker set's name must not be empty")
    return text


def group(text: str) -> int:
    """A GROUP argument: a group number, 0 or more (the node checks it is one of its groups)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a group is a number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"a group is 0 or more: {value}")
    return value


def _moving(value: state_pb2.ShardSet) -> str | None:
    return str(value.moving_to) if value.HasField("moving_to") else None


def list_lines(reply: shards_pb2.ListShardsReply) -> list[str]:
    """The directory as a table, then how many sets each group holds by it and the offsets read at."""
    rows = [[e.broker_name, e.set.group, _moving(e.set), e.set.since or None, "yes" if e.set.pinned else "no",
             e.set.cluster or None] for e in reply.sets]
    held = [sum(1 for e in reply.sets if e.set.group == k) for k in range(reply.groups)]
    moving = sum(1 for e in reply.sets if e.set.HasField("moving_to"))
    counts = ", ".join(f"group {k}: {n}" for k, n in enumerate(held))
    offsets = ", ".join(f"group {k} at {offset}" for k, offset in enumerate(reply.apply_offsets))
    return [render.table(("BROKER SET", "GROUP", "MOVING TO", "SINCE", "PINNED", "CLUSTER"), rows),
            f"{reply.groups} groups; {render.plural(len(reply.sets), 'set')} with a record ({counts}), "
            f"{moving} moving; a set with no record is group 0's",
            f"served at apply offsets {offsets}"]


def assign_line(name: str, target: int, reply: shards_pb2.AssignShardReply) -> str:
    done = "already" if reply.records == 0 else "now"
    return render.cell(f"broker set {name} is {done} pinned to group {target}") + f" (offset {reply.offset})"


def move_line(name: str, reply: shards_pb2.MoveShardReply) -> str:
    how = f"in {render.plural(reply.steps, 'step')}" if reply.steps else "by an earlier call"
    return (render.cell(f"broker set {name} moved from group {reply.source} to group {reply.set.group}")
            + f" {how}; reads of it wait for group {reply.set.group}'s offset {reply.set.since}")


def cmd_list(ctx: Context, args: argparse.Namespace) -> int:
    reply = _call(ctx, "ListShards", shards_pb2.ListShardsRequest(broker_name=args.broker_set or ""))
    return emit_reply(ctx, reply, *list_lines(reply))


def cmd_assign(ctx: Context, args: argparse.Namespace) -> int:
    reply = _call(ctx, "AssignShard", shards_pb2.ShardPlacement(broker_name=args.broker_set, group=args.group))
    return emit_reply(ctx, reply, assign_line(args.broker_set, args.group, reply))


def cmd_move(ctx: Context, args: argparse.Namespace) -> int:
    reply = _call(ctx, "MoveShard", shards_pb2.ShardPlacement(broker_name=args.broker_set, group=args.group))
    return emit_reply(ctx, reply, move_line(args.broker_set, reply))


def add_shard_commands(b: Any, sub: Any) -> None:
    """Register `nsctl shard ...` on nsctl's parser (b: nsctl's _Builder)."""
    shard = b.group(sub, "shard", "sharding: which Raft group holds each broker set")
    listing = b.command(shard, "list", cmd_list, "group 0's directory: each broker set's group, moves under way")
    listing.add_argument("broker_set", nargs="?", type=broker_set, help="one set (default: every set)")
    for name, handler, help_text in (
            ("assign", cmd_assign, "pin a broker set to a group, before its first registration (admin)"),
            ("move", cmd_move, "move a broker set to another group; answers once moved (admin)")):
        command = b.command(shard, name, handler, help_text)
        command.add_argument("broker_set", type=broker_set)
        command.add_argument("group", type=group)


__all__ = ["NOT_ENABLED", "add_shard_commands"]
