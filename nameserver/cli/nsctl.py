"""nsctl: the operator CLI of the Raft-replicated nameserver.

    nsctl [--endpoints host:port,...] [--json] [--timeout SECONDS] [--tls-ca CA [--tls-cert C --tls-key K]]
          [--token-file FILE (or env NSCTL_TOKEN)] COMMAND ...

Any node accepts any call (writes are forwarded to the leader), so a single call tries the endpoints in
order until one answers; `status` asks every endpoint.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import grpc

from nameserver.chunking import register_chunks, should_stream
from nameserver.cli import render
from nameserver.client import Credentials, EndpointPool
from nameserver.client import parse_endpoints as client_endpoints
from nameserver.client.credentials import PLAINTEXT
from nameserver.pb import api_pb2, api_pb2_grpc, state_pb2

DEFAULT_ENDPOINTS = "127.0.0.1:9101,127.0.0.1:9102,127.0.0.1:9103"
ENDPOINTS_ENV = "NSCTL_ENDPOINTS"
TOKEN_ENV = "NSCTL_TOKEN"
DEFAULT_TIMEOUT_S = 5.0
# Registrations with more topics than one chunk, or over 3 MiB, go over the stream (nameserver.chunking).
DIGEST_SHORT = 12

# Codes that mean "this node could not answer": try the next endpoint. Anything else is the answer.
_RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})

_TOPIC_KINDS = {
    "all": api_pb2.TOPIC_LIST_ALL,
    "cluster": api_pb2.TOPIC_LIST_BY_CLUSTER,
    "system": api_pb2.TOPIC_LIST_SYSTEM,
    "unit": api_pb2.TOPIC_LIST_UNIT,
    "unit-sub": api_pb2.TOPIC_LIST_HAS_UNIT_SUB,
    "unit-sub-not-unit": api_pb2.TOPIC_LIST_HAS_UNIT_SUB_NOT_UNIT,
}

StubClass = Callable[[grpc.Channel], Any]
Handler = Callable[["Context", argparse.Namespace], int]


# ---- errors ----


class UsageError(Exception):
    """Bad command line: exit 2."""


class CommandError(Exception):
    """A failed call, printed as `error: CODE: details` (exit 1)."""

    def __init__(self, code: str, details: str) -> None:
        super().__init__(f"{code}: {details}")
        self.code = code
        self.details = details


def _status_code(err: grpc.RpcError) -> grpc.StatusCode:
    code = getattr(err, "code", None)
    return code() if callable(code) else grpc.StatusCode.UNKNOWN


def _status_details(err: grpc.RpcError) -> str:
    details = getattr(err, "details", None)
    return (details() if callable(details) else None) or str(err)


def _describe(err: grpc.RpcError) -> str:
    return f"{_status_code(err).name}: {_status_details(err)}"


def _command_error(err: grpc.RpcError) -> CommandError:
    return CommandError(_status_code(err).name, _status_details(err))


# ---- calling the cluster ----


@dataclass(frozen=True)
class Context:
    endpoints: list[str]
    timeout: float
    json: bool
    credentials: Credentials = PLAINTEXT  # --tls-ca/--tls-cert/--tls-key and --token-file (or env NSCTL_TOKEN)

    @functools.cached_property
    def pool(self) -> EndpointPool:
        """One channel per endpoint for the whole command, from the client library (TLS and token included)."""
        return EndpointPool(self.endpoints, credentials=self.credentials)


def open_channel(ctx: Context | None, endpoint: str, options: Any = ()) -> grpc.Channel:
    """A channel of its own to `endpoint` (for long streams), with the context's TLS files and token."""
    return (ctx.credentials if ctx is not None else PLAINTEXT).connect(endpoint, options)


def _call_one(endpoint: str, stub_class: StubClass, method: str, request: Any, timeout: float,
              ctx: Context) -> Any:
    stub = stub_class(ctx.pool.channel(endpoint))
    # A list is a client stream: a fresh iterator per attempt so a failover resends it whole.
    payload = iter(request) if isinstance(request, list) else request
    return getattr(stub, method)(payload, timeout=timeout)


