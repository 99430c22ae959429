"""Reading exported log segments into Spark, and which batches applied.

A batch applies unless one of its preconditions fails: `key` must be at `version` (the offset of the
entry that last wrote it, 0 when absent) when the batch applies, exactly as KVState.apply_batch checks
it. Whether a check holds depends on which earlier batches applied, and a key's checks form chains
(every registration checks the live/ record the previous one wrote), so the answer is sequential by
nature. Spark extracts the conditional core, the checks plus the writes to checked keys (a fraction of
the log), sorts it, and the driver walks it once keeping one version per checked key; the failed batches
(rare: leader-side races) are then removed from the log in Spark. See docs/pipeline.md for its cost.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from nameserver.logformat.segments import PUT, merge, overlaps, parse_segment_name, ranges_of, uncovered
from pipeline.session import join, list_names

BatchId = tuple[int, int]  # (offset, batch_index)
CHUNK_EVENTS = 2_000_000  # conditional-core events brought to the driver at a time


class PipelineError(Exception):
    """A job cannot run on this input (exit 2, with the message)."""


@dataclass
class Log:
    uri: str
    df: DataFrame
    ranges: list[tuple[int, int]]  # merged coverage of the segments read

    @property
    def first(self) -> int:
        return self.ranges[0][0]

    @property
    def last(self) -> int:
        return self.ranges[-1][1]

    def require_covered(self, start: int, end: int) -> None:
        gaps = uncovered(self.ranges, start, end)
        if gaps:
            text = ", ".join(f"{a}..{b}" for a, b in gaps)
            raise PipelineError(f"the log in {self.uri} does not cover offsets {text}; export them first "
                                f"(nsctl log export --from A --to B --out {self.uri})")


def load_log(spark: SparkSession, uri: str, upto: int | None = None) -> Log:
    """The segments under `uri` (only those starting at or before `upto`), as one DataFrame."""
    names = list_names(spark, uri)
    ranges = ranges_of(names)
    if not ranges:
        raise PipelineError(f"{uri} holds no log segments (log-<first>-<last>.parquet)")
    for i, (a, b) in enumerate(ranges):
        if overlaps(ranges[:i], a, b):
            raise PipelineError(f"segments in {uri} overlap at {a}..{b}: remove the duplicate")
    chosen = [(a, b) for a, b in ranges if upto is None or a <= upto]
    if not chosen:
        raise PipelineError(f"{uri} has no segment at or before offset {upto}")
    by_range = {r: n for n in names if (r := parse_segment_name(n)) is not None}
    paths = [join(uri, by_range[r]) for r in chosen]
    df = spark.read.parquet(*paths)
    if upto is not None:
        df = df.where(F.col("offset") <= upto)
    return Log(uri, df, merge(chosen))


@dataclass
class Applied:
    df: DataFrame                   # the records of batches that applied
    failed: set[BatchId] = field(default_factory=set)


def _precondition_events(df: DataFrame) -> DataFrame | None:
    pre = (df.where(F.col("preconditions").isNotNull())
           .select("offset", "batch_index", F.explode("preconditions").alias("p"))
           .select("offset", "batch_index", F.col("p.key").alias("key"), F.col("p.version").alias("expect")))
    if pre.isEmpty():
        return None
    writes = (df.join(pre.select("key").distinct(), "key", "left_semi")
              .select("key", "offset", "batch_index", "record_index",
                      F.when(F.col("op") == PUT, F.col("offset")).otherwise(F.lit(0)).alias("wver")))
    # kind 0 (a check) sorts before kind 1 (a write) of the same batch: a batch checks, then writes.
    checks = pre.select("key", "offset", "batch_index", F.lit(-1).alias("record_index"),
                        F.lit(None).cast("long").alias("wver"), F.lit(0).alias("kind"), "expect")
    writes = writes.select("key", "offset", "batch_index", "record_index", "wver", F.lit(1).alias("kind"),
                           F.lit(None).cast("long").alias("expect"))
    return checks.unionByName(writes)


def _batch_df(spark: SparkSession, ids: set[BatchId]) -> DataFrame:
    return F.broadcast(spark.createDataFrame(sorted(ids), "offset long, batch_index int"))


def _offset_ranges(events: DataFrame) -> list[tuple[int | None, int | None]]:
    """Consecutive offset ranges (lo exclusive, hi inclusive) of about CHUNK_EVENTS events each."""
    parts = math.ceil(events.count() / CHUNK_EVENTS)
    if parts <= 1:
        return [(None, None)]
    cuts = sorted({int(c) for c in events.approxQuantile("offset", [i / parts for i in range(1, parts)], 0.001)})
    bounds: list[int | None] = [None, *cuts, None]
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def failed_batches(events: DataFrame) -> set[BatchId]:
    """Replay the checks in log order against the versions the applied writes leave (KVState's rule).

    The conditional core comes to the driver as Arrow, sorted, one offset range at a time (bounded driver
    memory: about CHUNK_EVENTS events), and is walked once. Everything else stays in Spark.
    """
    versions: dict[str, int] = {}
    failed: set[BatchId] = set()
    for lo, hi in _offset_ranges(events):
        part = events
        if lo is not None:
            part = part.where(F.col("offset") > lo)
        if hi is not None:
            part = part.where(F.col("offset") <= hi)
        ordered = (part.orderBy("offset", "batch_index", "kind", "record_index")
                   .select("offset", "batch_index", "kind", "key", "wver", "expect"))
        for batch in ordered.toArrow().to_batches(max_chunksize=100_000):
            offsets, batches, kinds, keys, wvers, expects = (c.to_pylist() for c in batch.columns)
            for offset, b, kind, key, wver, expect in zip(offsets, batches, kinds, keys, wvers, expects,
                                                          strict=True):
                if kind == 0:
                    if versions.get(key, 0) != expect:
                        failed.add((offset, b))
                elif (offset, b) not in failed:
                    versions[key] = wver
    return failed


def applied_records(spark: SparkSession, df: DataFrame) -> Applied:
    events = _precondition_events(df)
    if events is None:
        return Applied(df)
    events = events.persist()
    try:
        failed = failed_batches(events)
    finally:
        events.unpersist()
    applied = df if not failed else df.join(_batch_df(spark, failed), ["offset", "batch_index"], "left_anti")
    return Applied(applied, failed)
