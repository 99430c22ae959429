"""nsctl's commands about the cluster itself: status of every node, members, membership changes,
leadership transfer, snapshots."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

import grpc

from nameserver.cli import render
from nameserver.cli.nsctl_calls import (
    RETRYABLE,
    Context,
    call_any,
    call_each,
    describe,
    emit_json,
    emit_reply,
    role_name,
    status_code,
    status_details,
)
from nameserver.pb import api_pb2, api_pb2_grpc

DIGEST_SHORT = 12


def _status_json(endpoint: str, result: Any) -> dict[str, Any]:
    if isinstance(result, grpc.RpcError):
        return {"endpoint": endpoint, "error": describe(result)}
    data = render.to_dict(result)
    data["role"] = role_name(result.role)
    for group, status in zip(data["groups"], result.groups, strict=True):
        group["role"] = role_name(status.role)
    data["endpoint"] = endpoint
    return data


def _status_row(endpoint: str, result: Any) -> list[Any]:
    if isinstance(result, grpc.RpcError):
        code = status_code(result)
        label = "unreachable" if code in RETRYABLE else "error"
        return ["-", endpoint, f"{label} ({code.name})"] + [None] * 9
    replica = result.role == api_pb2.ROLE_REPLICA
    return [
        result.node_id,
        result.grpc_addr or endpoint,
        role_name(result.role),
        result.following if replica else result.leader_grpc_addr or result.leader_id,
        None if replica else result.term,
        None if replica else result.end_offset,
        result.commit_offset,
        result.apply_offset,
        result.lag if replica else None,
        result.digest[:DIGEST_SHORT],
        result.ready,
        result.keys,
    ]


def _group_rows(endpoint: str, result: Any) -> list[list[Any]]:
    """A sharded cluster's rows: one per group core of each node, GROUP after GRPC ADDR (a node that did not
    answer, or a read replica, has one row and no group)."""
    if isinstance(result, grpc.RpcError) or not result.groups:
        row = _status_row(endpoint, result)
        return [row[:2] + [None] + row[2:]]
    rows = []
    for group, status in enumerate(result.groups):
        row = _status_row(result.grpc_addr or endpoint, status)
        rows.append(row[:2] + [group] + row[2:])
    return rows


# A read replica's LEADER is the voter it follows, its COMMIT that voter's apply offset as last heard.
_STATUS_HEADERS = ["NODE", "GRPC ADDR", "ROLE", "LEADER", "TERM", "END", "COMMIT", "APPLY", "LAG", "DIGEST"]
_STATUS_HEADERS += ["READY", "KEYS"]
# With [sharding] groups > 1 each node runs a Raft group per core: NODE is the group's Raft address there,
# LEADER the gRPC address of the node whose core leads the group.
_GROUP_HEADERS = _STATUS_HEADERS[:2] + ["GROUP"] + _STATUS_HEADERS[2:]


def _status_table(results: list[tuple[str, Any]]) -> str:
    if not any(not isinstance(r, grpc.RpcError) and r.groups for _, r in results):
        return render.table(_STATUS_HEADERS, [_status_row(endpoint, result) for endpoint, result in results])
    return render.table(_GROUP_HEADERS, [row for endpoint, result in results for row in _group_rows(endpoint, result)])


def _with_read_replicas(ctx: Context, results: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """The read replicas the voters say follow them (Follow streams open now), asked too: nothing lists
    them in advance, so starting or stopping one changes no configuration."""
    asked = set(ctx.endpoints) | {r.grpc_addr for _, r in results if not isinstance(r, grpc.RpcError)}
    found = sorted({addr for _, r in results if not isinstance(r, grpc.RpcError) for addr in r.read_replicas}
                   - asked)
    if not found:
        return results
    return results + call_each(dataclasses.replace(ctx, endpoints=found), api_pb2_grpc.AdminStub, "Status",
                               api_pb2.StatusRequest())


def _warn_digest_mismatch(results: list[tuple[str, Any]]) -> None:
    # Invariant: replicas of a group at the same apply offset have the same digest; say loudly when they do not.
    by_offset: dict[tuple[int, int], set[str]] = {}
    for _, result in results:
        if not isinstance(result, grpc.RpcError):
            for group, status in enumerate(result.groups or [result]):
                by_offset.setdefault((group, status.apply_offset), set()).add(status.digest)
    for (group, offset), digests in sorted(by_offset.items()):
        if len(digests) > 1:
            where = f"group {group}'s " if group else ""
            print(f"warning: digests differ at {where}apply offset {offset}: {sorted(digests)}", file=sys.stderr)


def _front_line(front: api_pb2.GrpcFront) -> str:
    """A node's Go gRPC front end ([node] grpc_front = "go"), as its core sees the process."""
    state = f"up, pid {front.pid}" if front.up else "down (its core starts it again)"
    return f"Go gRPC front end {state}, restarted {front.restarts} times"


