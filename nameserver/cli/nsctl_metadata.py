"""nsctl's commands about the metadata: route, cluster and topic reads, KV config, replicated settings,
broker registration and heartbeats, topic and permission administration."""

from __future__ import annotations

import argparse
from typing import Any

import grpc

from nameserver.chunking import register_chunks, should_stream
from nameserver.cli import render
from nameserver.cli.nsctl_calls import (
    CommandError,
    Context,
    UsageError,
    emit_json,
    emit_reply,
    emit_write,
    ns_call,
    served_at,
)
from nameserver.pb import api_pb2, state_pb2
from nameserver.safetext import escape_controls

_TOPIC_KINDS = {
    "all": api_pb2.TOPIC_LIST_ALL,
    "cluster": api_pb2.TOPIC_LIST_BY_CLUSTER,
    "system": api_pb2.TOPIC_LIST_SYSTEM,
    "unit": api_pb2.TOPIC_LIST_UNIT,
    "unit-sub": api_pb2.TOPIC_LIST_HAS_UNIT_SUB,
    "unit-sub-not-unit": api_pb2.TOPIC_LIST_HAS_UNIT_SUB_NOT_UNIT,
}


# ---- reads ----


def cmd_route(ctx: Context, args: argparse.Namespace) -> int:
    request = api_pb2.GetRouteRequest(topic=args.topic, min_offset=args.min_offset, zone_name=args.zone)
    try:
        reply = ns_call(ctx, "GetRoute", request)
    except CommandError as err:
        if err.code == grpc.StatusCode.NOT_FOUND.name:
            raise CommandError(err.code, f"topic {args.topic} not found") from None
        raise
    return emit_reply(ctx, reply, _route_text(reply.route), served_at(reply.apply_offset))


def _route_text(route: api_pb2.TopicRoute) -> str:
    queues = [
        [q.broker_name, q.read_queue_nums, q.write_queue_nums, render.perm_text(q.perm), q.topic_sys_flag]
        for q in route.queue_datas
    ]
    brokers = [
        [b.cluster, b.broker_name, b.zone, a.broker_id, a.addr] for b in route.broker_datas for a in b.addrs
    ]
    parts = [
        "queue datas:",
        render.table(("BROKER", "READ", "WRITE", "PERM", "SYSFLAG"), queues),
        "",
        "broker datas:",
        render.table(("CLUSTER", "BROKER", "ZONE", "BROKER ID", "ADDR"), brokers),
    ]
    if route.filter_server_table:
        filters = [[addr, ", ".join(fs.addrs)] for addr, fs in sorted(route.filter_server_table.items())]
        parts += ["", "filter servers:", render.table(("BROKER ADDR", "FILTER SERVERS"), filters)]
    if route.order_topic_conf:
        parts += ["", f"order topic conf: {escape_controls(route.order_topic_conf)}"]
    return "\n".join(parts)


def cmd_clusters(ctx: Context, args: argparse.Namespace) -> int:
    reply = ns_call(ctx, "GetClusterInfo", api_pb2.GetClusterInfoRequest(min_offset=args.min_offset))
    table = render.table(("CLUSTER", "BROKER NAME", "BROKER ID", "ADDRESS"), _cluster_rows(reply))
    return emit_reply(ctx, reply, table, served_at(reply.apply_offset))


def _broker_rows(cluster: str, name: str, data: state_pb2.BrokerData | None) -> list[list[Any]]:
    if data is None or not data.addrs:
        return [[cluster, name, None, None]]
    return [[cluster, name, a.broker_id, a.addr] for a in sorted(data.addrs, key=lambda a: a.broker_id)]


def _cluster_rows(reply: api_pb2.GetClusterInfoReply) -> list[list[Any]]:
    rows: list[list[Any]] = []
    listed: set[str] = set()
    for cluster in sorted(reply.cluster_addr_table):
        for name in sorted(reply.cluster_addr_table[cluster].names):
            listed.add(name)
            rows += _broker_rows(cluster, name, reply.broker_addr_table.get(name))
    # Brokers missing from the cluster table would otherwise be invisible.
    for name in sorted(set(reply.broker_addr_table) - listed):
        data = reply.broker_addr_table[name]
        rows += _broker_rows(data.cluster, name, data)
    return rows


