"""The Log gRPC service on an in-process server over a stand-in node, and `nsctl log export`'s failover."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import grpc
import pyarrow.parquet as pq
import pytest

from nameserver import headers
from nameserver.cli import nsctl
from nameserver.logformat.segments import covered_ranges
from nameserver.pb import api_pb2, api_pb2_grpc
from raftlog import kvstate
from raftlog.codec import encode_entry
from raftlog.history import AppliedEntry, EntryHistory
from raftlog.kvstate import KVState
from raftlog.pb import entry_pb2


class StandIn:
    """What LogService uses of a NameServerNode: log (ready, offsets, history) and the locked state."""

    def __init__(self, last: int, keep: int = 1000, skip: tuple[int, ...] = ()) -> None:
        self.lock = threading.RLock()
        self.cfg = SimpleNamespace(max_message_bytes=1 << 20)
        self.state = SimpleNamespace(kv=KVState())
        history = EntryHistory(max_entries=keep)
        self.digests = {0: self.state.kv.digest_hex}  # the digest after each offset, as applied
        for offset in range(1, last + 1):
            if offset in skip:
                self.digests[offset] = self.digests[offset - 1]
                continue  # a pysyncobj no-op: no entry of ours
            entry = entry_pb2.Entry(term=1, leader_time_ms=offset, batches=[entry_pb2.Batch(records=[
                entry_pb2.Record(type=5, key=f"kv/ns/k{offset % 7}", value=b"\n\x01" + bytes([65 + offset % 26]))])])
            self.state.kv.apply_entry(offset, entry)
            history.append(AppliedEntry(offset, 1, encode_entry(entry), ()))
            self.digests[offset] = self.state.kv.digest_hex
        self.log = SimpleNamespace(ready=True, commit_offset=last, history=history, apply_error="",
                                   apply_offset=last,
                                   wait_applied=lambda offset, timeout, alive=None: offset <= last)

    def inspect(self, fn):  # as NameServerNode.inspect: the state under its lock
        with self.lock:
            return fn(self.state)


def _read(addr: str, **kw) -> tuple[dict, list[list[int]]]:
    with grpc.insecure_channel(addr) as ch:
        call = api_pb2_grpc.LogStub(ch).ReadLog(api_pb2.ReadLogRequest(**kw), timeout=5)
        md = dict(call.initial_metadata())
        return md, [[e.offset for e in b.entries] for b in call]


def test_read_log_streams_bounded_batches_from_an_offset(serve_log) -> None:
    addr = serve_log(StandIn(30, skip=(10,)))
    md, batches = _read(addr, from_offset=5, max_batch=8)
    assert md[headers.LOG_TO_OFFSET] == "30"
    assert [len(b) for b in batches] == [8, 8, 8, 1]
    assert [o for b in batches for o in b] == [o for o in range(5, 31) if o != 10]
    _, batches = _read(addr, from_offset=28, to_offset=29)
    assert batches == [[28, 29]]


def test_read_log_errors_name_the_problem(serve_log) -> None:
    addr = serve_log(StandIn(30, keep=10))
    for kw, code, text in [
        ({"from_offset": -1}, grpc.StatusCode.INVALID_ARGUMENT, "from_offset"),
        ({"from_offset": 9, "to_offset": 3}, grpc.StatusCode.INVALID_ARGUMENT, "to_offset"),
        ({"from_offset": 1}, grpc.StatusCode.OUT_OF_RANGE, "oldest kept: 21"),
        ({"from_offset": 25, "to_offset": 40}, grpc.StatusCode.UNAVAILABLE, "below to_offset 40"),
    ]:
        with pytest.raises(grpc.RpcError) as err:
            _read(addr, **kw)
        assert err.value.code() == code and text in err.value.details()


def test_dump_state_is_one_consistent_copy_in_chunks(serve_log) -> None:
    node = StandIn(30)
    addr = serve_log(node)
    with grpc.insecure_channel(addr) as ch:
        chunks = list(api_pb2_grpc.LogStub(ch).DumpState(api_pb2.DumpStateRequest(), timeout=5))
    items = [(i.key, i.value, i.version, i.type) for c in chunks for i in c.items]
    assert items == sorted(node.state.kv.items())
    assert {(c.apply_offset, c.digest) for c in chunks} == {(30, node.state.kv.digest_hex)}


def test_digest_at_gives_the_digest_right_after_any_applied_offset(serve_log) -> None:
    node = StandIn(30, skip=(10, 11))
    addr = serve_log(node)
    with grpc.insecure_channel(addr) as ch:
        stub = api_pb2_grpc.LogStub(ch)
        for offset in range(0, 31):  # pysyncobj's own offsets (10, 11) give the digest before them
            reply = stub.DigestAt(api_pb2.DigestAtRequest(offset=offset), timeout=5)
            assert (reply.offset, reply.digest, reply.apply_offset) == (offset, node.digests[offset], 30)
        assert len(set(node.digests.values())) > 20  # the offsets really have different digests
        for offset, code, text in [(-1, grpc.StatusCode.INVALID_ARGUMENT, "offset"),
                                   (31, grpc.StatusCode.UNAVAILABLE, "below offset 31")]:
            with pytest.raises(grpc.RpcError) as err:
                stub.DigestAt(api_pb2.DigestAtRequest(offset=offset), timeout=1.0)
            assert err.value.code() == code and text in err.value.details()


def test_digest_at_older_than_the_ring_is_out_of_range(serve_log, monkeypatch) -> None:
    monkeypatch.setattr(kvstate, "DIGEST_HISTORY", 5)
    addr = serve_log(StandIn(30))
    with grpc.insecure_channel(addr) as ch:
        stub = api_pb2_grpc.LogStub(ch)
        assert stub.DigestAt(api_pb2.DigestAtRequest(offset=26), timeout=5).first_kept == 26
        with pytest.raises(grpc.RpcError) as err:
            stub.DigestAt(api_pb2.DigestAtRequest(offset=25), timeout=5)
        assert err.value.code() == grpc.StatusCode.OUT_OF_RANGE and "oldest: 26" in err.value.details()


def test_export_moves_on_to_a_node_that_still_has_the_offsets(serve_log, tmp_path) -> None:
    short = serve_log(StandIn(40, keep=5))   # compacted its ring: OUT_OF_RANGE for offset 1
    full = serve_log(StandIn(40))
    out = str(tmp_path / "log")
    assert nsctl.main(["--endpoints", f"{short},{full}", "log", "export", "--out", out,
                       "--segment-rows", "16", "--batch", "7"]) == 0
    assert covered_ranges(out)[0][0] == 1 and covered_ranges(out)[-1][1] == 40 and len(covered_ranges(out)) == 3
    assert sorted(pq.read_table(out, columns=["offset"]).column(0).to_pylist()) == list(range(1, 41))
    assert nsctl.main(["--endpoints", short, "log", "export", "--from", "1", "--to", "40", "--out", out]) == 0
    assert nsctl.main(["--endpoints", short, "log", "export", "--from", "1", "--to", "50", "--out", out]) == 1