def call_any(ctx: Context, stub_class: StubClass, method: str, request: Any) -> tuple[str, Any]:
    """Send one call to the first endpoint that answers; return (endpoint, reply).

    Passes over the endpoints repeat, with a short backoff, until --timeout: right after a leader
    dies the survivors still forward to it for a moment, and an election takes about a second.
    (nsctl's writes are idempotent, so resending one whose outcome was unknown is safe.)
    """
    deadline = time.monotonic() + ctx.timeout
    pause = 0.2
    while True:
        failures: list[tuple[str, grpc.RpcError]] = []
        for i, endpoint in enumerate(ctx.endpoints):
            # the time left is shared by the endpoints this pass has yet to try: one paused node
            # must not take it all from the others
            share = (deadline - time.monotonic()) / (len(ctx.endpoints) - i)
            try:
                return endpoint, _call_one(endpoint, stub_class, method, request, max(0.05, share), ctx)
            except grpc.RpcError as err:
                if _status_code(err) not in _RETRYABLE:
                    raise _command_error(err) from None
                failures.append((endpoint, err))
        if deadline - time.monotonic() <= pause:
            break
        time.sleep(pause)
    last_code = _status_code(failures[-1][1]).name
    tried = "; ".join(f"{endpoint}: {_describe(err)}" for endpoint, err in failures)
    raise CommandError(last_code, f"no endpoint answered ({tried})")


def _call_or_error(endpoint: str, stub_class: StubClass, method: str, request: Any, timeout: float,
                   ctx: Context) -> Any:
    try:
        return _call_one(endpoint, stub_class, method, request, timeout, ctx)
    except grpc.RpcError as err:
        return err


def call_each(ctx: Context, stub_class: StubClass, method: str, request: Any) -> list[tuple[str, Any]]:
    """Send one call to every endpoint in parallel; each result is a reply or the grpc.RpcError."""
    with ThreadPoolExecutor(max_workers=len(ctx.endpoints)) as pool:
        futures = [
            pool.submit(_call_or_error, endpoint, stub_class, method, request, ctx.timeout, ctx)
            for endpoint in ctx.endpoints
        ]
        return [(endpoint, future.result()) for endpoint, future in zip(ctx.endpoints, futures, strict=True)]


def ns_call(ctx: Context, method: str, request: Any) -> Any:
    return call_any(ctx, api_pb2_grpc.NameServerStub, method, request)[1]


# ---- output ----


def emit_json(data: Any) -> None:
    print(render.dump_json(data))


def emit_write(ctx: Context, reply: Any, extra: str = "") -> int:  # a write's reply (has .offset)
    """Every write reports the offset of its entry (or the apply offset when nothing changed)."""
    if ctx.json:
        emit_json(render.to_dict(reply))
        return 0
    records = getattr(reply, "records", None)
    if records is None:
        line = f"offset {reply.offset}"
    elif records == 0:
        line = f"offset {reply.offset} (no change)"
    else:
        line = f"offset {reply.offset} ({render.plural(records, 'record')})"
    print(line + extra)
    return 0


def served_at(apply_offset: int) -> str:
    return f"served at apply offset {apply_offset}"


def role_name(role: int) -> str:
    return api_pb2.Role.Name(role).removeprefix("ROLE_").lower()


# ---- status, members, snapshot ----


def _status_json(endpoint: str, result: Any) -> dict[str, Any]:
    if isinstance(result, grpc.RpcError):
        return {"endpoint": endpoint, "error": _describe(result)}
    data = render.to_dict(result)
    data["role"] = role_name(result.role)
    data["endpoint"] = endpoint
    return data