def _topic_kind(args: argparse.Namespace) -> api_pb2.TopicListKind:
    kind = args.kind or ("cluster" if args.cluster else "all")
    if kind == "cluster" and not args.cluster:
        raise UsageError("--kind cluster needs --cluster")
    if args.cluster and kind != "cluster":
        raise UsageError(f"--cluster applies only to --kind cluster, not --kind {kind}")
    return _TOPIC_KINDS[kind]


def cmd_topics(ctx: Context, args: argparse.Namespace) -> int:
    request = api_pb2.GetTopicListRequest(
        kind=_topic_kind(args), cluster_name=args.cluster, min_offset=args.min_offset
    )
    reply = ns_call(ctx, "GetTopicList", request)
    return emit_reply(ctx, reply, *map(escape_controls, reply.topics), f"{render.plural(len(reply.topics), 'topic')}, "
                      f"{served_at(reply.apply_offset)}")


# ---- kv ----


def cmd_kv_get(ctx: Context, args: argparse.Namespace) -> int:
    request = api_pb2.GetKvRequest(namespace=args.namespace, key=args.key, min_offset=args.min_offset)
    reply = ns_call(ctx, "GetKv", request)
    return emit_reply(ctx, reply, escape_controls(reply.value), served_at(reply.apply_offset))


def cmd_kv_put(ctx: Context, args: argparse.Namespace) -> int:
    request = api_pb2.PutKvRequest(namespace=args.namespace, key=args.key, value=args.value)
    return emit_write(ctx, ns_call(ctx, "PutKv", request))


def cmd_kv_delete(ctx: Context, args: argparse.Namespace) -> int:
    request = api_pb2.DeleteKvRequest(namespace=args.namespace, key=args.key)
    return emit_write(ctx, ns_call(ctx, "DeleteKv", request))


def cmd_kv_list(ctx: Context, args: argparse.Namespace) -> int:
    request = api_pb2.ListKvRequest(namespace=args.namespace, min_offset=args.min_offset)
    reply = ns_call(ctx, "ListKv", request)
    return emit_reply(ctx, reply, render.table(("KEY", "VALUE"), sorted(reply.table.items())),
                      served_at(reply.apply_offset))


def cmd_settings_get(ctx: Context, args: argparse.Namespace) -> int:
    reply = ns_call(ctx, "GetSettings", api_pb2.GetSettingsRequest(min_offset=args.min_offset))
    stored = set(reply.stored)
    rows = [(name, "true" if on else "false", "log" if name in stored else "default")
            for name, on in sorted(reply.settings.items())]
    return emit_reply(ctx, reply, render.table(("SETTING", "VALUE", "FROM"), rows), served_at(reply.apply_offset))


def cmd_settings_set(ctx: Context, args: argparse.Namespace) -> int:
    values = {}
    for item in args.assignments:
        name, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"nsctl settings set: {item!r} is not NAME=VALUE")
        values[name.strip()] = value.strip()
    return emit_write(ctx, ns_call(ctx, "UpdateSettings", api_pb2.UpdateSettingsRequest(settings=values)))


# ---- brokers ----