def cmd_status(ctx: Context, args: argparse.Namespace) -> int:
    results = _with_read_replicas(ctx, call_each(ctx, api_pb2_grpc.AdminStub, "Status", api_pb2.StatusRequest()))
    failed = [(endpoint, r) for endpoint, r in results if isinstance(r, grpc.RpcError)]
    if ctx.json:
        emit_json({"nodes": [_status_json(endpoint, result) for endpoint, result in results]})
    else:
        print(_status_table(results))
        for endpoint, err in failed:
            print(f"error: {status_code(err).name}: {endpoint}: {status_details(err)}", file=sys.stderr)
        for endpoint, r in results:
            if not isinstance(r, grpc.RpcError) and r.not_ready_reason:
                print(f"read replica {r.grpc_addr or endpoint} refuses reads: {r.not_ready_reason}")
            for group in r.groups[1:] if not isinstance(r, grpc.RpcError) else ():
                if group.not_ready_reason:  # its core did not answer the node's worker
                    print(f"{r.grpc_addr or endpoint}: {group.not_ready_reason}")
            if not isinstance(r, grpc.RpcError) and r.HasField("grpc_front"):
                print(f"{r.grpc_addr or endpoint}: {_front_line(r.grpc_front)}")
    _warn_digest_mismatch(results)
    return 1 if failed else 0


def cmd_members(ctx: Context, args: argparse.Namespace) -> int:
    endpoint, reply = call_any(ctx, api_pb2_grpc.AdminStub, "Members", api_pb2.MembersRequest())
    rows = [
        [m.node_id, m.grpc_addr, m.is_self, m.is_leader, m.connected, m.match_offset] for m in reply.members
    ]
    return emit_reply(ctx, reply, render.table(("NODE", "GRPC ADDR", "SELF", "LEADER", "CONNECTED", "MATCH"), rows),
                      f"answered by {endpoint}")


def _print_members(ctx: Context, reply: Any, what: str) -> int:
    rows = [[m.node_id, m.grpc_addr, m.is_leader, m.connected] for m in reply.members]
    return emit_reply(ctx, reply, render.table(("NODE", "GRPC ADDR", "LEADER", "CONNECTED"), rows), what)


def cmd_member_add(ctx: Context, args: argparse.Namespace) -> int:
    req = api_pb2.MemberChangeRequest(node_id=args.node_id, grpc_addr=args.grpc_addr)
    _, reply = call_any(ctx, api_pb2_grpc.AdminStub, "AddMember", req)
    return _print_members(ctx, reply, f"added {args.node_id}")


def cmd_member_remove(ctx: Context, args: argparse.Namespace) -> int:
    req = api_pb2.MemberChangeRequest(node_id=args.node_id)
    _, reply = call_any(ctx, api_pb2_grpc.AdminStub, "RemoveMember", req)
    return _print_members(ctx, reply, f"removed {args.node_id}")


def cmd_leader_transfer(ctx: Context, args: argparse.Namespace) -> int:
    req = api_pb2.TransferLeadershipRequest(node_id=args.node_id or "")
    _, reply = call_any(ctx, api_pb2_grpc.AdminStub, "TransferLeadership", req)
    return emit_reply(ctx, reply, f"leader is now {reply.leader_id or 'being elected'}")


def cmd_snapshot(ctx: Context, args: argparse.Namespace) -> int:
    if args.all:
        return _snapshot_all(ctx)
    endpoint, reply = call_any(ctx, api_pb2_grpc.AdminStub, "TakeSnapshot", api_pb2.TakeSnapshotRequest())
    return emit_reply(ctx, reply, f"snapshot at offset {reply.offset} on {endpoint}")


def _snapshot_all(ctx: Context) -> int:
    results = call_each(ctx, api_pb2_grpc.AdminStub, "TakeSnapshot", api_pb2.TakeSnapshotRequest())
    failed = [r for _, r in results if isinstance(r, grpc.RpcError)]
    if ctx.json:
        emit_json({"nodes": [_snapshot_json(endpoint, result) for endpoint, result in results]})
    else:
        rows = [
            [endpoint, describe(r) if isinstance(r, grpc.RpcError) else r.offset] for endpoint, r in results
        ]
        print(render.table(("ENDPOINT", "SNAPSHOT OFFSET"), rows))
    return 1 if failed else 0


def _snapshot_json(endpoint: str, result: Any) -> dict[str, Any]:
    if isinstance(result, grpc.RpcError):
        return {"endpoint": endpoint, "error": describe(result)}
    return {"endpoint": endpoint, **render.to_dict(result)}


# ---- command line ----


def add_cluster_commands(b: Any, sub: Any) -> None:
    b.command(sub, "status", cmd_status, "status of every node (exit 1 unless all answer)")
    b.command(sub, "members", cmd_members, "Raft members as one node sees them")
    snap = b.command(sub, "snapshot", cmd_snapshot, "take a snapshot now")
    snap.add_argument("--all", action="store_true", help="on every endpoint, not just the first that answers")


def add_membership_commands(b: Any, sub: Any) -> None:
    member = b.group(sub, "member", "cluster membership (one change at a time)")
    add = b.command(member, "add", cmd_member_add, "add a started node to the cluster")
    add.add_argument("node_id", help="the new node's Raft address (host:port)")
    add.add_argument("--grpc-addr", required=True, help="the new node's gRPC address (host:port)")
    b.command(member, "remove", cmd_member_remove, "remove a member (not the leader)").add_argument(
        "node_id", help="the member's Raft address")
    leader = b.group(sub, "leader", "leadership")
    b.command(leader, "transfer", cmd_leader_transfer, "hand leadership to another member").add_argument(
        "node_id", nargs="?", help="target member's Raft address (default: the most caught-up one)")