def _status_row(endpoint: str, result: Any) -> list[Any]:
    if isinstance(result, grpc.RpcError):
        code = _status_code(result)
        label = "unreachable" if code in _RETRYABLE else "error"
        return ["-", endpoint, f"{label} ({code.name})"] + [None] * 8
    return [
        result.node_id,
        result.grpc_addr or endpoint,
        role_name(result.role),
        result.leader_grpc_addr or result.leader_id,
        result.term,
        result.end_offset,
        result.commit_offset,
        result.apply_offset,
        result.digest[:DIGEST_SHORT],
        result.ready,
        result.keys,
    ]


_STATUS_HEADERS = ["NODE", "GRPC ADDR", "ROLE", "LEADER", "TERM", "END", "COMMIT", "APPLY", "DIGEST"]
_STATUS_HEADERS += ["READY", "KEYS"]


def _warn_digest_mismatch(results: list[tuple[str, Any]]) -> None:
    # Invariant: replicas at the same apply offset have the same digest; say loudly when they do not.
    by_offset: dict[int, set[str]] = {}
    for _, result in results:
        if not isinstance(result, grpc.RpcError):
            by_offset.setdefault(result.apply_offset, set()).add(result.digest)
    for offset, digests in sorted(by_offset.items()):
        if len(digests) > 1:
            print(f"warning: digests differ at apply offset {offset}: {sorted(digests)}", file=sys.stderr)


def cmd_status(ctx: Context, args: argparse.Namespace) -> int:
    results = call_each(ctx, api_pb2_grpc.AdminStub, "Status", api_pb2.StatusRequest())
    failed = [(endpoint, r) for endpoint, r in results if isinstance(r, grpc.RpcError)]
    if ctx.json:
        emit_json({"nodes": [_status_json(endpoint, result) for endpoint, result in results]})
    else:
        print(render.table(_STATUS_HEADERS, [_status_row(endpoint, result) for endpoint, result in results]))
        for endpoint, err in failed:
            print(f"error: {_status_code(err).name}: {endpoint}: {_status_details(err)}", file=sys.stderr)
    _warn_digest_mismatch(results)
    return 1 if failed else 0


def cmd_members(ctx: Context, args: argparse.Namespace) -> int:
    endpoint, reply = call_any(ctx, api_pb2_grpc.AdminStub, "Members", api_pb2.MembersRequest())
    if ctx.json:
        emit_json(render.to_dict(reply))
        return 0
    rows = [
        [m.node_id, m.grpc_addr, m.is_self, m.is_leader, m.connected, m.match_offset] for m in reply.members
    ]
    print(render.table(("NODE", "GRPC ADDR", "SELF", "LEADER", "CONNECTED", "MATCH"), rows))
    print(f"answered by {endpoint}")
    return 0


def _print_members(ctx: Context, reply: Any, what: str) -> int:
    if ctx.json:
        emit_json(render.to_dict(reply))
        return 0
    rows = [[m.node_id, m.grpc_addr, m.is_leader, m.connected] for m in reply.members]
    print(render.table(("NODE", "GRPC ADDR", "LEADER", "CONNECTED"), rows))
    print(what)
    return 0


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
    if ctx.json:
        emit_json(render.to_dict(reply))
    else:
        print(f"leader is now {reply.leader_id or 'being elected'}")
    return 0


def cmd_snapshot(ctx: Context, args: argparse.Namespace) -> int:
    if args.all:
        return _snapshot_all(ctx)
    endpoint, reply = call_any(ctx, api_pb2_grpc.AdminStub, "TakeSnapshot", api_pb2.TakeSnapshotRequest())
    if ctx.json:
        emit_json(render.to_dict(reply))
    else:
        print(f"snapshot at offset {reply.offset} on {endpoint}")
    return 0


def _snapshot_all(ctx: Context) -> int:
    results = call_each(ctx, api_pb2_grpc.AdminStub, "TakeSnapshot", api_pb2.TakeSnapshotRequest())
    failed = [r for _, r in results if isinstance(r, grpc.RpcError)]
    if ctx.json:
        emit_json({"nodes": [_snapshot_json(endpoint, result) for endpoint, result in results]})
    else:
        rows = [
            [endpoint, _describe(r) if isinstance(r, grpc.RpcError) else r.offset] for endpoint, r in results
        ]
        print(render.table(("ENDPOINT", "SNAPSHOT OFFSET"), rows))
    return 1 if failed else 0


