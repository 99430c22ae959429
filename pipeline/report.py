"""`report`: what the log says about the fleet. Parquet tables, and one HTML page with charts.

Tables (under OUT/tables/):
    sessions            one row per broker address registration: registration to expiry or unregister
    brokers             per address: sessions, expiries, unregisters, uptime, flapping (>= N ends in a window)
    topic_events        topic created or deleted in a cluster (its first queue data there appeared or went)
    topic_churn         per cluster: creations, deletions, topics at the end
    records_per_minute  records and bytes per record type per minute (leader clock)
    bytes_per_type      records, deletes and bytes per record type
    hot_keys            the most written keys
An expiry and an unregister write the same records; the batch's request id tells them apart when the
leader tags it (`expire/...`, `unregister/...`). Untagged, an end sooner than the broker's heartbeat
timeout after its last registration write cannot be an expiry (unregistered); otherwise it is unknown.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.window import WindowSpec

from nameserver.logformat.records import BROKER, EXPIRE_TAG, LIVE, TOPIC, UNREGISTER_TAG
from nameserver.logformat.segments import DELETE, PUT
from pipeline.logdf import Log, applied_records, load_log
from pipeline.session import join

POS = ("offset", "batch_index", "record_index")
DURATION_BUCKETS_S = (0, 10, 30, 60, 120, 300, 600, 1800, 3600, 3 * 3600, 12 * 3600, 86400, 7 * 86400)


@dataclass
class ReportOptions:
    flap_ends: int = 3            # this many session ends ...
    flap_window_s: int = 3600     # ... within this long make an address flapping
    top: int = 20


def _json(field: str, col: str = "value_json") -> Column:
    return F.get_json_object(F.col(col), f"$.{field}")


def _after(prefix: str) -> Column:
    """The key past its record kind's prefix (a broker name, an address)."""
    return F.expr(f"substring(key, {len(prefix) + 1})")


def _by_key() -> WindowSpec:
    return Window.partitionBy("key").orderBy(*POS)


def sessions_table(applied: DataFrame, log_end_ms: int) -> DataFrame:
    w = _by_key()
    ev = (applied.where(F.col("key").startswith(LIVE.prefix))
          .select("key", *POS, "op", "leader_time_ms", "request_id", "value_json",
                  F.lag("op").over(w).alias("prev_op")))
    is_start = (F.col("op") == PUT) & (F.col("prev_op").isNull() | (F.col("prev_op") == DELETE))
    is_end = (F.col("op") == DELETE) & (F.col("prev_op").isNull() | (F.col("prev_op") == PUT))
    ev = (ev.withColumn("is_start", is_start).withColumn("is_end", is_end)
          .withColumn("session_no", F.sum(F.col("is_start").cast("int")).over(
              w.rowsBetween(Window.unboundedPreceding, Window.currentRow))))
    put = F.col("op") == PUT
    s = ev.groupBy("key", "session_no").agg(
        F.min(F.when(F.col("is_start"), F.col("offset"))).alias("start_offset"),
        F.min(F.when(F.col("is_start"), F.col("leader_time_ms"))).alias("start_ms"),
        F.max(F.when(F.col("is_end"), F.col("offset"))).alias("end_offset"),
        F.max(F.when(F.col("is_end"), F.col("leader_time_ms"))).alias("end_ms"),
        F.max(F.when(F.col("is_end"), F.col("request_id"))).alias("end_request_id"),
        F.max(F.when(put, F.col("leader_time_ms"))).alias("last_put_ms"),
        F.count(F.when(put, 1)).alias("registrations"),
        F.max_by("value_json", F.when(put, F.col("offset"))).alias("live_json"))
    timeout = _json("heartbeat_timeout_ms", "live_json").cast("long")
    reason = (F.when(F.col("end_ms").isNull(), "open")
              .when(F.col("end_request_id").startswith(EXPIRE_TAG), "expired")
              .when(F.col("end_request_id").startswith(UNREGISTER_TAG), "unregistered")
              .when(F.col("end_ms") - F.col("last_put_ms") < timeout, "unregistered")
              .otherwise("unknown"))
    return s.select(
        _after(LIVE.prefix).alias("addr"),
        _json("broker_name", "live_json").alias("broker_name"), _json("cluster", "live_json").alias("cluster"),
        "session_no", "start_offset", "start_ms", "end_offset", "end_ms", reason.alias("end_reason"),
        (F.coalesce(F.col("end_ms"), F.lit(log_end_ms)) - F.col("start_ms")).alias("duration_ms"),
        "registrations", timeout.alias("heartbeat_timeout_ms"))


