"""`nsctl log export` and `nsctl state dump`: the metadata log and a node's state as Parquet.

    nsctl log export --from N [--to M] --out DIR    # M omitted: up to the commit offset at call time
    nsctl state dump --out DIR                      # the first endpoint that answers; pin one with --endpoints

Export writes segments `log-<first>-<last>.parquet` (nameserver/logformat/segments.py). It fills only the parts of
[N, M] that no segment in DIR covers, so a second run resumes where the first stopped and never writes
a segment twice. A stream that breaks keeps every entry received (they are complete) and the export goes
on from the next offset with the next endpoint; OUT_OF_RANGE (the node no longer keeps those offsets)
also moves on to the next endpoint.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from typing import Any

import grpc

from nameserver import headers
from nameserver.cli.nsctl_calls import (
    CommandError,
    Context,
    UsageError,
    emit_json,
    open_channel,
    status_code,
    status_details,
)
from nameserver.pb import api_pb2, api_pb2_grpc

STREAM_TIMEOUT_S = 3600.0
_MOVE_ON = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                      grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.CANCELLED})
_CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 256 << 20)]


@dataclass
class ExportResult:
    ranges: list[list[int]] = field(default_factory=list)   # [first, last] exported by this run
    present: list[list[int]] = field(default_factory=list)  # [first, last] already in the directory
    entries: int = 0
    records: int = 0
    segments: list[str] = field(default_factory=list)
    endpoints: list[str] = field(default_factory=list)


def _read_range(ctx: Context, out: str, first: int, last: int | None, batch: int, rows: int,
                result: ExportResult) -> None:
    """Export [first, last] (last None: the commit offset the first answering node reports)."""
    from nameserver.logformat.segments import SegmentWriter

    writer = SegmentWriter(out, first, rows)
    cursor = first  # the next offset wanted
    errors: list[str] = []
    attempts = 2 * len(ctx.endpoints)
    for attempt in range(attempts):
        if last is not None and cursor > last:
            break
        endpoint = ctx.endpoints[attempt % len(ctx.endpoints)]
        try:
            with open_channel(ctx, endpoint, _CHANNEL_OPTIONS) as channel:  # TLS and token as nsctl's
                call = api_pb2_grpc.LogStub(channel).ReadLog(
                    api_pb2.ReadLogRequest(from_offset=cursor, to_offset=last or 0, max_batch=batch),
                    timeout=STREAM_TIMEOUT_S)
                if last is None:
                    last = int(dict(call.initial_metadata())[headers.LOG_TO_OFFSET])
                for message in call:
                    for e in message.entries:
                        writer.add(e.offset, e.term, e.entry)
                        cursor = e.offset + 1
            writer.flush(last)  # the stream ended normally: every entry <= last was sent
            cursor = last + 1
            if endpoint not in result.endpoints:
                result.endpoints.append(endpoint)
        except grpc.RpcError as err:
            if status_code(err) not in _MOVE_ON:
                raise CommandError(status_code(err).name, status_details(err)) from None
            writer.flush(cursor - 1)  # keep what arrived: complete entries, in order
            errors.append(f"{endpoint}: {status_code(err).name}: {status_details(err)}")
    result.entries += writer.entries
    result.records += writer.records
    result.segments += writer.written
    if last is None or cursor <= last:
        upto = "the commit offset" if last is None else str(last)
        raise CommandError("UNAVAILABLE", f"offsets {cursor}..{upto} could not be exported "
                                          f"({'; '.join(errors)})")
    if last >= first:  # else the log ends before `first`: nothing to export yet
        result.ranges.append([first, last])


def cmd_log_export(ctx: Context, args: argparse.Namespace) -> int:
    from nameserver.logformat.segments import covered_ranges, merge, uncovered

    if args.from_offset < 1:
        raise UsageError("--from must be >= 1")
    if args.to is not None and args.to < args.from_offset:
        raise UsageError("--to must be >= --from")
    if args.batch < 1 or args.segment_rows < 1:
        raise UsageError("--batch and --segment-rows must be >= 1")
    covered = covered_ranges(args.out)
    result = ExportResult()
    end = args.to if args.to is not None else None
    result.present = [[a, b] for a, b in merge(covered)
                      if b >= args.from_offset and (end is None or a <= end)]
    for first, last in uncovered(covered, args.from_offset, end):
        _read_range(ctx, args.out, first, last, args.batch, args.segment_rows, result)
    if ctx.json:
        emit_json(result.__dict__)
        return 0
    done = ", ".join(f"{a}..{b}" for a, b in result.ranges) or "nothing new"
    print(f"exported {done}: {result.entries} entries, {result.records} records, "
          f"{len(result.segments)} segment(s) in {args.out}")
    if result.present:
        print("already present: " + ", ".join(f"{a}..{b}" for a, b in result.present))
    return 0


def cmd_state_dump(ctx: Context, args: argparse.Namespace) -> int:
    from nameserver.logformat.segments import DUMP_FILE

    path = os.path.join(args.out, DUMP_FILE)
    if os.path.exists(path):
        raise UsageError(f"{args.out} already holds a state dump")
    failures: list[str] = []
    for endpoint in ctx.endpoints:
        try:
            info = _dump_from(ctx, endpoint, args.out)
        except grpc.RpcError as err:
            if os.path.exists(path):
                os.unlink(path)  # a broken stream leaves no half dump behind
            if status_code(err) not in _MOVE_ON:
                raise CommandError(status_code(err).name, status_details(err)) from None
            failures.append(f"{endpoint}: {status_code(err).name}: {status_details(err)}")
            continue
        if ctx.json:
            emit_json({**info.__dict__, "out": args.out})
        else:
            print(f"dumped {info.keys} keys of {info.node} at offset {info.offset} "
                  f"(digest {info.digest}) to {args.out}")
        return 0
    raise CommandError("UNAVAILABLE", f"no endpoint answered ({'; '.join(failures)})")


def _dump_from(ctx: Context, endpoint: str, out: str) -> Any:
    from nameserver.logformat.segments import write_dump_stream

    with open_channel(ctx, endpoint, _CHANNEL_OPTIONS) as channel:
        stream = api_pb2_grpc.LogStub(channel).DumpState(api_pb2.DumpStateRequest(), timeout=STREAM_TIMEOUT_S)
        return write_dump_stream(out, stream, endpoint)


def add_log_commands(builder: Any, sub: Any) -> None:
    """Register `log export` and `state dump` on nsctl's parser (builder: nsctl's _Builder)."""
    log_group = builder.group(sub, "log", "the metadata log")
    export = builder.command(log_group, "export", cmd_log_export,
                             "write log entries as Parquet segments (resumes; never rewrites a segment)")
    export.add_argument("--from", dest="from_offset", type=int, default=1, help="first offset (default 1)")
    export.add_argument("--to", type=int, default=None, help="last offset (default: the commit offset)")
    export.add_argument("--out", required=True, help="segment directory")
    export.add_argument("--batch", type=int, default=500, help="entries per streamed message")
    export.add_argument("--segment-rows", type=int, default=500_000, help="records per segment file")
    state = builder.group(sub, "state", "a node's state")
    dump = builder.command(state, "dump", cmd_state_dump,
                           "write one node's state (a consistent copy) as Parquet with its offset and digest")
    dump.add_argument("--out", required=True, help="dump directory (state.parquet and _dump.json)")