def _snapshot_json(endpoint: str, result: Any) -> dict[str, Any]:
    if isinstance(result, grpc.RpcError):
        return {"endpoint": endpoint, "error": _describe(result)}
    return {"endpoint": endpoint, **render.to_dict(result)}


# ---- reads ----


def cmd_route(ctx: Context, args: argparse.Namespace) -> int:
    request = api_pb2.GetRouteRequest(topic=args.topic, min_offset=args.min_offset, zone_name=args.zone)
    try:
        reply = ns_call(ctx, "GetRoute", request)
    except CommandError as err:
        if err.code == grpc.StatusCode.NOT_FOUND.name:
            raise CommandError(err.code, f"topic {args.topic} not found") from None
        raise
    if ctx.json:
        emit_json(render.to_dict(reply))
        return 0
    print(_route_text(reply.route))
    print(served_at(reply.apply_offset))
    return 0


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
        parts += ["", f"order topic conf: {route.order_topic_conf}"]
    return "\n".join(parts)


def cmd_clusters(ctx: Context, args: argparse.Namespace) -> int:
    reply = ns_call(ctx, "GetClusterInfo", api_pb2.GetClusterInfoRequest(min_offset=args.min_offset))
    if ctx.json:
        emit_json(render.to_dict(reply))
        return 0
    print(render.table(("CLUSTER", "BROKER NAME", "BROKER ID", "ADDRESS"), _cluster_rows(reply)))
    print(served_at(reply.apply_offset))
    return 0


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
    if ctx.json:
        emit_json(render.to_dict(reply))
        return 0
    for topic in reply.topics:
        print(topic)
    print(f"{render.plural(len(reply.topics), 'topic')}, {served_at(reply.apply_offset)}")
    return 0


# ---- kv ----


def cmd_kv_get(ctx: Context, args: argparse.Namespace) -> int:
    request = api_pb2.GetKvRequest(namespace=args.namespace, key=args.key, min_offset=args.min_offset)
    reply = ns_call(ctx, "GetKv", request)
    if ctx.json:
        emit_json(render.to_dict(reply))
        return 0
    print(reply.value)
    print(served_at(reply.apply_offset))
    return 0


def cmd_kv_put(ctx: Context, args: argparse.Namespace) -> int:
    request = api_pb2.PutKvRequest(namespace=args.namespace, key=args.key, value=args.value)
    return emit_write(ctx, ns_call(ctx, "PutKv", request))


def cmd_kv_delete(ctx: Context, args: argparse.Namespace) -> int:
    request = api_pb2.DeleteKvRequest(namespace=args.namespace, key=args.key)
    return emit_write(ctx, ns_call(ctx, "DeleteKv", request))


def cmd_kv_list(ctx: Context, args: argparse.Namespace) -> int:
    request = api_pb2.ListKvRequest(namespace=args.namespace, min_offset=args.min_offset)
    reply = ns_call(ctx, "ListKv", request)
    if ctx.json:
        emit_json(render.to_dict(reply))
        return 0
    print(render.table(("KEY", "VALUE"), sorted(reply.table.items())))
    print(served_at(reply.apply_offset))
    return 0


def cmd_settings_get(ctx: Context, args: argparse.Namespace) -> int:
    reply = ns_call(ctx, "GetSettings", api_pb2.GetSettingsRequest(min_offset=args.min_offset))
    if ctx.json:
        emit_json(render.to_dict(reply))
        return 0
    stored = set(reply.stored)
    rows = [(name, "true" if on else "false", "log" if name in stored else "default")
            for name, on in sorted(reply.settings.items())]
    print(render.table(("SETTING", "VALUE", "FROM"), rows))
    print(served_at(reply.apply_offset))
    return 0


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
    extra = f", master {reply.master_addr}" if reply.master_addr else ""
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
        print(f"not registered: {', '.join(reply.unknown_addrs)} (the broker should register again)")
    else:
        print("ok (heartbeats are not logged: no offset)")
    # An unknown broker is a failure for scripts: its heartbeat kept nothing alive.
    return 1 if reply.unknown_addrs else 0


