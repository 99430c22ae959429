"""Reading exported log segments into Spark, and which batches applied.

A batch applies unless one of its preconditions fails: `key` must be at `version` (the offset of the
entry that last wrote it, 0 when absent) when the batch applies, exactly as KVState.apply_batch checks
it. Whether a check holds depends on which earlier batches applied, and a key's checks form chains
(every registration checks the live/ record the previous one wrote), so the answer is sequential by
nature, but only within a connected component of keys (keys that share a batch): broker groups, queue
bindings and KV keys are independent of each other. Spark extracts the conditional core, the checks plus
the writes to checked keys (a fraction of the log), finds its components, and walks each group of
components in order in an executor, keeping one version per checked key; the failed batches (rare:
leader-side races) are then removed from the log in Spark. See docs/pipeline.md for its cost.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from nameserver.logformat.segments import PUT, merge, overlaps, parse_segment_name, uncovered
from pipeline.session import join, list_names

BatchId = tuple[int, int]  # (offset, batch_index)
WALK_GROUPS_PER_CORE = 4  # groups of components walked per core (a big component takes one group)


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


def load_log(spark: SparkSession, uri: str | list[str], upto: int | None = None) -> Log:
    """The segments under `uri` (or under several directories: together they must not overlap), only
    those starting at or before `upto`, as one DataFrame."""
    uris = [uri] if isinstance(uri, str) else uri
    by_range: dict[tuple[int, int], str] = {}
    for u in uris:
        for n in list_names(spark, u):
            r = parse_segment_name(n)
            if r is not None:
                by_range[r] = join(u, n)
    ranges = sorted(by_range)
    if not ranges:
        raise PipelineError(f"{uris[0]} holds no log segments (log-<first>-<last>.parquet)")
    for i, (a, b) in enumerate(ranges):
        if overlaps(ranges[:i], a, b):
            raise PipelineError(f"segments in {uris[0]} overlap at {a}..{b}: remove the duplicate")
    chosen = [(a, b) for a, b in ranges if upto is None or a <= upto]
    if not chosen:
        raise PipelineError(f"{uris[0]} has no segment at or before offset {upto}")
    df = spark.read.parquet(*[by_range[r] for r in chosen])
    if upto is not None:
        df = df.where(F.col("offset") <= upto)
    return Log(uris[0], df, merge(chosen))


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


def _key_components(spark: SparkSession, events: DataFrame) -> DataFrame:
    """(key, component) for every key that shares a batch with another key of the conditional core.

    Two keys belong together when one batch checks or writes both: whether that batch applies depends on
    the one and decides the other. Each batch links its keys to its smallest key; the distinct links (a
    few per key however long the log: the same broker group re-registers the same keys) come to the driver,
    where a union-find joins them. Components are numbered largest first. Keys absent here stand alone.
    """
    anchors = events.groupBy("offset", "batch_index").agg(F.min("key").alias("anchor"))
    links = (events.join(anchors, ["offset", "batch_index"]).where(F.col("key") != F.col("anchor"))
             .select("anchor", "key").distinct().toArrow())
    parent: dict[str, str] = {}

    def root(k: str) -> str:
        r = parent.setdefault(k, k)
        while r != parent[r]:
            r = parent[r]
        while parent[k] != r:  # path compression
            parent[k], k = r, parent[k]
        return r

    for a, k in zip(links.column("anchor").to_pylist(), links.column("key").to_pylist(), strict=True):
        ra, rk = root(a), root(k)
        if ra != rk:
            parent[rk] = ra
    members: dict[str, list[str]] = {}
    for k in parent:
        members.setdefault(root(k), []).append(k)
    keys: list[str] = []
    ids: list[int] = []
    for i, group in enumerate(sorted(members.values(), key=len, reverse=True)):
        keys += group
        ids += [i] * len(group)
    return spark.createDataFrame(pd.DataFrame({"key": pd.Series(keys, dtype="object"),
                                               "component": pd.Series(ids, dtype="int64")}),
                                 "key string, component long")


def _walk_group(pdf: pd.DataFrame) -> pd.DataFrame:
    """Walk whole components in log order, as KVState checks them; the failed batches (in an executor)."""
    pdf = pdf.sort_values(["offset", "batch_index", "kind", "record_index"], kind="mergesort")
    versions: dict[str, int] = {}
    failed: set[BatchId] = set()
    for offset, b, kind, key, wver, expect in zip(pdf["offset"].tolist(), pdf["batch_index"].tolist(),
                                                  pdf["kind"].tolist(), pdf["key"].tolist(),
                                                  pdf["wver"].tolist(), pdf["expect"].tolist(), strict=True):
        if kind == 0:
            if versions.get(key, 0) != int(expect):
                failed.add((offset, b))
        elif (offset, b) not in failed:
            versions[key] = int(wver)
    rows = sorted(failed)
    return pd.DataFrame({"offset": pd.Series([r[0] for r in rows], dtype="int64"),
                         "batch_index": pd.Series([r[1] for r in rows], dtype="int32")})


def failed_batches(spark: SparkSession, events: DataFrame, seeds: DataFrame | None = None) -> set[BatchId]:
    """Replay the checks in log order against the versions the applied writes leave (KVState's rule).

    The walk is sequential only within a connected component of keys (see _key_components): components
    are independent, so they are spread over WALK_GROUPS_PER_CORE groups per core, and each group is
    walked in an executor (applyInPandas). Grouping components together is always correct (a coarser
    partition); splitting one is not, so a key's component decides its group. `seeds` are the versions
    checked keys start from (writes at the base offset, in the events' columns); they join their key's
    component.
    """
    groups = max(1, spark.sparkContext.defaultParallelism * WALK_GROUPS_PER_CORE)
    component = F.coalesce(F.col("component"), F.xxhash64("key"))
    walked_events = events if seeds is None else events.unionByName(seeds)
    tagged = (walked_events.join(_key_components(spark, events), "key", "left")
              .withColumn("group", F.pmod(component, F.lit(groups))))
    walked = (tagged.select("group", "offset", "batch_index", "kind", "record_index", "key", "wver", "expect")
              .groupBy("group").applyInPandas(_walk_group, "offset long, batch_index int"))
    return {(int(r["offset"]), int(r["batch_index"])) for r in walked.collect()}


def _seeds(base: DataFrame, base_offset: int, events: DataFrame) -> DataFrame:
    """The base state's versions of the keys the events check or write, as writes at the base offset."""
    return (base.join(events.select("key").distinct(), "key", "left_semi")
            .select("key", F.lit(base_offset).cast("long").alias("offset"), F.lit(-1).alias("batch_index"),
                    F.lit(-1).alias("record_index"), F.col("version").alias("wver"), F.lit(1).alias("kind"),
                    F.lit(None).cast("long").alias("expect")))


def applied_records(spark: SparkSession, df: DataFrame, base: DataFrame | None = None, base_offset: int = 0
                    ) -> Applied:
    """The records of `df` whose batches applied. With `base` (a state table at `base_offset`, earlier
    than every offset in `df`), checks start from the base's versions instead of an empty state."""
    events = _precondition_events(df)
    if events is None:
        return Applied(df)
    events = events.persist()
    try:
        seeds = _seeds(base, base_offset, events) if base is not None else None
        failed = failed_batches(spark, events, seeds)
    finally:
        events.unpersist()
    applied = df if not failed else df.join(_batch_df(spark, failed), ["offset", "batch_index"], "left_anti")
    return Applied(applied, failed)