def brokers_table(sessions: DataFrame, opts: ReportOptions) -> DataFrame:
    ends = sessions.where(F.col("end_ms").isNotNull())
    w = Window.partitionBy("addr").orderBy("end_ms").rangeBetween(-opts.flap_window_s * 1000, 0)
    worst = (ends.withColumn("n", F.count(F.lit(1)).over(w)).groupBy("addr")
             .agg(F.max("n").alias("max_ends_in_window")))
    per = sessions.groupBy("addr").agg(
        F.max("broker_name").alias("broker_name"), F.max("cluster").alias("cluster"),
        F.count(F.lit(1)).alias("sessions"),
        F.count(F.when(F.col("end_reason") == "expired", 1)).alias("expiries"),
        F.count(F.when(F.col("end_reason") == "unregistered", 1)).alias("unregisters"),
        F.count(F.when(F.col("end_reason") == "unknown", 1)).alias("unknown_ends"),
        F.sum("duration_ms").alias("up_ms"),
        F.percentile_approx("duration_ms", 0.5).alias("median_session_ms"),
        F.min("duration_ms").alias("shortest_session_ms"))
    return (per.join(worst, "addr", "left").fillna(0, ["max_ends_in_window"])
            .withColumn("flapping", F.col("max_ends_in_window") >= opts.flap_ends))


def topic_tables(applied: DataFrame) -> tuple[DataFrame, DataFrame]:
    clusters = (applied.where(F.col("key").startswith(BROKER.prefix) & (F.col("op") == PUT))
                .select(_after(BROKER.prefix).alias("broker"), _json("cluster").alias("cluster"), "offset")
                .groupBy("broker").agg(F.max_by("cluster", "offset").alias("cluster")))
    parts = F.split(F.col("key"), "/")
    w = _by_key()
    t = (applied.where(F.col("key").startswith(TOPIC.prefix))
         .select("key", *POS, "op", "leader_time_ms", parts[1].alias("topic"), parts[2].alias("broker"),
                 F.lag("op").over(w).alias("prev_op")))
    delta = (F.when((F.col("op") == PUT) & (F.col("prev_op").isNull() | (F.col("prev_op") == DELETE)), 1)
             .when((F.col("op") == DELETE) & (F.col("prev_op").isNull() | (F.col("prev_op") == PUT)), -1)
             .otherwise(0))
    t = t.withColumn("delta", delta).where(F.col("delta") != 0)
    t = t.join(F.broadcast(clusters), "broker", "left").fillna("?", ["cluster"])
    wt = (Window.partitionBy("cluster", "topic").orderBy(*POS)
          .rowsBetween(Window.unboundedPreceding, Window.currentRow))
    t = t.withColumn("queue_datas", F.sum("delta").over(wt))
    event = (F.when((F.col("delta") == 1) & (F.col("queue_datas") == 1), "created")
             .when((F.col("delta") == -1) & (F.col("queue_datas") == 0), "deleted"))
    t = t.withColumn("event", event)
    events = t.where(F.col("event").isNotNull()).select("cluster", "topic", "offset", "leader_time_ms", "event")
    at_end = (t.groupBy("cluster", "topic").agg(F.max_by("queue_datas", F.struct(*POS)).alias("n"))
              .groupBy("cluster").agg(F.count(F.when(F.col("n") > 0, 1)).alias("topics_at_end")))
    churn = (events.groupBy("cluster").agg(F.count(F.when(F.col("event") == "created", 1)).alias("creations"),
                                           F.count(F.when(F.col("event") == "deleted", 1)).alias("deletions"))
             .join(at_end, "cluster", "outer").fillna(0))
    return events, churn


