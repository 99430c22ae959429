"""`bench`: time compact, audit and report on local Spark against the node's own replay, on one log.

    python -m pipeline bench --records 10000000 --work /tmp/bench

Steps: generate a synthetic fleet log (skipped when WORK/log already holds one), replay it in one
process with KVState (the node's apply code) and dump that state, start Spark, compact at the last
offset (its digest must equal the replay's), audit the replay's dump against the log, and report.
Prints a Markdown table and writes WORK/bench.json.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from nameserver.logformat.segments import covered_ranges


def _timed(results: dict[str, Any], name: str, fn: Callable[[], Any]) -> Any:
    t0 = time.perf_counter()
    value = fn()
    results[name] = round(time.perf_counter() - t0, 1)
    print(f"{name}: {results[name]} s", flush=True)
    return value


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} cores ({cpu}), {mem:.0f} GiB RAM, Python {platform.python_version()}"


JOBS = ("walk", "compact", "audit", "report")


def _walk(spark: Any, log_dir: str) -> dict[str, Any]:
    """The precondition walk alone: extracting the conditional core, then finding its components and
    walking them in executors (failed_batches), each timed; the components counted afterwards."""
    from pipeline.logdf import _key_components, _precondition_events, failed_batches, load_log

    t0 = time.perf_counter()
    events = _precondition_events(load_log(spark, log_dir).df)
    assert events is not None
    events = events.persist()
    try:
        core = events.count()
        t1 = time.perf_counter()
        failed = len(failed_batches(spark, events))
        t2 = time.perf_counter()
        components = _key_components(spark, events).select("component").distinct().count()
        return {"core_events": core, "core_s": round(t1 - t0, 1), "walk_s": round(t2 - t1, 1),
                "components": components, "failed": failed}
    finally:
        events.unpersist()


def run_bench(records: int, work: str, master: str, conf: dict[str, str], executor_python: str | None = None,
              jobs: tuple[str, ...] = ("compact", "audit", "report"), result: str | None = None) -> dict[str, Any]:
    from pipeline.synth import FleetSpec, generate

    log_dir, dump_dir = os.path.join(work, "log"), os.path.join(work, "replay-dump")
    times: dict[str, Any] = {}
    info: dict[str, Any] = {"records_wanted": records, "master": master, "machine": machine(),
                            "date": time.strftime("%Y-%m-%d"), "seconds": times}
    if not covered_ranges(log_dir):
        spec = FleetSpec(records=records, clusters=8, groups_per_cluster=25, topics_per_group=200)
        synth = _timed(times, "generate (synthetic log, Python)", lambda: generate(log_dir, spec))
        info["synth"] = asdict(synth)
    info["replay"] = _replayed(work, log_dir, dump_dir, times)

    from pipeline.audit import run_audit
    from pipeline.compact import run_compact
    from pipeline.report import ReportOptions, run_report
    from pipeline.session import spark_session

    spark = _timed(times, "spark session start", lambda: spark_session(master, "rip18-bench", conf,
                                                                                executor_python))
    if "walk" in jobs:
        info["walk"] = _walk(spark, log_dir)
        times["conditional core extracted"] = info["walk"]["core_s"]
        times["precondition walk (components + walk in executors)"] = info["walk"]["walk_s"]
    if "compact" in jobs:
        comp = _timed(times, "compact", lambda: run_compact(spark, log_dir, None, os.path.join(work, "compact"),
                                                            overwrite=True))
        info["compact"] = asdict(comp)
        info["digest_equal_to_replay"] = comp.digest == info["replay"]["digest"]
    if "audit" in jobs:
        audit = _timed(times, "audit (compact + key diff vs the replay's dump)",
                       lambda: run_audit(spark, log_dir, None, [], [dump_dir], [], os.path.join(work, "audit")))
        info["audit_ok"] = audit.ok
    if "report" in jobs:
        rep_out = _timed(times, "report", lambda: run_report(spark, log_dir, os.path.join(work, "report"),
                                                             ReportOptions()))
        info["report"] = {k: v for k, v in rep_out.items() if k != "tables"}
    spark.stop()
    with open(result or os.path.join(work, "bench.json"), "w") as f:
        json.dump(info, f, indent=1, default=str)
    print(markdown(info))
    return info


def _replayed(work: str, log_dir: str, dump_dir: str, times: dict[str, Any]) -> dict[str, Any]:
    """The node's own replay of the log (timed), and its state dumped; reused when WORK/replay.json is there."""
    from nameserver.logformat.segments import write_dump
    from pipeline.replay import replay

    cached = os.path.join(work, "replay.json")
    if os.path.exists(cached) and os.path.exists(os.path.join(dump_dir, "state.parquet")):
        with open(cached) as f:
            rep: dict[str, Any] = json.load(f)
        times["replay (reused from replay.json)"] = 0.0
        return rep
    kv, replayed = _timed(times, "replay (KVState, one process, total)", lambda: replay(log_dir))
    times["replay: read Parquet + rebuild entries"] = round(replayed.read_s, 1)
    times["replay: decode + apply (the node's apply)"] = round(replayed.apply_s, 1)
    if not os.path.exists(os.path.join(dump_dir, "state.parquet")):
        items = ((k, v, ver, t) for k, v, ver, t in kv.items())
        write_dump(dump_dir, items, kv.offset, kv.digest_hex, "replay")
    rep = asdict(replayed)
    with open(cached, "w") as f:
        json.dump(rep, f)
    return rep


def markdown(info: dict[str, Any]) -> str:
    rep = info["replay"]
    lines = [f"{info['date']}, {info['machine']}, Spark master {info['master']}: "
             f"{rep['records']:,} records in {rep['entries']:,} entries, {rep['keys']:,} live keys at the end.",
             "", "| step | seconds |", "|---|---|"]
    lines += [f"| {name} | {secs} |" for name, secs in info["seconds"].items()]
    lines += ["", f"Compacted digest equals the replay's: {info.get('digest_equal_to_replay')}; "
                  f"audit OK: {info.get('audit_ok')}."]
    return "\n".join(lines)