def cmd_broker_simulate(ctx: Context, args: argparse.Namespace) -> int:
    from nameserver.cli import simulate

    return simulate.run(ctx.endpoints, args, ctx.timeout)


# ---- topics and permissions ----


def _emit_perm(ctx: Context, reply: api_pb2.BrokerPermReply) -> int:
    if ctx.json:
        emit_json(render.to_dict(reply))
    else:
        print(f"{render.plural(reply.topic_count, 'topic')}, offset {reply.offset}")
    return 0


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


def _global_options(parser: argparse.ArgumentParser, suppress: bool) -> None:
    """The global flags; repeated on every command (suppressed defaults) so they work after it too."""

    def default(value: Any) -> Any:
        return argparse.SUPPRESS if suppress else value

    parser.add_argument(
        "--endpoints",
        default=default(None),
        help=f"comma-separated host:port list (env {ENDPOINTS_ENV}, default {DEFAULT_ENDPOINTS})",
    )
    parser.add_argument("--json", action="store_true", default=default(False), help="print JSON")
    parser.add_argument("--tls-ca", default=default(None), help="CA certificate (PEM): use TLS")
    parser.add_argument("--tls-cert", default=default(None), help="client certificate (PEM) for mutual TLS")
    parser.add_argument("--tls-key", default=default(None), help="the client certificate's private key (PEM)")
    parser.add_argument("--token-file", default=default(None),
                        help=f"file holding a bearer token (env {TOKEN_ENV} holds one too)")
    parser.add_argument(
        "--timeout", type=float, default=default(DEFAULT_TIMEOUT_S),
        help="deadline in seconds for each command's call, shared by the endpoints it tries"
    )


class _Builder:
    """Adds leaf commands that share the global flags and carry their handler."""

    def __init__(self) -> None:
        self.common = argparse.ArgumentParser(add_help=False)
        _global_options(self.common, suppress=True)

    def command(
        self, subparsers: Any, name: str, handler: Handler, help_text: str
    ) -> argparse.ArgumentParser:
        parser = subparsers.add_parser(name, parents=[self.common], help=help_text, description=help_text)
        parser.set_defaults(handler=handler)
        return parser

    def group(self, subparsers: Any, name: str, help_text: str) -> Any:
        parser = subparsers.add_parser(name, help=help_text, description=help_text)
        return parser.add_subparsers(dest=f"{name}_command", required=True, metavar="COMMAND")


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


def _add_cluster_commands(b: _Builder, sub: Any) -> None:
    b.command(sub, "status", cmd_status, "status of every node (exit 1 unless all answer)")
    b.command(sub, "members", cmd_members, "Raft members as one node sees them")
    snap = b.command(sub, "snapshot", cmd_snapshot, "take a snapshot now")
    snap.add_argument("--all", action="store_true", help="on every endpoint, not just the first that answers")


def _add_read_commands(b: _Builder, sub: Any) -> None:
    route = b.command(sub, "route", cmd_route, "a topic's route")
    route.add_argument("topic")
    _add_min_offset(route)
    route.add_argument("--zone", default="", help="only this zone's brokers")
    _add_min_offset(b.command(sub, "clusters", cmd_clusters, "clusters and their brokers"))
    topics = b.command(sub, "topics", cmd_topics, "topic list")
    topics.add_argument("--cluster", default="", help="only this cluster's topics (implies --kind cluster)")
    topics.add_argument("--kind", choices=sorted(_TOPIC_KINDS), default=None)
    _add_min_offset(topics)


def _add_kv_commands(b: _Builder, sub: Any) -> None:
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


def _add_settings_commands(b: _Builder, sub: Any) -> None:
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