def volume_tables(log_df: DataFrame, top: int) -> dict[str, DataFrame]:
    size = F.length("key") + F.coalesce(F.length("value"), F.lit(0))
    minute = (F.floor(F.col("leader_time_ms") / 60000) * 60000).cast("long")
    per_minute = (log_df.groupBy(minute.alias("minute_ms"), "type_name")
                  .agg(F.count(F.lit(1)).alias("records"), F.sum(size).alias("bytes")))
    per_type = log_df.groupBy("type_name").agg(
        F.count(F.lit(1)).alias("records"), F.count(F.when(F.col("op") == DELETE, 1)).alias("deletes"),
        F.sum(F.length("key")).alias("key_bytes"), F.sum(F.coalesce(F.length("value"), F.lit(0))).alias("value_bytes"),
        F.sum(size).alias("bytes"))
    hot = (log_df.groupBy("key", "type_name")
           .agg(F.count(F.lit(1)).alias("writes"), F.sum(size).alias("bytes"),
                F.min("offset").alias("first_offset"), F.max("offset").alias("last_offset"))
           .orderBy(F.desc("writes"), "key").limit(top))
    return {"records_per_minute": per_minute, "bytes_per_type": per_type, "hot_keys": hot}


def _duration_histogram(sessions: DataFrame) -> list[dict[str, Any]]:
    edges = F.array(*[F.lit(e * 1000) for e in DURATION_BUCKETS_S])
    bucket = F.expr("size(filter(edges, e -> e <= duration_ms))") - 1
    rows = (sessions.where(F.col("end_ms").isNotNull()).withColumn("edges", edges)
            .groupBy(bucket.alias("bucket"), "end_reason").count().collect())
    return [r.asDict() for r in rows]


def run_report(spark: SparkSession, log_uri: str, out: str, opts: ReportOptions) -> dict[str, Any]:
    from pipeline.charts import write_report  # matplotlib only when a report is written

    log: Log = load_log(spark, log_uri)
    applied = applied_records(spark, log.df)
    span = log.df.agg(F.min("leader_time_ms").alias("t0"), F.max("leader_time_ms").alias("t1"),
                      F.countDistinct("offset").alias("entries"), F.count(F.lit(1)).alias("records"),
                      F.countDistinct("term").alias("terms"), F.countDistinct("key").alias("keys")).first()
    assert span is not None
    sessions = sessions_table(applied.df, span["t1"] or 0).persist()
    tables: dict[str, DataFrame] = {"sessions": sessions, "brokers": brokers_table(sessions, opts)}
    tables["topic_events"], tables["topic_churn"] = topic_tables(applied.df)
    tables.update(volume_tables(log.df, opts.top))
    for name, df in tables.items():
        df.write.mode("overwrite").parquet(join(out, "tables", name))
    read = {name: spark.read.parquet(join(out, "tables", name)) for name in tables}
    summary = {
        "log": log_uri, "first_offset": log.first, "last_offset": log.last, "entries": span["entries"],
        "records": span["records"], "failed_batches": len(applied.failed), "terms": span["terms"],
        "keys_written": span["keys"], "first_time_ms": span["t0"], "last_time_ms": span["t1"],
        "sessions": read["sessions"].count(),
        "flapping_brokers": read["brokers"].where("flapping").count(),
        "flap_rule": f">= {opts.flap_ends} session ends within {opts.flap_window_s} s",
    }
    data = {
        "per_minute": read["records_per_minute"].orderBy("minute_ms").toPandas(),
        "per_type": read["bytes_per_type"].orderBy(F.desc("bytes")).toPandas(),
        "hot_keys": read["hot_keys"].orderBy(F.desc("writes"), "key").toPandas(),
        "churn": read["topic_churn"].orderBy("cluster").toPandas(),
        "brokers": read["brokers"].orderBy(F.desc("max_ends_in_window"), F.desc("sessions"), "addr")
        .limit(opts.top).toPandas(),
        "durations": _duration_histogram(read["sessions"]),
        "duration_buckets_s": DURATION_BUCKETS_S,  # the histogram's edges (charts.py imports nothing of this module)
    }
    sessions.unpersist()
    html = write_report(spark, out, summary, data)
    return {**summary, "html": html, "tables": sorted(tables)}
