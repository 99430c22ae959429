"""`compact --at OFFSET`: the state as of an offset (RIP-18's compacted topic) and its digest.

State at N = for every key, its latest record among the batches that applied with offset <= N; keys
whose latest record is a DELETE are gone. A key's version is the offset of that latest PUT, as on the
nodes. The result is a Parquet table (key, value, version, type, type_name, value_json) plus
`_compact.json` (offset, digest, keys) beside it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from nameserver.logformat.segments import PUT
from pipeline.logdf import Log, applied_records, load_log
from pipeline.session import join, write_text
from pipeline.sparkdigest import digest_of

META_FILE = "_compact.json"


@dataclass
class Compaction:
    log: str
    at: int
    digest: str
    keys: int
    failed_batches: int
    out: str | None = None


@dataclass
class Base:
    """A state table (compact's columns) known to be the state at `offset`: where an incremental
    compaction starts instead of offset 1."""

    offset: int
    state: DataFrame


def _base_records(base: Base) -> DataFrame:
    # As records: a key's latest PUT at its version; any record of the log after the base sorts later.
    return base.state.select(F.col("version").alias("offset"), F.lit(-1).alias("batch_index"),
                             F.lit(-1).alias("record_index"), F.lit(PUT).alias("op"), "type", "type_name",
                             "key", "value", "value_json")


def state_at(spark: SparkSession, log: Log, at: int, base: Base | None = None) -> tuple[DataFrame, int]:
    """(state DataFrame, number of batches whose preconditions failed) as of offset `at`; from `base`
    on when given (only the log after it is read)."""
    start = base.offset + 1 if base is not None else 1
    log.require_covered(start, at)
    df = log.df.where(F.col("offset") <= at)
    if base is not None:
        df = df.where(F.col("offset") > base.offset)
    applied = applied_records(spark, df, base.state if base else None, base.offset if base else 0)
    records = applied.df.select("offset", "batch_index", "record_index", "op", "type", "type_name", "key",
                                "value", "value_json")
    if base is not None:
        records = records.unionByName(_base_records(base))
    latest = (records.groupBy("key")
              .agg(F.max(F.struct("offset", "batch_index", "record_index", "op", "type", "type_name",
                                  "value", "value_json")).alias("r")))
    state = latest.where(F.col("r.op") == PUT).select(
        "key", F.col("r.value").alias("value"), F.col("r.offset").alias("version"), F.col("r.type").alias("type"),
        F.col("r.type_name").alias("type_name"), F.col("r.value_json").alias("value_json"))
    return state, len(applied.failed)


def run_compact(spark: SparkSession, log_uri: str, at: int | None, out: str | None,
                overwrite: bool = False) -> Compaction:
    log = load_log(spark, log_uri, upto=at)
    at = at if at is not None else log.last
    state, failed = state_at(spark, log, at)
    state = state.persist()
    try:
        digest, keys = digest_of(state)
        result = Compaction(log_uri, at, digest, keys, failed, out)
        if out:
            state.write.mode("overwrite" if overwrite else "errorifexists").parquet(out)
            write_text(spark, join(out, META_FILE), json.dumps(asdict(result), indent=1))
    finally:
        state.unpersist()
    return result
