"""The committed protobuf code must match proto/ (regenerate with `make proto`)."""

import filecmp
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GENERATED = ["raftlog/pb/entry_pb2.py", "raftlog/pb/entry_pb2.pyi", "nameserver/pb/state_pb2.py",
             "nameserver/pb/state_pb2.pyi", "nameserver/pb/api_pb2.py", "nameserver/pb/api_pb2.pyi",
             "nameserver/pb/api_pb2_grpc.py", "nameserver/pb/shards_pb2.py", "nameserver/pb/shards_pb2.pyi",
             "nameserver/pb/shards_pb2_grpc.py",
             # the benchmark harness's trimmed etcd API (proto/etcd, bench/etcd.py)
             "bench/pb/etcd/mvccpb/kv_pb2.py", "bench/pb/etcd/mvccpb/kv_pb2.pyi",
             "bench/pb/etcd/etcdserverpb/rpc_pb2.py", "bench/pb/etcd/etcdserverpb/rpc_pb2.pyi",
             "bench/pb/etcd/etcdserverpb/rpc_pb2_grpc.py"]


def test_generated_code_matches_proto(tmp_path) -> None:
    subprocess.run(["bash", os.path.join(ROOT, "scripts", "gen_proto.sh"), str(tmp_path)], check=True,
                   env=os.environ | {"PYTHON": sys.executable})
    stale = [f for f in GENERATED if not filecmp.cmp(os.path.join(ROOT, f), tmp_path / f, shallow=False)]
    assert not stale, f"generated code is stale, run `make proto`: {stale}"
