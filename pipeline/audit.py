"""`audit`: did every replica build the state the log says it should?

The log compacted at an offset gives the expected state and digest. It is compared with what the
nodes claim at that offset: live nodes' digest at the log's last offset (Log.DigestAt: a consistent
cut, however far a busy or idle node has moved on since the export), state dumps from
`nsctl state dump` (stamped offset and digest, plus every key), or digests given by hand (from a
snapshot, for example). For a dump the audit also recomputes the digest of its rows and names every
key that differs from the log's state: missing on the node, extra on the node, or another value.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import asdict, dataclass, field
from typing import Any

import grpc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from nameserver import headers
from nameserver.logformat.segments import DUMP_META, read_dump_info
from nameserver.pb import api_pb2, api_pb2_grpc
from pipeline.compact import Base, state_at
from pipeline.logdf import PipelineError, load_log
from pipeline.session import join, read_text, write_text
from pipeline.sparkdigest import digest_of

SHOW_KEYS = 50


@dataclass
class Claim:
    source: str          # "node 127.0.0.1:9101", "dump /path", "claim NAME"
    offset: int
    digest: str
    dump: str | None = None
    endpoint: str | None = None  # a live node's address


@dataclass
class Verdict:
    source: str
    offset: int
    reported_digest: str
    log_digest: str | None = None
    match: bool | None = None         # None: not comparable (another offset than --at)
    note: str = ""
    rows_digest: str | None = None    # dumps: the digest of the dump's own rows
    differing_keys: int | None = None
    keys: list[dict[str, Any]] = field(default_factory=list)  # the first SHOW_KEYS differences

    @property
    def ok(self) -> bool:
        return self.match is not False and self.differing_keys in (None, 0) and \
            (self.rows_digest is None or self.rows_digest == self.reported_digest)


@dataclass
class AuditResult:
    log: str
    verdicts: list[Verdict]
    keys_at: dict[int, int]   # offset -> live keys in the log's state

    @property
    def ok(self) -> bool:
        return all(v.ok for v in self.verdicts) and any(v.match for v in self.verdicts)

    def to_dict(self) -> dict[str, Any]:
        return {"log": self.log, "ok": self.ok, "keys_at": self.keys_at,
                "verdicts": [{**asdict(v), "ok": v.ok} for v in self.verdicts]}


@dataclass(frozen=True)
class NodeAccess:
    """How to reach nodes that require TLS and/or a bearer token (as nsctl's --tls-* and --token-file)."""

    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    token: str | None = field(default=None, repr=False)

    def channel(self, endpoint: str) -> grpc.Channel:
        if not (self.tls_ca or self.tls_cert):
            return grpc.insecure_channel(endpoint)

        def read(path: str | None) -> bytes | None:
            if not path:
                return None
            with open(path, "rb") as f:
                return f.read()

        creds = grpc.ssl_channel_credentials(read(self.tls_ca), read(self.tls_key), read(self.tls_cert))
        return grpc.secure_channel(endpoint, creds)

    @property
    def metadata(self) -> list[tuple[str, str]]:
        return [(headers.AUTHORIZATION, f"Bearer {self.token}")] if self.token else []


def node_claims(endpoints: list[str], at: int, access: NodeAccess | None = None, timeout: float = 5.0
                ) -> tuple[list[Claim], list[Verdict]]:
    """Each live node's digest at offset `at` (a consistent cut: the log's last offset, or --at), however
    far the node has moved on. A node that cannot answer for `at` (not applied yet, or older than its
    digest history) is not comparable; only an unreachable node fails the audit."""
    access = access or NodeAccess()
    claims, verdicts = [], []
    for endpoint in endpoints:
        source, reached = f"node {endpoint}", False
        try:
            with access.channel(endpoint) as channel:
                st = api_pb2_grpc.AdminStub(channel).Status(api_pb2.StatusRequest(), timeout=timeout,
                                                            metadata=access.metadata)
                source, reached = f"node {st.node_id or endpoint} ({endpoint})", True
                reply = api_pb2_grpc.LogStub(channel).DigestAt(api_pb2.DigestAtRequest(offset=at),
                                                               timeout=timeout, metadata=access.metadata)
        except grpc.RpcError as err:
            code = err.code()
            if reached and code in (grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.UNAVAILABLE):
                verdicts.append(Verdict(source, at, "", note=f"not comparable: {err.details()}"))
            else:
                verdicts.append(Verdict(source, 0, "", note=f"unreachable: {code.name}", match=False))
            continue
        claims.append(Claim(source, reply.offset, reply.digest, endpoint=endpoint))
    return claims, verdicts


def fetch_dump(endpoint: str, out: str, access: NodeAccess | None = None, timeout: float = 600.0) -> Claim:
    """A live node's whole state as a dump in `out` (Log.DumpState: a consistent copy at its apply offset)."""
    from nameserver.logformat.segments import write_dump_stream

    access = access or NodeAccess()
    with access.channel(endpoint) as channel:
        info = write_dump_stream(out, api_pb2_grpc.LogStub(channel).DumpState(
            api_pb2.DumpStateRequest(), timeout=timeout, metadata=access.metadata), endpoint)
    return Claim(f"dump of node {endpoint}", info.offset, info.digest, dump=out)


def fetch_tail(endpoints: list[str], first: int, last: int, out: str, access: NodeAccess | None = None,
               timeout: float = 600.0) -> None:
    """Export offsets first..last (Log.ReadLog) as segments in the local directory `out`, from the first
    endpoint that has them all."""
    from nameserver.logformat.segments import SegmentWriter

    access = access or NodeAccess()
    errors = []
    for endpoint in endpoints:
        writer = SegmentWriter(out, first)
        try:
            with access.channel(endpoint) as channel:
                for message in api_pb2_grpc.LogStub(channel).ReadLog(
                        api_pb2.ReadLogRequest(from_offset=first, to_offset=last), timeout=timeout,
                        metadata=access.metadata):
                    for e in message.entries:
                        writer.add(e.offset, e.term, e.entry)
            writer.flush(last)
            return
        except grpc.RpcError as err:
            errors.append(f"{endpoint}: {err.code().name}: {err.details()}")
        finally:
            for name in os.listdir(out) if os.path.isdir(out) else []:
                if name.startswith("."):  # a segment the broken stream left half written
                    os.unlink(os.path.join(out, name))
    raise PipelineError(f"offsets {first}..{last} could not be read from any node ({'; '.join(errors)})")


def _name_node_keys(spark: SparkSession, verdict: Verdict, endpoint: str, healthy: list[str], log_uri: str,
                    base: Base, scratch: str, access: NodeAccess | None) -> None:
    """A live node differs at the cut: dump its state, read the log on to the dump's offset from healthy
    nodes, and compare key by key; the differing keys go on the node's verdict."""
    try:
        dump = fetch_dump(endpoint, os.path.join(scratch, "dump"), access)
        uris = [log_uri]
        if dump.offset > base.offset:
            tail = os.path.join(scratch, "tail")
            fetch_tail(healthy or [endpoint], base.offset + 1, dump.offset, tail, access)
            uris.append(tail)
        state, _ = state_at(spark, load_log(spark, uris, upto=dump.offset), dump.offset, base)
    except (grpc.RpcError, PipelineError, StopIteration) as exc:
        verdict.note = f"its keys could not be named: {exc}"
        return
    named = Verdict(dump.source, dump.offset, dump.digest)
    check_dump(spark, named, state, dump.dump or "", None)
    verdict.differing_keys, verdict.keys = named.differing_keys, named.keys
    verdict.note = f"differing keys from its state dump at offset {dump.offset}"


def dump_claim(spark: SparkSession, uri: str) -> Claim:
    info = read_dump_info(read_text(spark, join(uri, DUMP_META)))
    return Claim(f"dump {uri} (node {info.node})", info.offset, info.digest, dump=uri)


def parse_claim(text: str) -> Claim:
    m = re.fullmatch(r"([^=]+)=(\d+):([0-9a-f]{32})", text)
    if not m:
        raise PipelineError(f"--claim {text!r}: expected NAME=OFFSET:DIGEST (32 hex digits)")
    return Claim(f"claim {m.group(1)}", int(m.group(2)), m.group(3))


def key_diff(expected: DataFrame, dump: DataFrame) -> DataFrame:
    """Keys whose value or version differ between the log's state and a dump, with the kind of difference."""
    e = expected.select("key", F.col("value").alias("log_value"), F.col("version").alias("log_version"),
                        F.col("type_name").alias("log_type"))
    d = dump.select("key", F.col("value").alias("node_value"), F.col("version").alias("node_version"),
                    F.col("type_name").alias("node_type"))
    kind = (F.when(F.col("node_value").isNull(), "missing_on_node")
            .when(F.col("log_value").isNull(), "extra_on_node")
            .when(F.col("log_value") != F.col("node_value"), "value_differs")
            .otherwise("version_differs"))
    return (e.join(d, "key", "full_outer")
            .where(F.col("log_value").isNull() | F.col("node_value").isNull()
                   | (F.col("log_value") != F.col("node_value")) | (F.col("log_version") != F.col("node_version")))
            .select("key", kind.alias("kind"), F.coalesce("log_type", "node_type").alias("type_name"),
                    "log_version", "node_version", "log_value", "node_value"))


def run_audit(spark: SparkSession, log_uri: str, at: int | None, endpoints: list[str], dumps: list[str],
              claims: list[str], out: str | None = None, access: NodeAccess | None = None) -> AuditResult:
    if not (endpoints or dumps or claims):
        raise PipelineError("nothing to audit against: give --endpoints, --dump or --claim")
    log = load_log(spark, log_uri)
    found, verdicts = node_claims(endpoints, log.last if at is None else at, access) if endpoints else ([], [])
    found += [dump_claim(spark, d) for d in dumps] + [parse_claim(c) for c in claims]
    states: dict[int, tuple[DataFrame, str, int]] = {}
    diverged: list[tuple[Verdict, str]] = []
    for claim in found:
        if at is not None and claim.offset != at:
            verdicts.append(Verdict(claim.source, claim.offset, claim.digest,
                                    note=f"not comparable: at offset {claim.offset}, not {at}"))
            continue
        if claim.offset not in states:
            if claim.offset > log.last:  # not a divergence: the log cannot say what the state is there
                verdicts.append(Verdict(claim.source, claim.offset, claim.digest, note=f"not comparable: at "
                                        f"offset {claim.offset}, beyond the log (ends at {log.last}): export further"))
                continue
            state, _ = state_at(spark, log, claim.offset)
            state = state.persist()
            states[claim.offset] = (state, *digest_of(state))
        state, digest, _ = states[claim.offset]
        verdict = Verdict(claim.source, claim.offset, claim.digest, digest, claim.digest == digest)
        if claim.dump is not None:
            check_dump(spark, verdict, state, claim.dump, out)
        elif claim.endpoint and not verdict.match:
            diverged.append((verdict, claim.endpoint))
        verdicts.append(verdict)
    healthy = [c.endpoint for c in found if c.endpoint and c.digest == states.get(c.offset, (None, ""))[1]]
    for verdict, endpoint in diverged:
        with tempfile.TemporaryDirectory(prefix="rip18-audit-") as scratch:
            state, _, _ = states[verdict.offset]
            _name_node_keys(spark, verdict, endpoint, healthy, log_uri, Base(verdict.offset, state), scratch,
                            access)
    result = AuditResult(log_uri, verdicts, {o: k for o, (_, _, k) in states.items()})
    if out:
        write_text(spark, join(out, "audit.json"), json.dumps(result.to_dict(), indent=1))
    for state, _, _ in states.values():
        state.unpersist()
    return result


def check_dump(spark: SparkSession, verdict: Verdict, state: DataFrame, uri: str, out: str | None) -> None:
    dump = spark.read.parquet(uri)
    verdict.rows_digest = digest_of(dump)[0]
    diff = key_diff(state, dump).persist()
    verdict.differing_keys = diff.count()
    shown = diff.orderBy("key").limit(SHOW_KEYS).select("key", "kind", "type_name", "log_version",
                                                       "node_version").collect()
    verdict.keys = [r.asDict() for r in shown]
    if out and verdict.differing_keys:
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", uri.rstrip("/").rsplit("/", 1)[-1]) or "dump"
        diff.write.mode("overwrite").parquet(join(out, f"diff-{name}"))
    diff.unpersist()


def render(result: AuditResult) -> str:
    lines = [f"audit of {result.log}: {'OK' if result.ok else 'DIVERGENCE FOUND'}"]
    for v in result.verdicts:
        if v.match is None or v.log_digest is None:
            lines.append(f"  {v.source}: {v.note}")
            continue
        verdict = "matches" if v.match else "DIFFERS from"
        lines.append(f"  {v.source} at offset {v.offset}: digest {v.reported_digest} {verdict} the log's "
                     f"{v.log_digest} ({result.keys_at.get(v.offset, 0)} keys)")
        if v.rows_digest is not None and v.rows_digest != v.reported_digest:
            lines.append(f"    the dump's rows hash to {v.rows_digest}, not to the digest stamped on it")
        if v.note and v.match is False:
            lines.append(f"    {v.note}")
        if v.differing_keys:
            lines.append(f"    {v.differing_keys} key(s) differ from the log's state:")
            for k in v.keys:
                lines.append(f"      {k['key']}  {k['kind']}  (log version {k['log_version']}, "
                             f"node version {k['node_version']})")
    return "\n".join(lines)