def _read_topics_file(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8") as handle:
            return [line.strip() for line in handle if line.strip()]
    except OSError as err:
        raise UsageError(f"cannot read --topics-file: {err}") from None


def collect_topics(args: argparse.Namespace) -> list[str]:
    """Topic names from --topic, --topics-file and --topic-prefix/--topic-count, first occurrence kept."""
    names = list(args.topic or [])
    if args.topics_file:
        names += _read_topics_file(args.topics_file)
    if (args.topic_prefix is None) != (args.topic_count is None):
        raise UsageError("--topic-prefix and --topic-count go together")
    if args.topic_count is not None:
        if args.topic_count < 0:
            raise UsageError("--topic-count must be >= 0")
        names += [f"{args.topic_prefix}{i}" for i in range(args.topic_count)]
    return list(dict.fromkeys(names))


def build_register_request(args: argparse.Namespace) -> api_pb2.RegisterBrokerRequest:
    topics = [
        api_pb2.TopicConfig(
            topic_name=name, read_queue_nums=args.queues, write_queue_nums=args.queues, perm=args.perm
        )
        for name in collect_topics(args)
    ]
    return api_pb2.RegisterBrokerRequest(
        cluster_name=args.cluster,
        broker_name=args.name,
        broker_addr=args.addr,
        broker_id=args.id,
        ha_server_addr=args.ha_addr,
        heartbeat_timeout_ms=args.timeout_ms,
        zone_name=args.zone,
        # Timestamp fixed at 0: repeating the command is an unchanged re-registration that writes nothing.
        data_version=state_pb2.DataVersion(counter=args.data_version, timestamp=0),
        topics=topics,
    )



def cmd_broker_register(ctx: Context, args: argparse.Namespace) -> int:
    request = build_register_request(args)
    if args.stream or should_stream(request):
        reply = ns_call(ctx, "RegisterBrokerStream", register_chunks(request))
    else:
        reply = ns_call(ctx, "RegisterBroker", request)
    extra = f", master {escape_controls(reply.master_addr)}" if reply.master_addr else ""
    return emit_write(ctx, reply, extra)


def cmd_broker_unregister(ctx: Context, args: argparse.Namespace) -> int:
    request = api_pb2.UnregisterBrokerRequest(
        cluster_name=args.cluster, broker_name=args.name, broker_addr=args.addr, broker_id=args.id
    )
    return emit_write(ctx, ns_call(ctx, "UnregisterBroker", request))


def cmd_broker_heartbeat(ctx: Context, args: argparse.Namespace) -> int:
    beat = api_pb2.BrokerHeartbeat(cluster_name=args.cluster, broker_name=args.name, broker_addr=args.addr)
    reply = ns_call(ctx, "Heartbeat", api_pb2.HeartbeatRequest(heartbeats=[beat]))
    if ctx.json:
        emit_json(render.to_dict(reply))
    elif reply.unknown_addrs:
        print(f"not registered: {escape_controls(', '.join(reply.unknown_addrs))} (the broker should register again)")
    else:
        print("ok (heartbeats are not logged: no offset)")
    # An unknown broker is a failure for scripts: its heartbeat kept nothing alive.
    return 1 if reply.unknown_addrs else 0


def cmd_broker_simulate(ctx: Context, args: argparse.Namespace) -> int:
    from nameserver.cli import simulate

    return simulate.run(ctx.endpoints, args, ctx.timeout)


# ---- topics and permissions ----


def _emit_perm(ctx: Context, reply: api_pb2.BrokerPermReply) -> int:
    return emit_reply(ctx, reply, f"{render.plural(reply.topic_count, 'topic')}, offset {reply.offset}")


def cmd_perm_wipe(ctx: Context, args: argparse.Namespace) -> int:
    return _emit_perm(ctx, ns_call(ctx, "WipeWritePerm", api_pb2.BrokerPermRequest(broker_name=args.broker)))


def cmd_perm_add(ctx: Context, args: argparse.Namespace) -> int:
    return _emit_perm(ctx, ns_call(ctx, "AddWritePerm", api_pb2.BrokerPermRequest(broker_name=args.broker)))


def cmd_topic_delete(ctx: Context, args: argparse.Namespace) -> int:
    request = api_pb2.DeleteTopicRequest(topic=args.topic, cluster_name=args.cluster)
    return emit_write(ctx, ns_call(ctx, "DeleteTopic", request))


def cmd_topic_register(ctx: Context, args: argparse.Namespace) -> int:
    queue_datas = [
        state_pb2.QueueData(
            broker_name=broker, read_queue_nums=args.queues, write_queue_nums=args.queues, perm=args.perm
        )
        for broker in dict.fromkeys(args.broker)
    ]
    request = api_pb2.RegisterTopicRequest(topic=args.topic, queue_datas=queue_datas)
    return emit_write(ctx, ns_call(ctx, "RegisterTopic", request))


# ---- command line ----


def _add_min_offset(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--min-offset", type=int, default=0, help="read your writes: wait until the node applied this far"
    )


def _add_broker_identity(parser: argparse.ArgumentParser, with_id: bool) -> None:
    parser.add_argument("--cluster", required=True, help="cluster name")
    parser.add_argument("--name", required=True, help="broker name")
    parser.add_argument("--addr", required=True, help="broker address HOST:PORT")
    if with_id:
        parser.add_argument("--id", type=int, default=0, help="broker id (0 = master)")


def _add_queue_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--queues", type=int, default=4, help="read and write queue numbers")
    parser.add_argument("--perm", type=int, default=6, help="permission bits (6 = read+write)")


def _add_read_commands(b: Any, sub: Any) -> None:
    route = b.command(sub, "route", cmd_route, "a topic's route")
    route.add_argument("topic")
    _add_min_offset(route)
    route.add_argument("--zone", default="", help="only this zone's brokers")
    _add_min_offset(b.command(sub, "clusters", cmd_clusters, "clusters and their brokers"))
    topics = b.command(sub, "topics", cmd_topics, "topic list")
    topics.add_argument("--cluster", default="", help="only this cluster's topics (implies --kind cluster)")
    topics.add_argument("--kind", choices=sorted(_TOPIC_KINDS), default=None)
    _add_min_offset(topics)


def _add_kv_commands(b: Any, sub: Any) -> None:
    kv = b.group(sub, "kv", "KV config")
    get = b.command(kv, "get", cmd_kv_get, "read one key")
    get.add_argument("namespace")
    get.add_argument("key")
    _add_min_offset(get)
    put = b.command(kv, "put", cmd_kv_put, "write one key")
    put.add_argument("namespace")
    put.add_argument("key")
    put.add_argument("value")
    delete = b.command(kv, "delete", cmd_kv_delete, "delete one key")
    delete.add_argument("namespace")
    delete.add_argument("key")
    listing = b.command(kv, "list", cmd_kv_list, "every key of a namespace")
    listing.add_argument("namespace")
    _add_min_offset(listing)


def _add_settings_commands(b: Any, sub: Any) -> None:
    group = b.group(sub, "settings", "replicated settings (RocketMQ NamesrvConfig switches, set through the log)")
    get = b.command(group, "get", cmd_settings_get, "every setting, its value and whether the log set it")
    _add_min_offset(get)
    put = b.command(group, "set", cmd_settings_set, "set settings on every node, e.g. orderMessageEnable=true")
    put.add_argument("assignments", nargs="+", metavar="NAME=VALUE")


def _add_register_options(parser: argparse.ArgumentParser) -> None:
    _add_broker_identity(parser, with_id=True)
    parser.add_argument("--ha-addr", default="", help="HA server address HOST:PORT")
    parser.add_argument("--timeout-ms", type=int, default=0, help="heartbeat timeout (0: server default)")
    parser.add_argument("--data-version", type=int, default=1, help="DataVersion counter")
    parser.add_argument("--zone", default="", help="zone name")
    parser.add_argument("--topic", action="append", help="a topic (repeatable)")
    parser.add_argument("--topics-file", help="file with one topic per line")
    parser.add_argument("--topic-prefix", help="generate topics PREFIX0..PREFIX{N-1} ...")
    parser.add_argument("--topic-count", type=int, help="... this many")
    parser.add_argument("--stream", action="store_true", help="use the client stream even when small")
    _add_queue_options(parser)


def _add_broker_commands(b: Any, sub: Any) -> None:
    broker = b.group(sub, "broker", "register, unregister or heartbeat a broker")
    _add_register_options(b.command(broker, "register", cmd_broker_register, "register a broker"))
    unregister = b.command(broker, "unregister", cmd_broker_unregister, "unregister a broker")
    _add_broker_identity(unregister, with_id=True)
    heartbeat = b.command(broker, "heartbeat", cmd_broker_heartbeat, "send one heartbeat")
    _add_broker_identity(heartbeat, with_id=False)
    from nameserver.cli import simulate  # the client library's broker fleet (docs/client.md)

    simulate.add_arguments(b.command(broker, "simulate", cmd_broker_simulate, "run N simulated brokers"))


def _add_admin_commands(b: Any, sub: Any) -> None:
    perm = b.group(sub, "perm", "a broker's write permission")
    b.command(perm, "wipe", cmd_perm_wipe, "remove write permission").add_argument("broker")
    b.command(perm, "add", cmd_perm_add, "restore write permission").add_argument("broker")
    topic = b.group(sub, "topic", "topic administration")
    delete = b.command(topic, "delete", cmd_topic_delete, "delete a topic's queue data")
    delete.add_argument("topic")
    delete.add_argument("--cluster", default="", help="only this cluster's brokers")
    register = b.command(topic, "register", cmd_topic_register, "set a topic's queue data")
    register.add_argument("topic")
    register.add_argument("--broker", action="append", required=True, help="broker name (repeatable)")
    _add_queue_options(register)


def add_metadata_commands(b: Any, sub: Any) -> None:
    _add_read_commands(b, sub)
    _add_kv_commands(b, sub)
    _add_settings_commands(b, sub)
    _add_broker_commands(b, sub)
    _add_admin_commands(b, sub)
