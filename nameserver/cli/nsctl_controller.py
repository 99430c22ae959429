"""`nsctl controller ...`: controller mode's broker sets (RocketMQ 5, RIP-44; docs/controller.md).

    nsctl controller list                           # every broker set: master, epochs, in-sync replicas
    nsctl controller show BROKER_SET                # one set, replica by replica (alive as the answering node sees it)
    nsctl controller elect BROKER_SET [--broker-id N]   # N: that broker or nobody; none: the best in-sync replica
    nsctl controller clean BROKER_SET [--broker-id N ...] [--clean-living]   # forget brokers (or the whole set)

A refusal by the controller (a live broker to clean, no in-sync replica to elect) prints RocketMQ's code
and remark and exits 1, as mqadmin's electMaster and cleanBrokerMetadata fail on the stock controller.
"""

from __future__ import annotations

import argparse
from typing import Any

from nameserver.cli import render
from nameserver.cli.nsctl_calls import CommandError, Context, call_any, emit_json, emit_reply
from nameserver.pb import api_pb2, api_pb2_grpc
from nameserver.safetext import escape_controls

NO_BROKER = -1


def _call(ctx: Context, method: str, request: Any) -> Any:
    return call_any(ctx, api_pb2_grpc.ControllerStub, method, request)[1]


def _in_sync(view: api_pb2.BrokerSetView) -> str:
    return ",".join(str(i) for i in view.sync_state_set) or "-"


def _master(view: api_pb2.BrokerSetView) -> str:
    return f"{view.master_id} ({view.master_address})" if view.master_id else "none"


def _refused(reply: api_pb2.ControllerReply) -> None:
    if reply.code:
        raise CommandError(f"CONTROLLER_{reply.code}", reply.remark)


def cmd_list(ctx: Context, args: argparse.Namespace) -> int:
    reply = _call(ctx, "ListBrokerSets", api_pb2.ListBrokerSetsRequest())
    rows = [[v.broker_name, v.cluster_name, _master(v), v.master_epoch, _in_sync(v), v.sync_state_set_epoch,
             sum(r.alive for r in v.replicas), len(v.replicas)] for v in reply.sets]
    return emit_reply(ctx, reply, render.table(("BROKER SET", "CLUSTER", "MASTER", "EPOCH", "IN SYNC", "SET EPOCH",
                                                "ALIVE", "REPLICAS"), rows),
                      f"served at apply offset {reply.apply_offset}")


def _print_set(ctx: Context, reply: api_pb2.ControllerReply, what: str = "") -> int:
    v = reply.set
    rows = [[r.broker_id, r.address, r.broker_id == v.master_id, r.in_sync, r.alive] for r in v.replicas]
    head = escape_controls(f"broker set {v.broker_name} (cluster {v.cluster_name}): master {_master(v)}, ")
    return emit_reply(ctx, reply, head +
                      f"master epoch {v.master_epoch}, in sync {{{_in_sync(v)}}} at epoch {v.sync_state_set_epoch}",
                      render.table(("ID", "ADDRESS", "MASTER", "IN SYNC", "ALIVE"), rows), *([what] if what else []))


def cmd_show(ctx: Context, args: argparse.Namespace) -> int:
    reply = _call(ctx, "GetReplicaInfo", api_pb2.BrokerSetRequest(broker_name=args.broker_set))
    _refused(reply)
    return _print_set(ctx, reply)


def cmd_elect(ctx: Context, args: argparse.Namespace) -> int:
    designated = args.broker_id is not None
    request = api_pb2.ElectMasterRequest(broker_name=args.broker_set, designate_elect=designated,
                                         broker_id=args.broker_id if designated else NO_BROKER)
    reply = _call(ctx, "ElectMaster", request)
    _refused(reply)
    return _print_set(ctx, reply, f"elected at offset {reply.offset}")


def cmd_clean(ctx: Context, args: argparse.Namespace) -> int:
    request = api_pb2.CleanBrokerDataRequest(broker_name=args.broker_set, broker_ids=args.broker_id or [],
                                             clean_living_broker=args.clean_living)
    reply = _call(ctx, "CleanBrokerData", request)
    _refused(reply)
    if ctx.json:
        emit_json(render.to_dict(reply))
    elif reply.HasField("set"):
        _print_set(ctx, reply, f"cleaned at offset {reply.offset}")
    else:
        print(f"broker set {args.broker_set} removed at offset {reply.offset}")
    return 0


def add_controller_commands(b: Any, sub: Any) -> None:
    group = b.group(sub, "controller", "controller mode: RocketMQ 5 broker sets and their masters")
    b.command(group, "list", cmd_list, "every broker set: master, epochs, in-sync replicas")
    b.command(group, "show", cmd_show, "one broker set, replica by replica").add_argument("broker_set")
    elect = b.command(group, "elect", cmd_elect, "elect a broker set's master (admin)")
    elect.add_argument("broker_set")
    elect.add_argument("--broker-id", type=int, default=None,
                       help="elect this broker or nobody (default: the best live in-sync replica)")
    clean = b.command(group, "clean", cmd_clean, "forget brokers of a set, or the whole set (admin)")
    clean.add_argument("broker_set")
    clean.add_argument("--broker-id", type=int, action="append", help="a broker id to forget (repeatable; "
                       "none: the whole set)")
    clean.add_argument("--clean-living", action="store_true", help="even brokers that still heartbeat")


__all__ = ["add_controller_commands"]
