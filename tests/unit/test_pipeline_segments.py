"""The exported log's format (no Spark): rows, JSON renderings, segments never written twice, dumps, replay."""

from __future__ import annotations

import json
import os

import pyarrow.parquet as pq
import pytest

from nameserver.logformat import records, segments
from nameserver.pb import state_pb2
from pipeline.replay import replay
from pipeline.synth import FleetSpec, generate
from raftlog.codec import encode_entry
from raftlog.digest import digest_hex, digest_of
from raftlog.pb import entry_pb2


def _entry(term: int = 2, time_ms: int = 1_700_000_000_000) -> tuple[entry_pb2.Entry, bytes]:
    live = state_pb2.BrokerLive(cluster="C", broker_name="b", broker_addr="10.0.0.1:10911",
                                heartbeat_timeout_ms=1_234_567_890_123,
                                data_version=state_pb2.DataVersion(counter=3, timestamp=99))
    entry = entry_pb2.Entry(term=term, leader_time_ms=time_ms, batches=[
        entry_pb2.Batch(request_id="r1", preconditions=[entry_pb2.Precondition(key="live/10.0.0.1:10911")],
                        records=[
                            entry_pb2.Record(type=state_pb2.BROKER_LIVE, key="live/10.0.0.1:10911",
                                             value=live.SerializeToString(deterministic=True)),
                            entry_pb2.Record(type=state_pb2.KV_CONFIG, op=entry_pb2.OP_DELETE, key="kv/ns/k")]),
        entry_pb2.Batch(request_id="barrier"),  # no records: no rows
        entry_pb2.Batch(request_id="r2", records=[entry_pb2.Record(type=99, key="x/y", value=b"\x00")]),
    ])
    return entry, encode_entry(entry)


def test_value_json_renders_every_field_with_numbers_and_names() -> None:
    live = state_pb2.BrokerLive(cluster="C", heartbeat_timeout_ms=1 << 40)
    doc = json.loads(records.value_json(state_pb2.BROKER_LIVE, live.SerializeToString()))
    assert doc["cluster"] == "C" and doc["heartbeat_timeout_ms"] == 1 << 40  # a number, not a string
    assert doc["broker_name"] == "" and doc["data_version"] == {"counter": 0, "timestamp": 0, "state_version": 0}
    assert records.value_json(state_pb2.KV_CONFIG, b"") is None
    assert records.value_json(12345, b"\x01") is None
    assert records.value_json(state_pb2.KV_CONFIG, b"\xff\xff") is None  # undecodable
    assert records.type_name(state_pb2.TOPIC_QUEUE) == "TOPIC_QUEUE" and records.type_name(77) == "TYPE_77"


def test_every_record_type_has_its_value_message_and_key_prefix() -> None:
    # A record type added to state.proto without its message here would reach Spark as undecodable bytes.
    from nameserver.state import keys

    kinds = {v.number for v in state_pb2.RecordType.DESCRIPTOR.values} - {state_pb2.RECORD_TYPE_UNSPECIFIED}
    assert set(records.VALUE_MESSAGES) == kinds
    assert set(keys.PREFIX_TYPES.values()) == kinds
    ctl = state_pb2.ControllerBrokerSet(cluster_name="c", master_id=2, master_epoch=3, sync_state_set=[2, 3])
    doc = json.loads(records.value_json(state_pb2.CONTROLLER_BROKER_SET, ctl.SerializeToString()))
    assert (doc["master_id"], doc["master_epoch"], doc["sync_state_set"]) == (2, 3, [2, 3])


def test_rows_one_per_record_with_batch_fields_and_entry_id() -> None:
    entry, data = _entry()
    rows = segments.LogRows()
    assert rows.add_entry(7, 2, data) == 3
    t = rows.table().to_pylist()
    assert [(r["offset"], r["batch_index"], r["record_index"], r["op"], r["key"]) for r in t] == [
        (7, 0, 0, "PUT", "live/10.0.0.1:10911"), (7, 0, 1, "DELETE", "kv/ns/k"), (7, 2, 0, "PUT", "x/y")]
    assert t[0]["preconditions"] == [{"key": "live/10.0.0.1:10911", "version": 0}]
    assert t[1]["preconditions"] is None and t[2]["preconditions"] is None
    assert {r["entry_id"] for r in t} == {segments.entry_id(data)}
    assert t[0]["leader_time_ms"] == 1_700_000_000_000 and t[0]["term"] == 2
    assert json.loads(t[0]["value_json"])["heartbeat_timeout_ms"] == 1_234_567_890_123
    assert t[1]["value"] == b"" and t[1]["value_json"] is None and t[2]["type_name"] == "TYPE_99"
    with pytest.raises(ValueError):
        rows.add_entry(7, 2, data)  # offsets only go up


