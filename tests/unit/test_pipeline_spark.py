"""The Spark jobs on real (local[2]) Spark and real Parquet, against the node's own replay (KVState)."""

from __future__ import annotations

import os
import shutil
import zipfile

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from nameserver.logformat.segments import DUMP_FILE, DUMP_META, SegmentWriter, write_dump
from nameserver.pb import state_pb2
from pipeline import cli, logdf
from pipeline.audit import run_audit
from pipeline.compact import run_compact
from pipeline.logdf import PipelineError, load_log
from pipeline.replay import replay
from pipeline.report import ReportOptions, run_report
from pipeline.synth import FleetSpec, generate
from raftlog.codec import encode_entry
from raftlog.pb import entry_pb2

# PySpark 4.1 calls pandas 3 with a deprecated keyword: noise, not a problem of ours.
pytestmark = pytest.mark.filterwarnings("ignore:The copy keyword is deprecated")


@pytest.fixture(scope="module")
def fleet_log(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("fleet") / "log")
    spec = FleetSpec(records=12_000, clusters=2, groups_per_cluster=4, topics_per_group=12, flappy_fraction=0.3,
                     race_rate=0.05, rows_per_segment=4000, seed=11)
    return out, generate(out, spec)


def test_compaction_equals_the_nodes_replay_at_every_offset_tried(spark, fleet_log, monkeypatch) -> None:
    log, synth = fleet_log
    assert synth.failed_batches > 0  # the log has batches whose preconditions fail
    for at in (synth.last_offset // 3, synth.last_offset):
        _, expected = replay(log, upto=at)
        got = run_compact(spark, log, at, None)
        assert (got.digest, got.keys) == (expected.digest, expected.keys), at
    assert got.failed_batches == synth.failed_batches
    # The walk's grouping of components changes nothing: one group for all, or the default's several
    # (each Spark job costs seconds: make test runs these three)
    monkeypatch.setattr(logdf, "WALK_GROUPS_PER_CORE", 1)
    regrouped = run_compact(spark, log, None, None)
    assert (regrouped.digest, regrouped.failed_batches) == (got.digest, got.failed_batches)


# `make test-slow` (25 s): make test's continuous audit (tests/integration/test_pipeline_watch.py) compacts
# cut by cut on a live cluster and checks each cut's digest against the nodes'.
@pytest.mark.slow
def test_compaction_continued_from_an_earlier_state_equals_one_from_the_start(spark, fleet_log) -> None:
    """The continuous audit compacts cut by cut: the state at N plus the log after N is the state at M."""
    from pipeline.compact import Base, state_at
    from pipeline.sparkdigest import digest_of

    log_dir, synth = fleet_log
    log = load_log(spark, log_dir)
    cuts = [synth.last_offset // 4, synth.last_offset // 2, synth.last_offset - 3, synth.last_offset]
    base: Base | None = None
    failed = 0
    for at in cuts:
        state, failed_here = state_at(spark, log, at, base)
        state = state.localCheckpoint()  # as the watcher reads its last cut back
        _, expected = replay(log_dir, upto=at)
        assert digest_of(state) == (expected.digest, expected.keys), at
        failed += failed_here
        base = Base(at, state)
    assert failed == synth.failed_batches  # each raced batch failed in exactly one cut


def test_keys_sharing_a_batch_form_one_component_and_groups_split_the_walk(spark, fleet_log) -> None:
    log, _ = fleet_log
    events = logdf._precondition_events(load_log(spark, log).df)
    assert events is not None
    comps = {r["key"]: r["component"] for r in logdf._key_components(spark, events).collect()}
    # a registration checks its live/ record and its group's broker/ record and writes its topics
    group = next(k.split("/", 1)[1] for k in comps if k.startswith("broker/"))
    members = [k for k in comps if k == f"broker/{group}" or (k.startswith("topic/") and k.endswith(f"/{group}"))]
    assert len(members) > 2 and len({comps[k] for k in members}) == 1
    # the fleet's clusters share no batch: at least one component per cluster
    assert len(set(comps.values())) >= 2


def test_precondition_failures_cascade_exactly_as_kvstate_applies_them(spark, tmp_path) -> None:
    """X fails (stale check); Y checks the version X would have written, so fails too; Z passes."""
    def batch(key: str, version: int, value: bytes, pre: bool = True) -> entry_pb2.Batch:
        b = entry_pb2.Batch(records=[entry_pb2.Record(type=state_pb2.KV_CONFIG, key=key, value=value)])
        if pre:
            b.preconditions.add(key=key, version=version)
        return b

    entries = [
        [batch("kv/a/k", 0, b"1")],                      # 1: k@1
        [batch("kv/a/k", 0, b"2")],                      # 2: X fails (k is at 1)
        [batch("kv/a/k", 2, b"3"), batch("kv/a/j", 0, b"j")],  # 3: Y expects X's write: fails; j applies
        [batch("kv/a/k", 1, b"4")],                      # 4: Z: k is still at 1: applies, k@4
        [batch("kv/a/k", 4, b"5"), batch("kv/a/k", 4, b"6")],  # 5: first applies (k@5), second fails
        [batch("kv/a/m", 0, b"m", pre=False),
         entry_pb2.Batch(preconditions=[entry_pb2.Precondition(key="kv/a/m", version=6)],
                         records=[entry_pb2.Record(type=state_pb2.KV_CONFIG, op=entry_pb2.OP_DELETE, key="kv/a/j")])],
    ]
    log = str(tmp_path / "log")
    w = SegmentWriter(log, 1)
    for offset, batches in enumerate(entries, start=1):
        entry = entry_pb2.Entry(term=1, leader_time_ms=offset, batches=batches)
        w.add(offset, 1, encode_entry(entry), entry)
    w.flush(len(entries))
    kv, expected = replay(log)
    assert kv.get("kv/a/k") == b"5" and kv.get("kv/a/j") is None and kv.get("kv/a/m") == b"m"
    got = run_compact(spark, log, None, str(tmp_path / "state"))
    assert (got.digest, got.keys, got.failed_batches) == (expected.digest, expected.keys, 3)
    table = {r["key"]: (r["value"], r["version"]) for r in pq.read_table(str(tmp_path / "state")).to_pylist()}
    assert table == {"kv/a/k": (b"5", 5), "kv/a/m": (b"m", 6)}
    assert os.path.exists(tmp_path / "state" / "_compact.json")


def test_compaction_refuses_a_log_with_a_hole(spark, fleet_log, tmp_path) -> None:
    log, _ = fleet_log
    holed = str(tmp_path / "holed")
    shutil.copytree(log, holed)
    os.unlink(os.path.join(holed, sorted(os.listdir(holed))[1]))
    with pytest.raises(PipelineError, match="does not cover offsets"):
        run_compact(spark, holed, None, None)
    assert load_log(spark, holed, upto=5).last >= 5  # the first segment alone is fine


def _divergent_copy(src: str, dst: str) -> tuple[str, str, str]:
    """Copy a dump and change one value, drop one key and add one: returns those three keys."""
    shutil.copytree(src, dst)
    rows = pq.read_table(os.path.join(dst, DUMP_FILE)).to_pylist()
    changed, dropped = rows[3]["key"], rows[7]["key"]
    rows[3]["value"] = rows[3]["value"] + b"\x00"
    del rows[7]
    rows.append({**rows[0], "key": "kv/injected/key"})
    pq.write_table(pa.Table.from_pylist(rows, schema=pq.read_schema(os.path.join(src, DUMP_FILE))),
                   os.path.join(dst, DUMP_FILE))
    return changed, dropped, "kv/injected/key"


# `make test-slow` (23 s): make test audits a faithful and a corrupted dump end to end on a live cluster's
# exported log (tests/integration/test_pipeline.py) and continuously (test_pipeline_watch.py).
@pytest.mark.slow
def test_audit_passes_a_faithful_dump_and_names_the_keys_of_a_divergent_one(spark, fleet_log, tmp_path) -> None:
    log, synth = fleet_log
    at = synth.last_offset // 2
    kv, rep = replay(log, upto=at)
    good = str(tmp_path / "good")
    write_dump(good, sorted(kv.items()), rep.offset, rep.digest, "replay")
    changed, dropped, added = _divergent_copy(good, str(tmp_path / "bad"))
    result = run_audit(spark, log, None, [], [good, str(tmp_path / "bad")],
                       [f"snap={at}:{rep.digest}", f"other={at + 1}:{'0' * 32}"], str(tmp_path / "out"))
    good_v, bad_v, snap_v, other_v = result.verdicts
    assert good_v.ok and good_v.match and good_v.differing_keys == 0 and snap_v.match
    assert other_v.match is False and other_v.log_digest is not None
    assert not result.ok and not bad_v.ok
    assert bad_v.match  # the stamped digest is the node's; the rows are not what it stamped
    assert bad_v.rows_digest != bad_v.reported_digest
    assert {(k["key"], k["kind"]) for k in bad_v.keys} == {
        (changed, "value_differs"), (dropped, "missing_on_node"), (added, "extra_on_node")}
    assert os.path.isdir(tmp_path / "out" / "diff-bad") and os.path.exists(tmp_path / "out" / "audit.json")
    with open(os.path.join(good, DUMP_META)) as f:
        assert str(rep.offset) in f.read()


def test_report_finds_flapping_brokers_and_writes_tables_and_charts(spark, fleet_log, tmp_path) -> None:
    log, _ = fleet_log
    out = str(tmp_path / "report")
    summary = run_report(spark, log, out, ReportOptions(flap_ends=3, flap_window_s=3600, top=10))
    assert summary["sessions"] > 0 and summary["flapping_brokers"] >= 1
    brokers = pq.read_table(os.path.join(out, "tables", "brokers")).to_pylist()
    sessions = pq.read_table(os.path.join(out, "tables", "sessions")).to_pylist()
    reasons = {s["end_reason"] for s in sessions}
    assert {"expired", "open"} <= reasons
    assert all(s["duration_ms"] >= 0 for s in sessions if s["start_ms"] is not None)
    flapping = [b for b in brokers if b["flapping"]]
    assert all(b["max_ends_in_window"] >= 3 and b["expiries"] >= 3 for b in flapping)
    churn = pq.read_table(os.path.join(out, "tables", "topic_churn")).to_pylist()
    assert {c["cluster"] for c in churn} == {"cluster-0", "cluster-1"}
    assert sum(c["creations"] for c in churn) > 0 and sum(c["deletions"] for c in churn) > 0
    per_type = {r["type_name"]: r for r in pq.read_table(os.path.join(out, "tables", "bytes_per_type")).to_pylist()}
    assert per_type["TOPIC_QUEUE"]["records"] > 0 and per_type["BROKER_LIVE"]["deletes"] > 0
    with open(os.path.join(out, "report.html")) as f:
        page = f.read()
    assert page.count("<img") == 6 and "data:image/png;base64," in page
    for name in ("records_per_minute", "bytes_per_type", "session_durations", "flapping", "topic_churn",
                 "hot_keys"):
        with open(os.path.join(out, "charts", f"{name}.png"), "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_cli_help_synth_and_zip(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--help"])
    assert exit_.value.code == 0
    assert cli.main(["synth", "--out", str(tmp_path / "s"), "--records", "500", "--clusters", "1"]) == 0
    assert "wrote" in capsys.readouterr().out
    assert cli.main(["zip", "--out", str(tmp_path / "p.zip")]) == 0
    names = set(zipfile.ZipFile(tmp_path / "p.zip").namelist())
    assert {"pipeline/compact.py", "raftlog/digest.py", "raftlog/__init__.py", "nameserver/pb/state_pb2.py"} <= names