def _add_broker_commands(b: _Builder, sub: Any) -> None:
    broker = b.group(sub, "broker", "register, unregister or heartbeat a broker")
    _add_register_options(b.command(broker, "register", cmd_broker_register, "register a broker"))
    unregister = b.command(broker, "unregister", cmd_broker_unregister, "unregister a broker")
    _add_broker_identity(unregister, with_id=True)
    heartbeat = b.command(broker, "heartbeat", cmd_broker_heartbeat, "send one heartbeat")
    _add_broker_identity(heartbeat, with_id=False)
    from nameserver.cli import simulate  # the client library's broker fleet (docs/client.md)

    simulate.add_arguments(b.command(broker, "simulate", cmd_broker_simulate, "run N simulated brokers"))


def _add_admin_commands(b: _Builder, sub: Any) -> None:
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
    member = b.group(sub, "member", "cluster membership (one change at a time)")
    add = b.command(member, "add", cmd_member_add, "add a started node to the cluster")
    add.add_argument("node_id", help="the new node's Raft address (host:port)")
    add.add_argument("--grpc-addr", required=True, help="the new node's gRPC address (host:port)")
    b.command(member, "remove", cmd_member_remove, "remove a member (not the leader)").add_argument(
        "node_id", help="the member's Raft address")
    leader = b.group(sub, "leader", "leadership")
    b.command(leader, "transfer", cmd_leader_transfer, "hand leadership to another member").add_argument(
        "node_id", nargs="?", help="target member's Raft address (default: the most caught-up one)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nsctl", description="Administer a RIP-18 nameserver cluster.")
    _global_options(parser, suppress=False)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    builder = _Builder()
    _add_cluster_commands(builder, sub)
    _add_read_commands(builder, sub)
    _add_kv_commands(builder, sub)
    _add_settings_commands(builder, sub)
    _add_broker_commands(builder, sub)
    _add_admin_commands(builder, sub)
    from nameserver.cli.nsctl_log import add_log_commands  # log export, state dump (nsctl_log imports this module)

    add_log_commands(builder, sub)
    from nameserver.cli.nsctl_controller import add_controller_commands  # the same import order reason

    add_controller_commands(builder, sub)
    return parser


def parse_endpoints(flag: str | None) -> list[str]:
    raw = flag if flag is not None else os.environ.get(ENDPOINTS_ENV) or DEFAULT_ENDPOINTS
    try:
        return client_endpoints(raw)  # the client library's rules: host:port, duplicates dropped
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def make_context(args: argparse.Namespace) -> Context:
    if args.timeout <= 0:
        raise UsageError("--timeout must be > 0")
    return Context(endpoints=parse_endpoints(args.endpoints), timeout=args.timeout, json=args.json,
                   credentials=make_credentials(args))


def make_credentials(args: argparse.Namespace) -> Credentials:
    if bool(args.tls_cert) != bool(args.tls_key):
        raise UsageError("--tls-cert and --tls-key go together")
    token = os.environ.get(TOKEN_ENV) or None
    if args.token_file:
        try:
            with open(args.token_file) as f:
                token = f.read().strip() or None
        except OSError as exc:
            raise UsageError(f"--token-file: {exc}") from None
    return Credentials(args.tls_ca, args.tls_cert, args.tls_key, token)


def _exit_code(exit_: SystemExit) -> int:
    code = exit_.code
    if code is None:
        return 0
    return code if isinstance(code, int) else 2


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # argparse exits itself on --help and usage errors
        return _exit_code(exit_)
    ctx: Context | None = None
    try:
        ctx = make_context(args)
        return args.handler(ctx, args)
    except UsageError as err:
        print(f"nsctl: error: {err}", file=sys.stderr)
        return 2
    except CommandError as err:
        print(f"error: {err.code}: {err.details}", file=sys.stderr)
        return 1
    finally:
        if ctx is not None and "pool" in ctx.__dict__:  # channels were opened
            ctx.pool.close()


if __name__ == "__main__":
    sys.exit(main())