@pytest.mark.parametrize("ranges, start, end, gaps", [
    ([], 1, 10, [(1, 10)]),
    ([(1, 5)], 1, 10, [(6, 10)]),
    ([(1, 5), (6, 9)], 1, 9, []),
    ([(3, 4), (8, 9)], 1, 10, [(1, 2), (5, 7), (10, 10)]),
    ([(1, 5)], 3, None, [(6, None)]),
    ([(4, 6)], 1, None, [(1, 3), (7, None)]),
    ([(1, 100)], 20, 30, []),
])
def test_uncovered(ranges, start, end, gaps) -> None:
    assert segments.uncovered(ranges, start, end) == gaps


def test_segments_are_atomic_and_never_written_twice(tmp_path) -> None:
    _, data = _entry()
    d = str(tmp_path)
    w = segments.SegmentWriter(d, 1, rows_per_segment=4)
    w.add(3, 2, data)
    w.add(5, 2, data)  # 6 rows >= 4: the segment is cut at this entry
    assert segments.covered_ranges(d) == [(1, 5)]
    w.add(9, 2, data)
    with pytest.raises(ValueError):
        w.flush(8)  # would claim 6..8 while holding entry 9
    assert w.flush(12)
    assert segments.covered_ranges(d) == [(1, 5), (6, 12)]
    assert not [n for n in os.listdir(d) if n.startswith(".")]
    rows = segments.LogRows()
    with pytest.raises(segments.SegmentOverlap):
        segments.write_segment(d, 12, 20, rows)
    with pytest.raises(segments.SegmentOverlap):
        segments.write_segment(d, 1, 5, rows)
    meta = segments.read_segment_meta(os.path.join(d, segments.segment_name(1, 5)))
    assert meta["rip18.log.first"] == "1" and meta["rip18.log.last"] == "5" and meta["rip18.log.entries"] == "2"
    assert pq.read_table(os.path.join(d, segments.segment_name(1, 5))).num_rows == 6


def test_a_dump_state_stream_becomes_a_dump(tmp_path) -> None:
    # What nsctl state dump and the pipeline's audit write from Log.DumpState: every chunk's items, the
    # offset and digest of the copy from the first chunk.
    from nameserver.pb import api_pb2

    chunks = [api_pb2.StateChunk(items=[api_pb2.StateItem(key=f"kv/n/{i}", value=b"", version=i, type=5)
                                        for i in range(first, first + 3)], apply_offset=40, digest="cd" * 16)
              for first in (1, 4)]
    info = segments.write_dump_stream(str(tmp_path), chunks, "n2")
    assert info == segments.DumpInfo("n2", 40, "cd" * 16, 6)
    rows = pq.read_table(tmp_path / segments.DUMP_FILE).to_pylist()
    assert [r["version"] for r in rows] == [1, 2, 3, 4, 5, 6]


def test_state_dump_round_trip(tmp_path) -> None:
    items = [("kv/a/b", state_pb2.KvValue(value="v").SerializeToString(), 4, state_pb2.KV_CONFIG),
             ("broker/x", b"", 9, state_pb2.BROKER)]
    info = segments.write_dump(str(tmp_path), items, 12, "ab" * 16, "n1")
    assert info == segments.DumpInfo("n1", 12, "ab" * 16, 2)
    with open(tmp_path / segments.DUMP_META) as f:
        assert segments.read_dump_info(f.read()) == info
    rows = pq.read_table(tmp_path / segments.DUMP_FILE).to_pylist()
    assert rows[0]["key"] == "kv/a/b" and json.loads(rows[0]["value_json"]) == {"value": "v"}
    with pytest.raises(FileExistsError):
        segments.write_dump(str(tmp_path), items, 12, "ab" * 16, "n1")


def test_synthetic_log_is_deterministic_and_replays_to_its_own_state(tmp_path) -> None:
    spec = FleetSpec(records=8000, clusters=2, groups_per_cluster=3, topics_per_group=10, race_rate=0.05,
                     rows_per_segment=3000)
    a = generate(str(tmp_path / "a"), spec)
    b = generate(str(tmp_path / "b"), spec)
    assert (b.records, b.last_offset) == (a.records, a.last_offset)
    assert a.records >= 8000 and a.segments >= 2 and a.failed_batches > 0
    ids = [pq.read_table(tmp_path / x / segments.segment_name(*segments.covered_ranges(str(tmp_path / x))[0]),
                         columns=["entry_id"]).column(0).to_pylist() for x in ("a", "b")]
    assert ids[0] == ids[1]
    ranges = segments.covered_ranges(str(tmp_path / "a"))
    assert ranges[0][0] == 1 and segments.merge(ranges) == [(1, a.last_offset)]
    kv, rep = replay(str(tmp_path / "a"))
    assert rep.records == a.records and rep.offset == a.last_offset
    assert rep.digest == digest_hex(digest_of((k, v) for k, v, _, _ in kv.items()))
    tags = pq.read_table(str(tmp_path / "a"), columns=["request_id"]).column(0).to_pylist()
    assert any(t.startswith(records.EXPIRE_TAG) for t in tags)
